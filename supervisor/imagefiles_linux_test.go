//go:build linux

package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestImageFilesLayer checks what the image files layer adds to an image that has an
// /etc/passwd without the sandbox's user and no home: the user's entry after the image's
// own, and a home the user owns even when it is also the image's WorkingDir (which a Debian
// image built by scripts/image-debian showed made root's before this was fixed).
func TestImageFilesLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to the sandbox's user needs root; CI runs as root")
	}
	t.Parallel()
	layer := t.TempDir()
	if err := os.MkdirAll(filepath.Join(layer, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/app:/bin/sh"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(layer, "home"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), ImageFilesName)
	if err := writeImageFiles(dir, []string{layer}, ImageConfig{WorkingDir: "/home/user"}, "box"); err != nil {
		t.Fatal(err)
	}
	passwd, err := os.ReadFile(filepath.Join(dir, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/app:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"; string(passwd) != want {
		t.Errorf("passwd = %q, want %q", passwd, want)
	}
	if host, _ := os.ReadFile(filepath.Join(dir, "etc/hostname")); string(host) != "box\n" {
		t.Errorf("hostname = %q", host)
	}
	group, _ := os.ReadFile(filepath.Join(dir, "etc/group"))
	if !strings.Contains(string(group), "user:x:1000:") {
		t.Errorf("group = %q", group)
	}
	fi, err := os.Stat(filepath.Join(dir, "home/user"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != sandboxUID || st.Gid != sandboxGID {
		t.Errorf("home/user is owned by %d:%d, want the sandbox's user", st.Uid, st.Gid)
	}
	// An image that has the user keeps its passwd as it is.
	if err := os.WriteFile(filepath.Join(layer, "etc/passwd"), []byte("node:x:1000:1000::/home/node:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeImageFiles(dir, []string{layer}, ImageConfig{}, "box"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "etc/passwd")); !os.IsNotExist(err) {
		t.Errorf("a passwd was added over an image that has the sandbox's uid: %v", err)
	}
}
