package secret

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

const value = "sk-live-0123456789abcdef-the-value"

func open(t *testing.T, root string, uses func(string) []Use) *Manager {
	t.Helper()
	m, err := Open(Options{Root: root, Uses: uses})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// noValueUnder fails if any file under dir holds v.
func noValueUnder(t *testing.T, dir, v string) {
	t.Helper()
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(data, []byte(v)) {
			t.Errorf("%s holds the value in the clear", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestCreateRotateDeleteAcrossReopen(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	m := open(t, root, nil)
	s, err := m.Create("API_KEY", value)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "API_KEY" || s.RotatedAt != nil {
		t.Fatalf("created %+v", s)
	}
	fi, err := os.Stat(filepath.Join(root, Dir, KeyName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key's mode is %v, want 0600", fi.Mode().Perm())
	}
	noValueUnder(t, root, value)
	if _, err := m.Create("API_KEY", "other"); errcode.Of(err) != errcode.SecretExists {
		t.Fatalf("a second create: %v, want secret-exists", err)
	}

	m2 := open(t, root, nil)
	if v, ok := m2.Value("API_KEY"); !ok || v != value {
		t.Fatalf("after reopen Value = %q, %v", v, ok)
	}
	if m.Placeholder("sbx-a", "API_KEY") != m2.Placeholder("sbx-a", "API_KEY") {
		t.Fatal("a placeholder changed across a reopen")
	}
	if m2.Placeholder("sbx-a", "API_KEY") == m2.Placeholder("sbx-b", "API_KEY") {
		t.Fatal("two sandboxes have the same placeholder")
	}
	if p := m2.Placeholder("sbx-a", "API_KEY"); len(p) != PlaceholderLength || !strings.HasPrefix(p, PlaceholderPrefix) {
		t.Fatalf("placeholder %q", p)
	}
	r, err := m2.Rotate("API_KEY", "rotated-value-42")
	if err != nil {
		t.Fatal(err)
	}
	if r.RotatedAt == nil || !r.CreatedAt.Equal(s.CreatedAt) || s.Version != 1 || r.Version != 2 {
		t.Fatalf("rotated %+v (created %+v)", r, s)
	}
	if v, _ := open(t, root, nil).Value("API_KEY"); v != "rotated-value-42" {
		t.Fatalf("after rotate and reopen Value = %q", v)
	}
	if err := m2.Delete("API_KEY"); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Get("API_KEY"); errcode.Of(err) != errcode.SecretNotFound {
		t.Fatalf("get after delete: %v", err)
	}
	if got := open(t, root, nil).List(); len(got) != 0 {
		t.Fatalf("after delete and reopen: %+v", got)
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	m := open(t, t.TempDir(), func(name string) []Use {
		if name == "BOUND" {
			return []Use{{Sandbox: "sbx-1", Hosts: []string{"api.example.com"}}}
		}
		return nil
	})
	cases := []struct {
		name, sname, value string
		code               errcode.Code
	}{
		{"empty name", "", "v", errcode.InvalidRequest},
		{"name with a dash", "A-B", "v", errcode.InvalidRequest},
		{"name from a digit", "1A", "v", errcode.InvalidRequest},
		{"name too long", strings.Repeat("A", MaxNameLength+1), "v", errcode.InvalidRequest},
		{"empty value", "A", "", errcode.InvalidRequest},
		{"value too long", "A", strings.Repeat("x", MaxValueBytes+1), errcode.InvalidRequest},
		{"value with a placeholder", "A", "x" + PlaceholderPrefix, errcode.InvalidRequest},
	}
	for _, c := range cases {
		_, err := m.Create(c.sname, c.value)
		if errcode.Of(err) != c.code {
			t.Errorf("%s: %v, want %s", c.name, err, c.code)
		}
		if err != nil && c.value != "" && c.value != "v" && strings.Contains(err.Error(), c.value) {
			t.Errorf("%s: the error quotes the value", c.name)
		}
	}
	if _, err := m.Create("BOUND", "v"); err != nil {
		t.Fatal(err)
	}
	if err := m.Delete("BOUND"); errcode.Of(err) != errcode.SecretInUse || !strings.Contains(err.Error(), "sbx-1") {
		t.Fatalf("delete of a bound secret: %v", err)
	}
	if s, _ := m.Get("BOUND"); len(s.Uses) != 1 || s.Uses[0].Hosts[0] != "api.example.com" {
		t.Fatalf("uses %+v", s.Uses)
	}
	if _, err := m.Rotate("NONE", "v"); errcode.Of(err) != errcode.SecretNotFound {
		t.Fatalf("rotate of none: %v", err)
	}
}

func TestLimit(t *testing.T) {
	t.Parallel()
	m := open(t, t.TempDir(), nil)
	for i := range MaxSecrets {
		if _, err := m.Create("S"+strings.Repeat("A", i%60)+string(rune('A'+i/60)), "v"); err != nil {
			t.Fatal(i, err)
		}
	}
	if _, err := m.Create("ONE_MORE", "v"); errcode.Of(err) != errcode.LimitReached {
		t.Fatalf("past the bound: %v", err)
	}
}

func TestRecordUnderAnotherNameDoesNotOpen(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	m := open(t, root, nil)
	if _, err := m.Create("A", value); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create("B", "b-value"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, Dir)
	a, _ := os.ReadFile(filepath.Join(dir, "A.json"))
	forged := strings.Replace(string(a), `"name": "A"`, `"name": "B"`, 1)
	forged = strings.Replace(forged, `"name":"A"`, `"name":"B"`, 1)
	if forged == string(a) {
		t.Fatalf("the record's form changed: %s", a)
	}
	if err := os.WriteFile(filepath.Join(dir, "B.json"), []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	if v, ok := open(t, root, nil).Value("B"); ok {
		t.Fatalf("A's sealed value opened as B's: %q", v)
	}
}

func TestCheckRemovesLeftoversAndReportsMissingKey(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	m := open(t, root, nil)
	if _, err := m.Create("A", value); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, Dir)
	tmp := filepath.Join(dir, platform.TempName("B.json"))
	if err := os.WriteFile(tmp, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	probs, err := Check(root, false)
	if err != nil || len(probs) != 1 || probs[0].Kind != Leftover || probs[0].Repaired {
		t.Fatalf("check: %+v, %v", probs, err)
	}
	probs, err = Check(root, true)
	if err != nil || len(probs) != 1 || !probs[0].Repaired {
		t.Fatalf("repair: %+v, %v", probs, err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("the leftover is still there: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, KeyName)); err != nil {
		t.Fatal(err)
	}
	probs, err = Check(root, true)
	if err != nil || len(probs) != 1 || probs[0].Kind != MissingKey || probs[0].Repaired {
		t.Fatalf("without the key: %+v, %v", probs, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "A.json")); err != nil {
		t.Fatalf("repair removed a record: %v", err)
	}
}

// TestUsesAskedWithoutTheLock: the sandboxes are asked for their bindings without the store's
// lock held, since the supervisor that answers may itself wait for the store (a launch asks
// for placeholders). With the lock held, each call here deadlocks.
func TestUsesAskedWithoutTheLock(t *testing.T) {
	t.Parallel()
	var m *Manager
	m = open(t, t.TempDir(), func(name string) []Use {
		m.Placeholder("sbx-1", name) // takes the store's lock, as a launch does
		return nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := m.Create("A", "value-a")
		if err == nil {
			_, err = m.Get("A")
		}
		if err == nil {
			_ = m.List()
			_, err = m.Rotate("A", "value-b")
		}
		if err == nil {
			err = m.Delete("A")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call that asks the sandboxes deadlocked on the store's lock")
	}
}
