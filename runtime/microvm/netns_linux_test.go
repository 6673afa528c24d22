//go:build linux

package microvm

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/shim"
)

// TestQEMUArgsNetwork: a launch with a NIC gets the tap and a modern-only virtio NIC, any
// other launch (and the probe guest) no NIC at all, whatever its spec's policy says (a
// restore has its generation's devices).
func TestQEMUArgsNetwork(t *testing.T) {
	args := func(nic, probe bool) []string {
		cfg := &shim.Config{Accel: "tcg", QEMU: "qemu", Kernel: "k", Initramfs: "i", Overlay: "o",
			Spec: runtime.Spec{Network: !nic}, NIC: nic}
		return shim.QEMUArgs(cfg, probe)
	}
	on := args(true, false)
	if i := slices.Index(on, "-netdev"); i < 0 || on[i+1] != "tap,id=net,ifname="+shim.TapName+",script=no,downscript=no" {
		t.Errorf("a networked launch's QEMU arguments lack the tap: %q", on)
	}
	if i := slices.Index(on, "virtio-net-pci,netdev=net,disable-legacy=on"); i < 1 || on[i-1] != "-device" {
		t.Errorf("a networked launch's QEMU arguments lack the NIC: %q", on)
	}
	for _, off := range [][]string{args(false, false), args(true, true)} {
		if s := strings.Join(off, " "); strings.Contains(s, "netdev") || strings.Contains(s, "virtio-net") {
			t.Errorf("a launch without a network gets a NIC: %s", s)
		}
	}
}

// TestJoinGuestRedirects: in a namespace with eth0 and tap0, JoinGuest brings the tap up and
// gives each device one filter that redirects to the other; a second call adds nothing.
func TestJoinGuestRedirects(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it makes a network namespace")
	}
	ns := newNS(t)
	h, err := netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	tun := makeTap(t, ns)
	r := &Runtime{}
	for range 2 {
		if err := r.JoinGuest(ns); err != nil {
			t.Fatal(err)
		}
	}
	checkRedirects(t, h)

	// A release ends QEMU, whose tap goes with its descriptor; the restore's QEMU makes a new
	// one (another index) in the same namespace, and the join points both redirects at it.
	old, _ := h.LinkByName(shim.TapName)
	tun.Close()
	makeTap(t, ns)
	if tapl, err := h.LinkByName(shim.TapName); err != nil || tapl.Attrs().Index == old.Attrs().Index {
		t.Fatalf("the new tap: %v, %v (the old one's index %d)", tapl, err, old.Attrs().Index)
	}
	if err := r.JoinGuest(ns); err != nil {
		t.Fatal(err)
	}
	checkRedirects(t, h)
}

