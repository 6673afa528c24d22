package main

import (
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// TestTokenGroup: with --token-group the generated token is 0640 in that group and the state
// root 0710 in it, on the first start and again when the token is made anew; without it, the
// token stays the owner's alone.
func TestTokenGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another group needs root")
	}
	g, err := user.LookupGroupId("1") // daemon on Debian: any group not root's own will do
	if err != nil {
		t.Skipf("no group 1 to share the token with: %v", err)
	}
	gid, _ := strconv.Atoi(g.Gid)
	root := filepath.Join(t.TempDir(), "root")
	check := func(path string, mode os.FileMode, gid int) {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != mode || int(st.Gid) != gid || int(st.Uid) != os.Geteuid() {
			t.Fatalf("%s: mode %o uid %d gid %d, want mode %o uid %d gid %d", path, fi.Mode().Perm(), st.Uid, st.Gid, mode, os.Geteuid(), gid)
		}
	}
	token, err := generatedToken(root, g.Name, discard)
	if err != nil {
		t.Fatal(err)
	}
	check(filepath.Join(root, tokenFileName), 0o640, gid)
	check(root, 0o710, gid)
	again, err := generatedToken(root, g.Name, discard)
	if err != nil || again != token {
		t.Fatalf("second start: %q, %v; want the same token", again, err)
	}
	if err := os.Remove(filepath.Join(root, tokenFileName)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := generatedToken(root, g.Name, discard); err != nil {
		t.Fatal(err)
	}
	check(filepath.Join(root, tokenFileName), 0o640, gid)
	check(root, 0o710, gid)

	private := filepath.Join(t.TempDir(), "private")
	if _, err := generatedToken(private, "", discard); err != nil {
		t.Fatal(err)
	}
	check(filepath.Join(private, tokenFileName), 0o600, os.Getegid())
	check(private, 0o700, os.Getegid())

	if _, err := generatedToken(filepath.Join(t.TempDir(), "r"), "no-such-group-bothy-test", discard); err == nil {
		t.Fatal("a group that does not exist was taken")
	}
}

func TestReachableByOthers(t *testing.T) {
	for _, c := range []struct {
		mode os.FileMode
		want bool
	}{
		{os.ModeDir | 0o700, false},
		{os.ModeDir | 0o755, true},
		{os.ModeDir | 0o701, true},
		{0o600, false},
		{0o644, true},
		{os.ModeSocket | 0o755, false},
		{os.ModeSocket | 0o777, true},
		{os.ModeSymlink | 0o777, false},
	} {
		if got := reachableByOthers(c.mode); got != c.want {
			t.Errorf("reachableByOthers(%v) = %v, want %v", c.mode, got, c.want)
		}
	}
}
