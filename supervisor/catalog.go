package supervisor

import "context"

// The template catalog as callers read it: templates, generations and leases, with each
// generation's eligibility judged at the host's time of the call. Without a template store
// they answer not-implemented, as capture and clone do.

// CreateTemplate creates an empty template (template-exists if there is one of that name).
func (s *Supervisor) CreateTemplate(ctx context.Context, name string) (*Template, error) {
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	return s.templates.CreateTemplate(ctx, name)
}

// ListTemplates returns every template.
func (s *Supervisor) ListTemplates() ([]Template, error) {
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	now, err := s.templates.Now()
	if err != nil {
		return nil, err
	}
	return s.templates.Templates(now)
}

// Template returns one template (template-not-found if there is none of that name).
func (s *Supervisor) Template(name string) (*Template, error) {
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	now, err := s.templates.Now()
	if err != nil {
		return nil, err
	}
	return s.templates.Template(name, now)
}

// ListGenerations returns every generation of a template, in any state.
func (s *Supervisor) ListGenerations(name string) ([]Generation, error) {
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	now, err := s.templates.Now()
	if err != nil {
		return nil, err
	}
	return s.templates.Generations(name, now)
}

// Generation returns one generation of a template.
func (s *Supervisor) Generation(name, gen string) (*Generation, error) {
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	now, err := s.templates.Now()
	if err != nil {
		return nil, err
	}
	return s.templates.Generation(name, gen, now)
}

// Leases returns the leases on a generation.
func (s *Supervisor) Leases(name, gen string) ([]Lease, error) {
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	return s.templates.Leases(name, gen)
}
