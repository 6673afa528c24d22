//go:build linux

package microvm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/shim"
)

// A microVM with a NIC (a networked boot, runtime.Spec.Network, or the restore of a memory
// generation saved with one) is a QEMU in a network namespace of its own, which the launch's
// first QEMU makes and the shim keeps for the launch's life (a release ends QEMU, and the
// restore's QEMU starts in it again). QEMU makes its tap (shim.TapName)
// there; the supervisor's network.Manager makes the sandbox's veth with its peer eth0 there,
// as for a namespace sandbox; JoinGuest then redirects every frame either way between eth0
// and the tap (tc ingress, u32 match-all, mirred egress redirect), so that the namespace's
// own stack sees nothing and the guest's NIC, which the agent gives the sandbox's address,
// is what the host's veth end talks to. The host side (record, filter by host interface,
// resolver, teardown, `bothyd check`) is the Manager's, unchanged: the namespace and the
// veth's peer go with the shim, the host end with its peer.

// NetNS implements runtime.NetNSer: the QEMU of dir (the shim's verified child), once it
// runs in a network namespace other than its shim's. A microVM started without a network has
// none of its own, and no interface can be added to it while it runs: it is refused, so that
// nothing is ever made in the host's namespace.
func (r *Runtime) NetNS(dir string) (int, error) {
	dir = filepath.Clean(dir)
	procs, err := r.Processes(filepath.Dir(dir))
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		if p.Role != runtime.RoleInit || p.Dir != dir {
			continue
		}
		ppid, err := platform.ParentPid(p.ID.Pid)
		if err != nil {
			return 0, err
		}
		own, err1 := nsInode(p.ID.Pid)
		parent, err2 := nsInode(ppid)
		if err := errors.Join(err1, err2); err != nil {
			return 0, fmt.Errorf("microvm: the network namespaces of the sandbox in %s: %w", dir, err)
		}
		if own == parent {
			return 0, fmt.Errorf("microvm: the sandbox in %s was started without a network interface; restart it to give it one", dir)
		}
		return p.ID.Pid, nil
	}
	return 0, fmt.Errorf("microvm: the sandbox in %s has no live QEMU", dir)
}

func nsInode(pid int) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+strconv.Itoa(pid)+"/ns/net", &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// JoinGuest implements runtime.GuestNetworker: in the namespace ns, it brings the tap up and
// redirects each of eth0's and the tap's incoming frames out of the other. It is idempotent:
// a device that has its redirect already keeps it, and a redirect to a tap that is gone (a
// release ended its QEMU, the namespace being kept) is pointed at the new one.
func (r *Runtime) JoinGuest(ns *os.File) error {
	h, err := netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())))
	if err != nil {
		return fmt.Errorf("microvm: netlink in the sandbox's namespace: %w", err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("microvm: the sandbox's eth0: %w", err)
	}
	tap, err := h.LinkByName(shim.TapName)
	if err != nil {
		return fmt.Errorf("microvm: QEMU's %s: %w", shim.TapName, err)
	}
	if err := h.LinkSetUp(tap); err != nil {
		return fmt.Errorf("microvm: bring %s up: %w", shim.TapName, err)
	}
	for _, pair := range [][2]netlink.Link{{eth, tap}, {tap, eth}} {
		if err := redirect(h, pair[0], pair[1]); err != nil {
			return err
		}
	}
	return nil
}

// redirect sends every frame that arrives on from out of to, before from's stack sees it.
func redirect(h *netlink.Handle, from, to netlink.Link) error {
	idx := from.Attrs().Index
	qdiscs, err := h.QdiscList(from)
	if err != nil {
		return fmt.Errorf("microvm: the queues of %s: %w", from.Attrs().Name, err)
	}
	if !slices.ContainsFunc(qdiscs, func(q netlink.Qdisc) bool { return q.Type() == "ingress" }) {
		// Added when missing: a replace of an ingress queue that exists answers EINVAL.
		ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
		if err := h.QdiscAdd(ingress); err != nil {
			return fmt.Errorf("microvm: the ingress queue of %s: %w", from.Attrs().Name, err)
		}
	}
	filters, err := h.FilterList(from, netlink.MakeHandle(0xffff, 0))
	if err != nil {
		return fmt.Errorf("microvm: the filters of %s: %w", from.Attrs().Name, err)
	}
	if slices.ContainsFunc(filters, func(f netlink.Filter) bool { return redirectsTo(f, to) }) {
		return nil
	}
	// A redirect to a device that is gone (the tap of a QEMU that a release ended; the
	// restore's QEMU made a new one) goes: its frames would be dropped.
	for _, f := range filters {
		if err := h.FilterDel(f); err != nil {
			return fmt.Errorf("microvm: remove the stale redirect of %s: %w", from.Attrs().Name, err)
		}
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.MakeHandle(0xffff, 0), Priority: 1, Protocol: unix.ETH_P_ALL},
		// One key that matches every packet (mask 0).
		Sel:     &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Nkeys: 1, Keys: []netlink.TcU32Key{{}}},
		Actions: []netlink.Action{netlink.NewMirredAction(to.Attrs().Index)},
	}
	if err := h.FilterAdd(f); err != nil {
		return fmt.Errorf("microvm: redirect %s to %s: %w", from.Attrs().Name, to.Attrs().Name, err)
	}
	return nil
}

// redirectsTo reports whether f is a redirect of every frame out of to.
func redirectsTo(f netlink.Filter, to netlink.Link) bool {
	u, ok := f.(*netlink.U32)
	if !ok {
		return false
	}
	for _, a := range u.Actions {
		if m, ok := a.(*netlink.MirredAction); ok && m.Ifindex == to.Attrs().Index && m.MirredAction == netlink.TCA_EGRESS_REDIR {
			return true
		}
	}
	return false
}
