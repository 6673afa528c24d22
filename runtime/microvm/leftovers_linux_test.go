//go:build linux

package microvm

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/bothy/bothy/checkpoint"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/shim"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// TestOverlayDirOfQEMUArgs: the orphan QEMU search reads the state directory back from the
// command line that shim.QEMUArgs writes (a comma in the path doubled), and only below the
// state root; a change of the drive's option that it no longer reads fails here.
func TestOverlayDirOfQEMUArgs(t *testing.T) {
	const root = "/srv/bothyd,root"
	dir := root + "/sandboxes/a,b"
	args := shim.QEMUArgs(&shim.Config{Accel: "tcg", Kernel: "k", Initramfs: "i", Overlay: dir + "/" + shim.EntryOverlay}, false)
	argv := make([][]byte, len(args))
	for i, a := range args {
		argv[i] = []byte(a)
	}
	if got, ok := overlayDir(argv, root); !ok || got != dir {
		t.Fatalf("overlayDir of QEMU's arguments: %q, %v; want %q", got, ok, dir)
	}
	if _, ok := overlayDir(argv, "/srv/other"); ok {
		t.Fatal("a QEMU of another state root is taken for this one's")
	}
	probe := shim.QEMUArgs(&shim.Config{Accel: "tcg", Kernel: "k", Initramfs: "i"}, true)
	pargv := make([][]byte, len(probe))
	for i, a := range probe {
		pargv[i] = []byte(a)
	}
	if _, ok := overlayDir(pargv, root); ok {
		t.Fatal("the probe guest (no disk) is taken for a sandbox's QEMU")
	}
}