// makeTap makes QEMU's tap in ns, as QEMU does: an ioctl on /dev/net/tun in the namespace of
// the calling thread. The tap lives while the returned descriptor is open.
func makeTap(t *testing.T, ns *os.File) *os.File {
	t.Helper()
	var tun *os.File
	if err := inNS(ns, func() error {
		f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(shim.TapName)
		if err != nil {
			f.Close()
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(int(f.Fd()), unix.TUNSETIFF, ifr); err != nil {
			f.Close()
			return err
		}
		tun = f
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tun.Close() })
	return tun
}

// checkRedirects checks that the tap is up and that eth0 and the tap each have exactly one
// ingress filter, which redirects to the other.
func checkRedirects(t *testing.T, h *netlink.Handle) {
	t.Helper()
	eth, _ := h.LinkByName("eth0")
	tapl, err := h.LinkByName(shim.TapName)
	if err != nil {
		t.Fatal(err)
	}
	if tapl.Attrs().Flags&(1<<0) == 0 { // net.FlagUp
		t.Errorf("%s is not up", shim.TapName)
	}
	for _, pair := range [][2]netlink.Link{{eth, tapl}, {tapl, eth}} {
		fs, err := h.FilterList(pair[0], netlink.MakeHandle(0xffff, 0))
		if err != nil {
			t.Fatal(err)
		}
		if len(fs) != 1 {
			t.Fatalf("%s has %d ingress filters; want 1", pair[0].Attrs().Name, len(fs))
		}
		u, ok := fs[0].(*netlink.U32)
		if !ok || len(u.Actions) != 1 {
			t.Fatalf("%s's filter is %#v", pair[0].Attrs().Name, fs[0])
		}
		m, ok := u.Actions[0].(*netlink.MirredAction)
		if !ok || m.Ifindex != pair[1].Attrs().Index || m.MirredAction != netlink.TCA_EGRESS_REDIR {
			t.Fatalf("%s's filter redirects by %#v; want egress to %s", pair[0].Attrs().Name, u.Actions[0], pair[1].Attrs().Name)
		}
	}
}

// newNS makes an empty network namespace, gone when the test ends.
func newNS(t *testing.T) *os.File {
	t.Helper()
	done := make(chan error, 1)
	var f *os.File
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- err
			return
		}
		defer orig.Close()
		n, err := netns.New()
		if err != nil {
			done <- err
			return
		}
		if netns.Set(orig) == nil {
			goruntime.UnlockOSThread()
		}
		f = os.NewFile(uintptr(n), "netns")
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// inNS runs fn on a thread in ns.
func inNS(ns *os.File, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(netns.NsHandle(int(ns.Fd()))); err != nil {
			done <- err
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			goruntime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// TestRestoreHasTheSavedNIC: a restore gets the NIC iff its generation's vm.json records one,
// whatever the launch's policy; a networked restore of a generation without one is refused
// before the clone's overlay is touched; a boot over a generation (a clone's later start)
// follows its policy. A state with a NIC is of its own format, and one that claims a NIC in
// the old format (or the reverse) does not read.
func TestRestoreHasTheSavedNIC(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		saved, network   bool
		restore          bool
		wantNIC, refused bool
	}{
		{name: "networked restore of a NIC", saved: true, network: true, restore: true, wantNIC: true},
		{name: "restore of a NIC without a network", saved: true, restore: true, wantNIC: true},
		{name: "networked restore without a NIC", network: true, restore: true, refused: true},
		{name: "restore without either", restore: true},
		{name: "networked boot over a generation without a NIC", network: true, wantNIC: true},
		{name: "boot over a generation with a NIC, no network", saved: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			gen, dir := t.TempDir(), t.TempDir()
			info := shim.StateInfo{Format: shim.StateInfoFormat(tc.saved), Accel: "tcg", VCPUs: 1, MemoryMB: 256, NIC: tc.saved}
			b, _ := json.Marshal(info)
			if err := os.WriteFile(filepath.Join(gen, shim.StateMeta), b, 0o600); err != nil {
				t.Fatal(err)
			}
			overlay := filepath.Join(dir, shim.EntryOverlay)
			if err := os.WriteFile(overlay, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			spec := runtime.Spec{Dir: dir, Network: tc.network}
			if tc.restore {
				spec.Restore = &runtime.Restore{}
			}
			launch := shim.StateInfo{Format: shim.StateFormat, Accel: "tcg", VCPUs: 1, MemoryMB: 256, NIC: tc.network}
			_, _, err := overGeneration(spec, gen, &launch)
			if tc.refused {
				if !errors.Is(err, ErrNoSavedNIC) {
					t.Fatalf("overGeneration = %v; want ErrNoSavedNIC", err)
				}
				if _, err := os.Stat(overlay); err != nil {
					t.Fatalf("the refused restore touched the overlay: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if launch.NIC != tc.wantNIC {
				t.Fatalf("the launch's NIC is %v; want %v", launch.NIC, tc.wantNIC)
			}
		})
	}
	gen := t.TempDir()
	for _, bad := range []shim.StateInfo{{Format: shim.StateFormat, NIC: true}, {Format: shim.StateFormatNIC}} {
		b, _ := json.Marshal(bad)
		if err := os.WriteFile(filepath.Join(gen, shim.StateMeta), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := (&Runtime{}).SavedNIC(gen); err == nil {
			t.Errorf("the state %+v reads", bad)
		}
	}
}

// TestReleaseKeepsTheNetwork: a networked microVM's network namespace outlives a release of
// its memory (the shim keeps it, with what the host made there: here an eth0 that JoinGuest
// joined), the released state records the NIC, and the restore's QEMU runs in the same
// namespace with a new tap, to which a second JoinGuest points the redirects.
func TestReleaseKeepsTheNetwork(t *testing.T) {
	r := newRuntime(t)
	ctx := vmContext(t)
	spec := testSpec(t, "relnet")
	spec.Network = true
	proc, err := r.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Kill(ctx, spec.Dir, proc) }()
	dialAgent(ctx, t, r, spec.Dir, proc, spec.Capability).Close()
	qemu, err := r.NetNS(spec.Dir)
	if err != nil {
		t.Fatal(err)
	}
	before, err := nsInode(qemu)
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox's eth0, as the Manager makes it: a veth whose peer is in the host's
	// namespace, which goes when the namespace does.
	join := func() {
		t.Helper()
		ns, err := os.Open("/proc/" + strconv.Itoa(qemu) + "/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		if err := r.JoinGuest(ns); err != nil {
			t.Fatal(err)
		}
		h, err := netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		checkRedirects(t, h)
	}
	func() {
		ns, err := os.Open("/proc/" + strconv.Itoa(qemu) + "/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		peer := "vmnt" + strconv.Itoa(os.Getpid()%100000)
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: peer, PeerNamespace: netlink.NsPid(os.Getpid())}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if l, err := netlink.LinkByName(peer); err == nil {
				_ = netlink.LinkDel(l)
			}
		})
	}()
	join()

	if err := r.ReleaseMemory(ctx, spec.ID, spec.Dir); err != nil {
		t.Fatal(err)
	}
	if nic, err := r.SavedNIC(filepath.Join(spec.Dir, shim.EntryMemory)); err != nil || !nic {
		t.Fatalf("the released state's NIC: %v, %v; want it recorded", nic, err)
	}
	if err := r.Thaw(ctx, spec.ID, spec.Dir); err != nil {
		t.Fatal(err)
	}
	if qemu, err = r.NetNS(spec.Dir); err != nil {
		t.Fatal(err)
	}
	if after, err := nsInode(qemu); err != nil || after != before {
		t.Fatalf("the restored QEMU's network namespace is %d (%v); the launch's was %d", after, err, before)
	}
	join()
	c := dialAgent(ctx, t, r, spec.Dir, proc, spec.Capability)
	defer c.Close()
	if got := run(ctx, t, c, "cat", "/sys/class/net/eth0/address"); got == "" {
		t.Fatal("the restored guest has no eth0")
	}
}
