package template

import (
	"errors"

	"github.com/bothy/bothy/naming"
)

// Source is a generation's lineage: the sandbox it was captured from and, when that sandbox
// was itself a clone, the generation the sandbox was cloned from (its parent). The parent is
// a record, not a dependency: a clone's capture holds its parent's payload merged in, so a
// generation stands alone and leases nothing, and its parent may be retired before it.
type Source struct {
	Sandbox string `json:"sandbox"`
	// Template and Generation name the parent; both empty when the sandbox was made from an
	// image.
	Template   string `json:"template,omitempty"`
	Generation string `json:"generation,omitempty"`
}

// Validate checks a source read from a record or a registry's annotation, which another
// node (or a registry) wrote: every name must be one this service could have made.
func (s *Source) Validate() error {
	if !naming.ValidID(s.Sandbox) {
		return errors.New("template: a source names no valid sandbox")
	}
	if s.Template == "" && s.Generation == "" {
		return nil
	}
	if !naming.ValidID(s.Template) {
		return errors.New("template: a source names no valid parent template")
	}
	if _, ok := parseGeneration(s.Generation); !ok {
		return errors.New("template: a source names no valid parent generation")
	}
	return nil
}
