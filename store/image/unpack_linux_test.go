//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// unpackInto unpacks a tar into a fresh layer directory inside a fresh parent, and returns
// the layer's directory and the parent, which hostile entries aim at.
func unpackFresh(t *testing.T, data []byte) (UnpackStats, string, string, error) {
	t.Helper()
	parent := t.TempDir()
	root := filepath.Join(parent, "layer")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	stats, err := unpackTar(bytes.NewReader(data), d, Limits{MaxLayerBytes: 1 << 30, MaxEntries: 1000})
	return stats, root, parent, err
}

func TestUnpackRefusesHostileEntries(t *testing.T) {
	needRoot(t)
	t.Parallel()
	for _, tc := range []struct {
		name string
		ents func(parent string) []ent
	}{
		{"dotdot escape", func(string) []ent { return []ent{file("../escaped", "x")} }},
		{"nested dotdot", func(string) []ent { return []ent{dir("a/"), file("a/../../escaped", "x")} }},
		{"absolute path", func(parent string) []ent { return []ent{file(filepath.Join(parent, "escaped"), "x")} }},
		{"file through symlink out (absolute)", func(parent string) []ent {
			return []ent{symlink("out", parent), file("out/escaped", "x")}
		}},
		{"file through symlink out (relative)", func(string) []ent {
			return []ent{symlink("out", ".."), file("out/escaped", "x")}
		}},
		{"file through a symlink deeper in the path", func(parent string) []ent {
			// The link is not the entry's parent but a directory above it, which only
			// RESOLVE_NO_SYMLINKS catches (O_NOFOLLOW guards the last element alone).
			return []ent{dir("real/sub/"), symlink("in", "real"), file("in/sub/x", "x")}
		}},
		{"directory through symlink out", func(string) []ent {
			return []ent{symlink("out", ".."), dir("out/escaped/")}
		}},
		{"hard link out (relative)", func(string) []ent { return []ent{hardlink("h", "../outside")} }},
		{"hard link out (absolute)", func(parent string) []ent {
			return []ent{hardlink("h", filepath.Join(parent, "outside"))}
		}},
		{"hard link through symlink", func(string) []ent {
			return []ent{symlink("out", ".."), hardlink("h", "out/outside")}
		}},
		{"hard link to a later entry", func(string) []ent { return []ent{hardlink("h", "later"), file("later", "x")} }},
		{"whiteout of dotdot", func(string) []ent { return []ent{file(".wh...", "")} }},
		{"whiteout of dotdot in a directory", func(string) []ent { return []ent{dir("d/"), file("d/.wh...", "")} }},
		{"whiteout of dot", func(string) []ent { return []ent{file("d/.wh..", "")} }},
		{"reserved whiteout", func(string) []ent { return []ent{file(".wh..wh.plnk", "")} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			parent := t.TempDir()
			if err := os.WriteFile(filepath.Join(parent, "outside"), []byte("host secret"), 0o600); err != nil {
				t.Fatal(err)
			}
			// The layer sits in parent, so that ".." from its root is parent.
			root := filepath.Join(parent, "layer")
			if err := os.Mkdir(root, 0o755); err != nil {
				t.Fatal(err)
			}
			d, err := os.Open(root)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			data := tarOfRaw(t, tc.ents(parent))
			_, err = unpackTar(bytes.NewReader(data), d, Limits{MaxLayerBytes: 1 << 20, MaxEntries: 100})
			if !errors.Is(err, ErrUnsafeEntry) {
				t.Fatalf("unpack = %v; want ErrUnsafeEntry", err)
			}
			entries, _ := os.ReadDir(parent)
			for _, e := range entries {
				if e.Name() != "outside" && e.Name() != "layer" {
					t.Errorf("unpacking wrote %s outside the layer", e.Name())
				}
			}
			if b, _ := os.ReadFile(filepath.Join(parent, "outside")); string(b) != "host secret" {
				t.Errorf("the file outside the layer changed to %q", b)
			}
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(parent, "outside"), &st); err != nil || st.Nlink != 1 {
				t.Errorf("the file outside the layer has %d links (%v); want 1", st.Nlink, err)
			}
		})
	}
}

// tarOfRaw writes entries with their names exactly as given (tar.Writer would refuse none
// of these, but it is the reader's input that matters).
func tarOfRaw(t *testing.T, ents []ent) []byte { return tarOf(t, ents...) }

