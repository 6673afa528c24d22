package naming

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

func TestCheckID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		id    string
		fault Fault // 0: valid
		char  byte
	}{
		{"letter", "a", 0, 0},
		{"digit first", "0abc", 0, 0},
		{"dashes inside", "my-sandbox-1", 0, 0},
		{"dash last", "a-", 0, 0},
		{"63 characters", strings.Repeat("a", 63), 0, 0},
		{"empty", "", Empty, 0},
		{"64 characters", strings.Repeat("a", 64), TooLong, 0},
		{"64 bad characters", strings.Repeat("A", 64), TooLong, 0},
		{"dash first", "-abc", LeadingDash, '-'},
		{"uppercase", "Abc", BadChar, 'A'},
		{"underscore", "a_b", BadChar, '_'},
		{"dot dot", "..", BadChar, '.'},
		{"slash", "a/b", BadChar, '/'},
		{"nul", "a\x00", BadChar, 0},
		{"non-ascii at its first byte", "café", BadChar, 0xc3},
		{"first fault wins", "a.B", BadChar, '.'},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := CheckID(tt.id)
			if ValidID(tt.id) != (err == nil) {
				t.Fatalf("ValidID(%q) = %v but CheckID = %v", tt.id, ValidID(tt.id), err)
			}
			if tt.fault == 0 {
				if err != nil {
					t.Fatalf("CheckID(%q) = %v; want nil", tt.id, err)
				}
				return
			}
			var e *IDError
			if !errors.As(err, &e) {
				t.Fatalf("CheckID(%q) = %v; want an *IDError", tt.id, err)
			}
			if e.ID != tt.id || e.Fault != tt.fault || e.Char != tt.char {
				t.Fatalf("CheckID(%q) = %+v; want fault %v, char %q", tt.id, *e, tt.fault, tt.char)
			}
			if e.Error() == "" {
				t.Fatalf("CheckID(%q) has an empty message", tt.id)
			}
		})
	}
}

// idPattern is the id pattern of the API contract (openapi/openapi.yaml).
var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// FuzzCheckID checks that CheckID accepts exactly what the contract's pattern matches, and
// that what it accepts is one harmless path component.
func FuzzCheckID(f *testing.F) {
	for _, seed := range []string{"a", "sandbox-1", "-a", "A", "a/b", ".", "..", "a\x00", strings.Repeat("z", 64)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := CheckID(id)
		if want := idPattern.MatchString(id); want != (err == nil) {
			t.Fatalf("CheckID(%q) = %v; the contract's pattern matches: %v", id, err, want)
		}
		if err == nil && (id == "." || id == ".." || strings.ContainsAny(id, "/\x00")) {
			t.Fatalf("CheckID accepted %q", id)
		}
	})
}

func TestIsCleanAbs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		path string
		ok   bool
	}{
		{"/", true},
		{"/var/lib/bothy", true},
		{"", false},
		{"var/lib", false},
		{"./var", false},
		{"/var/", false},
		{"/var//lib", false},
		{"/var/./lib", false},
		{"/var/../lib", false},
		{"/..", false},
	}
	for _, tt := range tests {
		if got := IsCleanAbs(tt.path); got != tt.ok {
			t.Errorf("IsCleanAbs(%q) = %v; want %v", tt.path, got, tt.ok)
		}
	}
}

func TestRandomAlnum(t *testing.T) {
	t.Parallel()
	alnum := regexp.MustCompile(`^[a-z0-9]*$`)
	seen := map[string]bool{}
	for _, n := range []int{0, 1, 12, 20} {
		for range 4 {
			s := RandomAlnum(n)
			if len(s) != n || !alnum.MatchString(s) {
				t.Fatalf("RandomAlnum(%d) = %q; want %d of a-z 0-9", n, s, n)
			}
			if n >= 12 && seen[s] {
				t.Fatalf("RandomAlnum(%d) returned %q twice", n, s)
			}
			seen[s] = true
		}
	}
}

func TestRandomHex(t *testing.T) {
	t.Parallel()
	hexDigits := regexp.MustCompile(`^[0-9a-f]*$`)
	seen := map[string]bool{}
	for _, n := range []int{0, 1, 8, 12} {
		for range 4 {
			s := RandomHex(n)
			if len(s) != 2*n || !hexDigits.MatchString(s) {
				t.Fatalf("RandomHex(%d) = %q; want %d lowercase hex digits", n, s, 2*n)
			}
			if n >= 8 && seen[s] {
				t.Fatalf("RandomHex(%d) returned %q twice", n, s)
			}
			seen[s] = true
		}
	}
}

// TestCheckLabels: the label rules of the contract, the one check bothyd's create and E2B's
// metadata share.
func TestCheckLabels(t *testing.T) {
	t.Parallel()
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[strings.Repeat("k", 1+i%60)+string(rune('a'+i%26))+strings.Repeat("0", i/26)] = "v"
	}
	tests := []struct {
		name   string
		labels map[string]string
		ok     bool
	}{
		{"none", nil, true},
		{"plain", map[string]string{"team": "grading", "job": "42", "a.b/c_d-e": ""}, true},
		{"63-character key and value", map[string]string{strings.Repeat("k", 63): strings.Repeat("v", 63)}, true},
		{"64-character key", map[string]string{strings.Repeat("k", 64): "v"}, false},
		{"64-character value", map[string]string{"k": strings.Repeat("v", 64)}, false},
		{"a value with spaces", map[string]string{"k": "a b"}, false},
		{"an uppercase key", map[string]string{"Team": "x"}, false},
		{"a key ending in a dash", map[string]string{"team-": "x"}, false},
		{"65 labels", many, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := CheckLabels(tt.labels); (err == nil) != tt.ok {
				t.Fatalf("CheckLabels: %v, want ok=%v", err, tt.ok)
			}
		})
	}
	if len(many) != MaxLabels+1 {
		t.Fatalf("the test's map has %d labels", len(many))
	}
}

// TestCheckEnv: the environment rules of the contract.
func TestCheckEnv(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		env map[string]string
		ok  bool
	}{
		"plain":          {map[string]string{"PATH": "/bin", "_x1": ""}, true},
		"digit first":    {map[string]string{"1X": "v"}, false},
		"a dash":         {map[string]string{"A-B": "v"}, false},
		"a NUL":          {map[string]string{"A": "a\x00b"}, false},
		"a long entry":   {map[string]string{"A": strings.Repeat("v", MaxEnvEntry)}, false},
		"the longest ok": {map[string]string{"A": strings.Repeat("v", MaxEnvEntry-2)}, true},
	} {
		if err := CheckEnv(tt.env); (err == nil) != tt.ok {
			t.Errorf("%s: CheckEnv: %v, want ok=%v", name, err, tt.ok)
		}
	}
}
