//go:build linux

package microvm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestFlattenOntoBase copies a disk on a chain (top over a layer over a raw base, each
// written) into a detached tmpfs, as a fork's snapshot is, and flattens it: the copy then
// backs onto the base alone and reads as the top did, whatever is done to the layer between;
// a disk that backs onto the base already is left as it is.
func TestFlattenOntoBase(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a detached tmpfs needs root")
	}
	img, err := qemuImg()
	if err != nil {
		t.Skip(err)
	}
	qio, err := exec.LookPath("qemu-io")
	if err != nil {
		t.Skip("qemu-io (qemu-utils) is not installed")
	}
	dir := t.TempDir()
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	base, layer, top := filepath.Join(dir, "base.raw"), filepath.Join(dir, "layer.qcow2"), filepath.Join(dir, "top.qcow2")
	run(img, "create", "-q", "-f", "raw", base, "16M")
	run(qio, "-f", "raw", "-c", "write -P 0x01 0 1M", base)
	run(img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, layer)
	run(qio, "-c", "write -P 0x22 1M 1M", layer)
	run(img, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", layer, top)
	run(qio, "-c", "write -P 0x33 3M 64k", top)

	scratch, err := openScratch()
	if err != nil {
		t.Fatal(err)
	}
	defer scratch.Close()
	copyTo := func(src string) {
		t.Helper()
		f, err := os.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := copyInto(scratch, "disk.qcow2", f); err != nil {
			t.Fatal(err)
		}
	}
	copyTo(top)
	ok, err := flattenOntoBase(context.Background(), scratch, "disk.qcow2")
	if err != nil || !ok {
		t.Fatalf("flatten: %v %v", ok, err)
	}
	// Out of the tmpfs, to read it with qemu-img.
	flat := filepath.Join(dir, "flat.qcow2")
	f, err := os.Create(flat)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(filepath.Join("/proc/self/fd", strconv.Itoa(int(scratch.Fd())), "disk.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFrom(src); err != nil {
		t.Fatal(err)
	}
	src.Close()
	f.Close()
	if b, err := qcow2Backing(flat); err != nil || b != base {
		t.Fatalf("the flattened disk backs onto %q (%v); want the base %s", b, err, base)
	}
	run(img, "compare", top, flat)
	// The layer may go (a fork holds nothing of its source's chain): the copy reads the same.
	want := filepath.Join(dir, "want.raw")
	run(img, "convert", "-O", "raw", top, want)
	if err := os.Remove(layer); err != nil {
		t.Fatal(err)
	}
	run(img, "compare", "-f", "raw", "-F", "qcow2", want, flat)

	// A disk over the base already is not rebased.
	if err := os.Remove(filepath.Join("/proc/self/fd", strconv.Itoa(int(scratch.Fd())), "disk.qcow2")); err != nil {
		t.Fatal(err)
	}
	run(img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, layer)
	copyTo(layer)
	if ok, err := flattenOntoBase(context.Background(), scratch, "disk.qcow2"); err != nil || ok {
		t.Fatalf("flatten of a disk over the base: %v %v; want nothing done", ok, err)
	}
}
