package check

import (
	"os"
	"testing"

	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/supervisor"
)

// TestDeclaredNamesMatchTheSupervisor: every name the checker knows the kind of is one that
// supervisor.New declares to the store (a second Declare of it is refused), and the checker
// recognises each declared name and refuses a foreign one. If the supervisor stops declaring
// a name, this fails.
func TestDeclaredNamesMatchTheSupervisor(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the namespace runtime needs root; CI runs as root")
	}
	rt, err := namespace.New(namespace.Config{})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	st, err := store.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sup, err := supervisor.New(supervisor.Options{Store: st, Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	c := newChecker(Options{Root: root, Runtime: rt}, root, st, sup)
	names := c.declared
	if len(names) == 0 {
		t.Fatal("no declared names")
	}
	for name, kind := range names {
		if err := st.Declare(name, kind); err == nil {
			t.Errorf("%q: the checker takes it for declared, but the supervisor does not declare it", name)
		}
	}
	for _, d := range supervisor.DeclaredEntries(rt) {
		if names[d.Name] != d.Kind {
			t.Errorf("the checker takes %q for a %v, not a declared %v", d.Name, names[d.Name], d.Kind)
		}
	}
	for _, name := range []string{"junk", "notes.txt", store.ConfigName, ".nfs0001", "a/b"} {
		if _, ok := names[name]; ok {
			t.Errorf("the checker takes %q for declared, and nobody declared it", name)
		}
	}
}
