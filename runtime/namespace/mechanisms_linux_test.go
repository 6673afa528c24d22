//go:build linux

package namespace

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/runtime"
)

// kernelAtLeast says whether the running kernel is major.minor or later.
func kernelAtLeast(tb testing.TB, major, minor int) bool {
	tb.Helper()
	var maj, min int
	rel := kernelRelease()
	if _, err := fmt.Sscanf(rel, "%d.%d", &maj, &min); err != nil {
		tb.Fatalf("kernel release %q: %v", rel, err)
	}
	return maj > major || maj == major && min >= minor
}

// TestProbeMounts: the start-up probes take the best mechanism the kernel has (descriptors
// from 6.13, idmapped tmpfs from 6.3), and with ForceFallbacks the fallbacks, and say so.
func TestProbeMounts(t *testing.T) {
	needRoot(t)
	root := newStateRoot(t)
	for _, tc := range []struct {
		name  string
		force bool
		off   bool
		want  func() runtime.Mechanisms
	}{
		{"best", false, false, func() runtime.Mechanisms {
			m := runtime.Mechanisms{OverlayLayers: "paths", TmpfsOwnership: "chowned", UserNamespaces: true}
			if kernelAtLeast(t, 6, 13) {
				m.OverlayLayers = "descriptors"
			}
			if kernelAtLeast(t, 6, 3) {
				m.TmpfsOwnership = "idmapped"
			}
			return m
		}},
		{"forced", true, false, func() runtime.Mechanisms {
			return runtime.Mechanisms{OverlayLayers: "paths", TmpfsOwnership: "chowned", UserNamespaces: true, Forced: true}
		}},
		{"forced without user namespaces", true, true, func() runtime.Mechanisms {
			return runtime.Mechanisms{OverlayLayers: "paths", Forced: true}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{CgroupParent: testCgroupParent, StateRoot: root, ForceFallbacks: tc.force}
			cfg.IDs.Off = tc.off
			rt, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := rt.KernelRefusal(); err != nil {
				t.Fatalf("this kernel was refused: %v", err)
			}
			want := tc.want()
			want.Kernel = kernelRelease()
			if got := rt.Mechanisms(); got != want {
				t.Fatalf("the probes chose %+v, want %+v (notes %q)", got, want, rt.ProbeNotes())
			}
		})
	}
}

// TestProbeRefusesUnidmappableStateRoot: a state root on a file system that cannot be
// idmapped (overlayfs here, where the kernel does not idmap it) refuses sandboxes with user namespaces at start-up, naming the
// kernel, the feature and what to do, and Start says the same; without user namespaces the
// same state root is taken.
func TestProbeRefusesUnidmappableStateRoot(t *testing.T) {
	needRoot(t)
	root := newStateRoot(t)
	// An overlay of the root's own directories, mounted at root/ovl.
	for _, d := range []string{"l", "u", "w", "ovl"} {
		if err := os.Mkdir(root+"/"+d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("overlay", root+"/ovl", "overlay", 0, "lowerdir="+root+"/l,upperdir="+root+"/u,workdir="+root+"/w"); err != nil {
		t.Skipf("no overlay to try: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root+"/ovl", unix.MNT_DETACH) })
	// Some kernels idmap overlayfs (Debian's 7.3 does): there is nothing to refuse there.
	userns, stop, err := holdUserNamespace("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	idmaps := probeIDMap(userns, root+"/ovl") == nil
	stop()
	if idmaps {
		t.Skip("this kernel idmaps overlayfs: a state root on it is no refusal")
	}
	rt, err := New(Config{CgroupParent: testCgroupParent, StateRoot: root + "/ovl"})
	if err != nil {
		t.Fatal(err)
	}
	why := rt.KernelRefusal()
	if why == nil {
		t.Fatal("a state root on overlayfs was taken for user namespaces")
	}
	for _, part := range []string{"Linux " + kernelRelease(), "cannot idmap", root + "/ovl", "--user-namespaces=false", "docs/install.md"} {
		if !strings.Contains(why.Error(), part) {
			t.Fatalf("the refusal %q does not say %q", why, part)
		}
	}
	if _, err := rt.Start(t.Context(), runtime.Spec{ID: "x", Dir: root + "/ovl", Image: "host"}); err == nil || err.Error() != why.Error() {
		t.Fatalf("Start answered %v, want the refusal", err)
	}
	cfg := Config{CgroupParent: testCgroupParent, StateRoot: root + "/ovl"}
	cfg.IDs.Off = true
	rt, err = New(cfg)
	if err != nil || rt.KernelRefusal() != nil {
		t.Fatalf("without user namespaces: %v, %v", err, rt.KernelRefusal())
	}
}

// TestFallbacksOwnership: with the fallbacks forced (overlay layers by /proc/self/fd path,
// the host files' tmpfs chowned rather than idmapped), a sandbox in a user namespace works
// and its files have the owners they have with the best mechanisms. Without the chown, /etc
// and /etc/hostname showed as nobody's (65534).
func TestFallbacksOwnership(t *testing.T) {
	needRoot(t)
	rt, err := New(Config{CgroupParent: testCgroupParent, ForceFallbacks: true})
	if err != nil {
		t.Fatal(err)
	}
	checkOwnership(t, rt)
	t.Run("disk", func(t *testing.T) { checkDiskOwnership(t, rt) })
}

// TestFallbacksWithoutUserNamespace: with the fallbacks forced and no user namespace, a
// sandbox starts, its overlay names its layers by /proc/self/fd paths (which reveal nothing
// of the host), and its files are root's.
func TestFallbacksWithoutUserNamespace(t *testing.T) {
	needRoot(t)
	cfg := Config{CgroupParent: testCgroupParent, ForceFallbacks: true}
	cfg.IDs.Off = true
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "fallback", runtime.Resources{})
	r := s.sh(t, "root", "stat -c '%n %u:%g' /etc /etc/hostname /etc/passwd && echo hi > /f && cat /f && grep ' / / ' /proc/self/mountinfo")
	if r.Code != 0 || !strings.HasPrefix(r.Output, "/etc 0:0\n/etc/hostname 0:0\n/etc/passwd 0:0\nhi\n") {
		t.Fatalf("inside: %+v", r)
	}
	if !strings.Contains(r.Output, "lowerdir=/proc/self/fd/") || strings.Contains(r.Output, root) {
		t.Fatalf("the root's mount does not name its layers by descriptor path: %s", r.Output)
	}
}
