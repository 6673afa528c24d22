package store

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/runtime"
)

// The store's own entries in a state directory. Nothing else may use these names, in any
// ASCII case (Declare refuses them), so that a case-insensitive file system cannot make a
// declared file alias a store file.
const (
	LockName    = "sandbox.lock"
	ConfigName  = "config.json"
	LaunchName  = "launch.json"
	RuntimeName = "runtime.json"
	OutcomeName = runtime.OutcomeName
)

// storeNames lists the store's own entries.
var storeNames = []string{LockName, ConfigName, LaunchName, RuntimeName, OutcomeName}

// recordNames are the store's entries written with platform.WriteFileDurable, whose temp
// leftovers (".<name>.<random>.tmp") the store recognises as its own.
var recordNames = []string{ConfigName, LaunchName, RuntimeName, OutcomeName}

// nfsPrefix starts the names NFS gives to files that were removed while still open (the
// "silly rename"): the kernel removes them when the last descriptor closes.
const nfsPrefix = ".nfs"

const maxNameLen = 128

// ValidateID checks a sandbox id against [naming.CheckID]: 1–63 characters of a-z, 0-9 and '-',
// starting with a letter or a digit. Every id is checked before it becomes part of a path. Its
// errors are invalid-request on the field "id", with a message that says how to fix the id.
func ValidateID(id string) error {
	var e *naming.IDError
	if !errors.As(naming.CheckID(id), &e) {
		return nil
	}
	switch e.Fault {
	case naming.Empty:
		return errcode.Invalid("id", "The sandbox id is empty; give 1 to 63 characters of a-z, 0-9 and '-'.")
	case naming.TooLong:
		return errcode.Invalid("id", "The sandbox id has %d characters; give at most %d.", len(id), naming.MaxIDLen)
	case naming.LeadingDash:
		return errcode.Invalid("id", "The sandbox id starts with '-'; start it with a letter or a digit.")
	}
	return errcode.Invalid("id", "The sandbox id contains %q; use only a-z, 0-9 and '-'.", string(rune(e.Char)))
}

// EntryKind says what a declared entry is: a file, removed with unlink, or a directory,
// removed recursively without following links.
type EntryKind int

const (
	EntryFile EntryKind = iota + 1
	EntryDir
)

func (k EntryKind) String() string {
	switch k {
	case EntryFile:
		return "file"
	case EntryDir:
		return "directory"
	}
	return fmt.Sprintf("EntryKind(%d)", int(k))
}

// validateDeclaredName checks a name that another component declares, against the store's
// names and the names declared so far (keys lowercased).
func validateDeclaredName(name string, declared map[string]declaration) error {
	bad := func(format string, args ...any) error {
		return errcode.Invalid("name", "The state directory entry %q cannot be declared: "+format, append([]any{name}, args...)...)
	}
	if name == "" || len(name) > maxNameLen {
		return bad("a name has 1 to %d characters.", maxNameLen)
	}
	if name == "." || name == ".." {
		return bad("it names a directory itself.")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return bad("use only ASCII letters, digits, '.', '_' and '-'.")
		}
	}
	lower := strings.ToLower(name)
	for _, own := range storeNames {
		if lower == own {
			return bad("the store owns %q.", own)
		}
	}
	// Any name shaped like a durable write's temp name is refused, not only the exact form, so
	// that no declared entry can ever be taken for (or taken over by) a temp leftover.
	if strings.HasPrefix(lower, ".") && strings.HasSuffix(lower, ".tmp") {
		return bad("names of the form .<name>.<random>.tmp are the store's temp names.")
	}
	if strings.HasPrefix(lower, nfsPrefix) {
		return bad("names starting with .nfs belong to NFS.")
	}
	if d, ok := declared[lower]; ok {
		return bad("%q is already declared as a %s.", d.name, d.kind)
	}
	return nil
}

type declaration struct {
	name string
	kind EntryKind
}

// OwnNames returns the store's own entries in a state directory: its lock and its records.
func OwnNames() []string { return slices.Clone(storeNames) }

// RecordNames returns the store's records that are written durably through a temp name
// (".<name>.<random>.tmp"), whose temp leftovers are the store's own: every entry of
// [OwnNames] but the lock.
func RecordNames() []string { return slices.Clone(recordNames) }