// TestStaleBaseDisks: a base disk is unused, and removed by a repair, only when no sandbox's
// overlay and no template generation's frozen disk (nor a capture's in its staging directory)
// backs onto it, it is not the current host's, and it is older than staleBuildAge; the
// removal looks again, and it leaves the disk to a start that holds the assets lock. A
// namespace generation's payload file of the disk's name (its sandbox's writing) is no disk.
// It boots nothing: the disks are qemu-img's.
func TestStaleBaseDisks(t *testing.T) {
	r := newRuntime(t)
	img, err := qemuImg()
	if err != nil {
		t.Skip(err)
	}
	root := t.TempDir()
	hostBase := filepath.Join(root, "images", ".host")
	sandboxes := filepath.Join(root, store.SandboxesDir)
	templates := filepath.Join(root, template.TemplatesDir)
	hourAgo := time.Now().Add(-time.Hour)
	base := func(name string, old bool) string {
		t.Helper()
		p := filepath.Join(hostBase, name)
		if err := os.MkdirAll(hostBase, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		if old {
			if err := os.Chtimes(p, hourAgo, hourAgo); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	overlay := func(path, backing, format string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(img, "create", "-q", "-f", "qcow2", "-F", format, "-b", backing, path, "2M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create: %v: %s", err, out)
		}
	}
	bySandbox := base(imageBasePrefix+"00000000000000a1.ext4", true)
	byGeneration := base(imageBasePrefix+"00000000000000a2.ext4", true)
	byStaging := base(hostBasePrefix+"00000000000000a3.ext4", true)
	unused := base(imageBasePrefix+"00000000000000a4.ext4", true)
	unusedHost := base(hostBasePrefix+"00000000000000a5.ext4", true)
	young := base(imageBasePrefix+"00000000000000a6.ext4", false)
	current := base(hostBaseName(), true)
	// A sandbox whose disk a checkpoint moved into a layer (it has none of its own until its
	// next start): the layer's disk still backs onto its base.
	byCheckpoint := base(imageBasePrefix+"00000000000000a7.ext4", true)
	overlay(filepath.Join(checkpoint.LayersDir(filepath.Join(sandboxes, "vmcp")), "0123456789abcdef", shim.EntryOverlay), byCheckpoint, "raw")
	overlay(filepath.Join(sandboxes, "vm1", shim.EntryOverlay), bySandbox, "raw")
	// A fork of a running microVM whose source is gone: its fork-state's frozen disk backs
	// onto the source's base, its own overlay onto that frozen disk.
	byFork := base(imageBasePrefix+"00000000000000a8.ext4", true)
	forkDisk := filepath.Join(sandboxes, "fork", runtime.ForkStateName, shim.StateDisk)
	overlay(forkDisk, byFork, "raw")
	overlay(filepath.Join(sandboxes, "fork", shim.EntryOverlay), forkDisk, "qcow2")
	gen1 := filepath.Join(templates, "t", "g000001", template.PayloadDir, shim.StateDisk)
	overlay(gen1, byGeneration, "raw")
	// A clone's overlay, and a generation captured from it, back onto the generation's disk.
	overlay(filepath.Join(sandboxes, "clone", shim.EntryOverlay), gen1, "qcow2")
	overlay(filepath.Join(templates, "t", "g000002", template.PayloadDir, shim.StateDisk), gen1, "qcow2")
	overlay(filepath.Join(templates, "t", ".g000003.0123456789abcdef.tmp", template.PayloadDir, shim.StateDisk), byStaging, "raw")
	nsPayload := filepath.Join(templates, "ns", "g000001", template.PayloadDir)
	if err := os.MkdirAll(nsPayload, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nsPayload, shim.StateDisk), []byte("a sandbox's own file"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(unused, filepath.Join(sandboxes, "vm1", "disk-link")); err != nil {
		t.Fatal(err)
	}

	stale := func(remove bool) []string {
		t.Helper()
		got, err := r.StaleShared(hostBase, sandboxes, remove)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range got {
			if f.Note {
				t.Errorf("%s is a note: %s", f.Name, f.Why)
			}
			names = append(names, f.Name)
		}
		slices.Sort(names)
		return names
	}
	want := []string{filepath.Base(unusedHost), filepath.Base(unused)}
	slices.Sort(want)
	if got := stale(false); !slices.Equal(got, want) {
		t.Fatalf("unused base disks: %v, want %v", got, want)
	}
	exists := func(paths ...string) {
		t.Helper()
		for _, p := range paths {
			if _, err := os.Lstat(p); err != nil {
				t.Errorf("%s: %v", filepath.Base(p), err)
			}
		}
	}

	// A start holds the assets lock while it looks at its base disk and makes its overlay:
	// the repair removes nothing meanwhile.
	l, err := lockAssets(hostBase, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := stale(true); len(got) != 0 {
		t.Errorf("the repair removed %v while a start held the assets lock", got)
	}
	l.Close()
	exists(unused, unusedHost)

	// The start made its overlay over one of them: the repair looks again and keeps it.
	overlay(filepath.Join(sandboxes, "vm2", shim.EntryOverlay), unusedHost, "raw")
	if got, want := stale(true), []string{filepath.Base(unused)}; !slices.Equal(got, want) {
		t.Errorf("the repair removed %v, want %v", got, want)
	}
	if _, err := os.Lstat(unused); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the unused base disk after the repair: %v", err)
	}
	exists(bySandbox, byGeneration, byStaging, unusedHost, young, current, byCheckpoint, byFork)
	if got := stale(false); len(got) != 0 {
		t.Errorf("after the repair: %v", got)
	}
}

// TestDiskBackingsUnsure: a disk that is there and does not read (a capture's copy just
// begun) keeps every base disk, as does a directory that does not read.
func TestDiskBackingsUnsure(t *testing.T) {
	root := t.TempDir()
	sandboxes := filepath.Join(root, store.SandboxesDir)
	if err := os.MkdirAll(filepath.Join(sandboxes, "vm"), 0o700); err != nil {
		t.Fatal(err)
	}
	if got := diskBackings(sandboxes); got.unsure {
		t.Fatal("a state root without disks is unsure")
	}
	if err := os.WriteFile(filepath.Join(sandboxes, "vm", shim.EntryOverlay), []byte("QF"), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(sandboxes, "vm", shim.EntryOverlay))
	if err != nil {
		t.Fatal(err)
	}
	if got := diskBackings(sandboxes); !got.unsure || !got.has("/any", fi) {
		t.Fatal("a short disk header is taken for no backing file")
	}
}
