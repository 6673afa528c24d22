package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/bothy/bothy/errcode"
)

func TestValidateID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		id   string
		ok   bool
	}{
		{"letter", "a", true},
		{"digit first", "0abc", true},
		{"dashes inside", "my-sandbox-1", true},
		{"63 characters", strings.Repeat("a", 63), true},
		{"empty", "", false},
		{"64 characters", strings.Repeat("a", 64), false},
		{"dash first", "-abc", false},
		{"uppercase", "Abc", false},
		{"underscore", "a_b", false},
		{"dot", "a.b", false},
		{"dot dot", "..", false},
		{"slash", "a/b", false},
		{"space", "a b", false},
		{"nul", "a\x00", false},
		{"non-ascii", "café", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateID(tt.id)
			if tt.ok != (err == nil) {
				t.Fatalf("ValidateID(%q) = %v; want ok=%v", tt.id, err, tt.ok)
			}
			if err != nil {
				var e *errcode.Error
				if !errors.As(err, &e) || e.Code != errcode.InvalidRequest || e.Field != "id" {
					t.Fatalf("ValidateID(%q) = %#v; want invalid-request on field id", tt.id, err)
				}
			}
		})
	}
}

// TestValidateIDMessages pins the messages of ValidateID, which the API returns to clients as
// they are.
func TestValidateIDMessages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id, msg string
	}{
		{"", "The sandbox id is empty; give 1 to 63 characters of a-z, 0-9 and '-'."},
		{strings.Repeat("a", 70), "The sandbox id has 70 characters; give at most 63."},
		{"-abc", "The sandbox id starts with '-'; start it with a letter or a digit."},
		{"a-B", `The sandbox id contains "B"; use only a-z, 0-9 and '-'.`},
		{"a/-", `The sandbox id contains "/"; use only a-z, 0-9 and '-'.`},
		{"caf\u00e9", "The sandbox id contains \"\u00c3\"; use only a-z, 0-9 and '-'."},
	}
	for _, tt := range tests {
		var e *errcode.Error
		if err := ValidateID(tt.id); !errors.As(err, &e) || e.Msg != tt.msg {
			t.Errorf("ValidateID(%q) = %v; want the message %q", tt.id, err, tt.msg)
		}
	}
}

func TestDeclare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		decl string
		kind EntryKind
		ok   bool
	}{
		{"plain file", "sandbox.log", EntryFile, true},
		{"plain dir", "upper", EntryDir, true},
		{"all allowed characters", "A-z_0.9", EntryFile, true},
		{"hidden", ".hidden", EntryFile, true},
		{"empty", "", EntryFile, false},
		{"dot", ".", EntryDir, false},
		{"dot dot", "..", EntryDir, false},
		{"slash", "a/b", EntryFile, false},
		{"space", "a b", EntryFile, false},
		{"non-ascii", "é", EntryFile, false},
		{"too long", strings.Repeat("a", 129), EntryFile, false},
		{"store lock", "sandbox.lock", EntryFile, false},
		{"store config, other case", "Config.JSON", EntryFile, false},
		{"store launch", "launch.json", EntryFile, false},
		{"store runtime", "RUNTIME.json", EntryFile, false},
		{"store outcome", "outcome.json", EntryDir, false},
		{"temp form", ".config.json.0123456789abcdef.tmp", EntryFile, false},
		{"temp form, other case", ".X.0123456789ABCDEF.TMP", EntryFile, false},
		{"temp-like", ".x.tmp", EntryFile, false},
		{"nfs", ".nfs0000001", EntryFile, false},
		{"nfs, other case", ".NFSabc", EntryFile, false},
		{"collides with declared", "exec.lock", EntryFile, false},
		{"collides with declared, other case", "EXEC.LOCK", EntryDir, false},
		{"bad kind", "kindless", EntryKind(0), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := &Store{declared: map[string]declaration{}}
			if err := s.Declare("exec.lock", EntryFile); err != nil {
				t.Fatal(err)
			}
			err := s.Declare(tt.decl, tt.kind)
			if tt.ok != (err == nil) {
				t.Fatalf("Declare(%q, %v) = %v; want ok=%v", tt.decl, tt.kind, err, tt.ok)
			}
			if err != nil && errcode.Of(err) != errcode.InvalidRequest {
				t.Fatalf("Declare(%q) = %v; want invalid-request", tt.decl, err)
			}
			if kind, found := s.declaredKind(tt.decl); tt.ok && (!found || kind != tt.kind) {
				t.Fatalf("after Declare(%q): declaredKind = %v, %v", tt.decl, kind, found)
			}
		})
	}
}

// FuzzValidateID checks that every accepted id is safe as one path component and matches the
// documented alphabet, whatever the input.
func FuzzValidateID(f *testing.F) {
	for _, seed := range []string{"a", "sandbox-1", "-a", "A", "a/b", "..", strings.Repeat("z", 64)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := ValidateID(id)
		if err != nil {
			if errcode.Of(err) != errcode.InvalidRequest {
				t.Fatalf("ValidateID(%q) = %v; want invalid-request", id, err)
			}
			return
		}
		if len(id) < 1 || len(id) > 63 || id[0] == '-' {
			t.Fatalf("ValidateID accepted %q", id)
		}
		for _, c := range id {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				t.Fatalf("ValidateID accepted %q with %q", id, c)
			}
		}
	})
}

// FuzzDeclare checks that an accepted declared name is a plain name that can never be taken
// for a store name, a temp name or an NFS name, and that declaring it twice fails.
func FuzzDeclare(f *testing.F) {
	for _, seed := range []string{"exec.lock", "upper", "sandbox.lock", ".nfs1", ".a.0123456789abcdef.tmp", "a/b", ".", "Config.json"} {
		f.Add(seed, true)
	}
	f.Fuzz(func(t *testing.T, name string, dir bool) {
		kind := EntryFile
		if dir {
			kind = EntryDir
		}
		s := &Store{declared: map[string]declaration{}}
		if err := s.Declare(name, kind); err != nil {
			if errcode.Of(err) != errcode.InvalidRequest {
				t.Fatalf("Declare(%q) = %v; want invalid-request", name, err)
			}
			return
		}
		lower := strings.ToLower(name)
		if name == "." || name == ".." || name == "" || strings.ContainsAny(name, "/\x00") {
			t.Fatalf("Declare accepted %q", name)
		}
		for _, own := range storeNames {
			if lower == own {
				t.Fatalf("Declare accepted the store's %q", name)
			}
		}
		if strings.HasPrefix(lower, ".nfs") || (strings.HasPrefix(lower, ".") && strings.HasSuffix(lower, ".tmp")) {
			t.Fatalf("Declare accepted %q", name)
		}
		if err := s.Declare(strings.ToUpper(name), EntryFile); err == nil {
			t.Fatalf("Declare accepted %q twice (ignoring case)", name)
		}
	})
}