func TestUnpackNeutralisesDevicesAndSetuid(t *testing.T) {
	needRoot(t)
	t.Parallel()
	suid := file("bin/su", "#!/bin/sh\n")
	suid.hdr.Mode = 0o4755
	sgid := file("bin/wall", "x")
	sgid.hdr.Mode = 0o2755
	sgidDir := dir("shared/")
	sgidDir.hdr.Mode = 0o2775
	data := tarOf(t,
		dir("bin/"), suid, sgid, sgidDir,
		ent{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8, Devminor: 0, Mode: 0o666}},
		ent{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "mem", Devmajor: 1, Devminor: 1, Mode: 0o666}},
		ent{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "gone", Devmajor: 0, Devminor: 0}},
	)
	stats, root, _, err := unpackFresh(t, data)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"sda", "mem"} {
		if _, err := os.Lstat(filepath.Join(root, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("device node %s: lstat = %v; want it skipped", n, err)
		}
	}
	if stats.SkippedDevices != 2 || stats.StrippedSetuid != 2 || stats.Whiteouts != 1 {
		t.Errorf("stats = %+v; want 2 skipped devices, 2 stripped setuid/setgid, 1 whiteout", stats)
	}
	for n, want := range map[string]os.FileMode{"bin/su": 0o755, "bin/wall": 0o755} {
		fi, err := os.Lstat(filepath.Join(root, n))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v (%v); want %v, setuid and setgid dropped", n, fi.Mode(), err, want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(root, "shared")); err != nil || fi.Mode()&os.ModeSetgid == 0 {
		t.Errorf("shared: mode %v (%v); a directory keeps setgid", fi.Mode(), err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, "gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("gone: %v, mode %o rdev %d; want the 0/0 character device (a whiteout) kept", err, st.Mode, st.Rdev)
	}
}

func TestUnpackWhiteoutsAndLinks(t *testing.T) {
	needRoot(t)
	t.Parallel()
	owned := file("etc/owned", "mine")
	owned.hdr.Uid, owned.hdr.Gid = 1234, 5678
	data := tarOf(t,
		dir("etc/"), owned,
		file("etc/.wh.passwd", ""),
		dir("var/"), file("var/.wh..wh..opq", ""),
		symlink("etc/link", "/etc/owned"),
		hardlink("etc/hard", "etc/owned"),
		file(".wh.later", ""), dir("later/"),
		file("implicit/parent/f", "deep"),
	)
	stats, root, _, err := unpackFresh(t, data)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, "etc/passwd"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("etc/passwd: %v mode %o; want a whiteout (character device 0/0)", err, st.Mode)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/.wh.passwd")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the .wh. entry itself was written: %v", err)
	}
	for _, d := range []string{"var", "later"} {
		buf := make([]byte, 8)
		n, err := unix.Lgetxattr(filepath.Join(root, d), opaqueXattr, buf)
		if err != nil || string(buf[:n]) != "y" {
			t.Errorf("%s: %s = %q, %v; want y", d, opaqueXattr, buf[:n], err)
		}
	}
	if target, err := os.Readlink(filepath.Join(root, "etc/link")); err != nil || target != "/etc/owned" {
		t.Errorf("etc/link -> %q, %v; want the target kept as written", target, err)
	}
	if err := unix.Lstat(filepath.Join(root, "etc/hard"), &st); err != nil || st.Nlink != 2 || st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("etc/hard: %v, %d links, owner %d:%d; want the owned file's second link, 1234:5678", err, st.Nlink, st.Uid, st.Gid)
	}
	if b, err := os.ReadFile(filepath.Join(root, "implicit/parent/f")); err != nil || string(b) != "deep" {
		t.Errorf("implicit/parent/f = %q, %v", b, err)
	}
	if stats.Whiteouts != 2 || stats.Opaques != 1 {
		t.Errorf("stats = %+v; want 2 whiteouts (one replaced by a directory) and 1 opaque", stats)
	}
}

func TestUnpackBounds(t *testing.T) {
	needRoot(t)
	t.Parallel()
	root := t.TempDir()
	d, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	data := tarOf(t, file("a", "1"), file("b", "2"), file("c", "3"))
	if _, err := unpackTar(bytes.NewReader(data), d, Limits{MaxLayerBytes: 1 << 20, MaxEntries: 2}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("unpack of 3 entries with MaxEntries 2 = %v; want ErrTooLarge", err)
	}
}
