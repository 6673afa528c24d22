package template

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
)

// The template store's entries. Every name in the store is one of these, a valid template name,
// generation id or lease record name, or a temp name of the form platform.TempName gives for
// one of them; anything else is foreign and is never removed.
const (
	// TemplatesDir is the template store's directory under the state root.
	TemplatesDir = "templates"
	// LockName is the template store's lock file, directly under TemplatesDir.
	LockName = "templates.lock"
	// TemplateRecordName is a template's record, in the template's directory.
	TemplateRecordName = "template.json"
	// IndexName is a generation's index entry, in the generation's directory.
	IndexName = "index.json"
	// TombstoneName is a generation's tombstone, in the generation's directory.
	TombstoneName = "tombstone.json"
	// PayloadDir is a generation's payload (the captured writable layer).
	PayloadDir = "payload"
	// LeasesDir holds a generation's lease records, one file per lease.
	LeasesDir = "leases"
	// BindingFile is the clone binding in a cloned sandbox's state directory.
	BindingFile = "clone.json"

	leaseExt = ".json"
)

// maxNameLen bounds generation ids, which follow a rule of their own; template names and
// sandbox ids follow the id rule of [naming.CheckID].
const maxNameLen = naming.MaxIDLen

// ValidateName checks a template name: 1–63 characters of a-z, 0-9 and '-', starting with a
// letter or a digit (the rule of sandbox ids). Every name is checked before it becomes part of a
// path.
func ValidateName(name string) error {
	if !naming.ValidID(name) {
		return errcode.Invalid("name", "The template name %q is not valid; give 1 to 63 characters of a-z, 0-9 and '-', starting with a letter or a digit.", clip(name))
	}
	return nil
}

// ValidateGeneration checks a generation id: 'g' and at least six decimal digits, no leading
// zeros beyond the padding, at most 63 characters.
func ValidateGeneration(gen string) error {
	if _, ok := parseGeneration(gen); !ok {
		return errcode.Invalid("generation", "The generation id %q is not valid; generation ids look like g000001.", clip(gen))
	}
	return nil
}

// ValidateLeaseID checks a lease id: "l-" and 16 lowercase hex digits.
func ValidateLeaseID(id string) error {
	if !validLeaseID(id) {
		return errcode.Invalid("lease", "The lease id %q is not valid; lease ids look like l-0123456789abcdef.", clip(id))
	}
	return nil
}

func validSandboxID(id string) error {
	if !naming.ValidID(id) {
		return errcode.Invalid("sandbox", "The sandbox id %q is not valid; give 1 to 63 characters of a-z, 0-9 and '-', starting with a letter or a digit.", clip(id))
	}
	return nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// generationID formats the n-th generation id. Six digits are padding, not a limit.
func generationID(n uint64) string { return fmt.Sprintf("g%06d", n) }

// parseGeneration returns the number of a generation id; ok is false for anything that
// generationID would not have produced.
func parseGeneration(gen string) (uint64, bool) {
	if len(gen) < 7 || len(gen) > maxNameLen || gen[0] != 'g' {
		return 0, false
	}
	digits := gen[1:]
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || n == 0 || generationID(n) != gen {
		return 0, false
	}
	return n, true
}

// NewerGeneration says whether generation id a was captured after b on its node: its number
// is larger. An id that is not valid is older than any valid one, and "" than any.
func NewerGeneration(a, b string) bool {
	na, _ := parseGeneration(a)
	nb, _ := parseGeneration(b)
	return na > nb
}

const leasePrefix = "l-"

func newLeaseID() string { return leasePrefix + naming.RandomHex(8) }

func validLeaseID(id string) bool {
	if len(id) != len(leasePrefix)+16 || !strings.HasPrefix(id, leasePrefix) {
		return false
	}
	for i := len(leasePrefix); i < len(id); i++ {
		c := id[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// leaseIDOf returns the lease id of a lease record's file name.
func leaseIDOf(file string) (string, bool) {
	id, ok := strings.CutSuffix(file, leaseExt)
	if !ok || !validLeaseID(id) {
		return "", false
	}
	return id, true
}
