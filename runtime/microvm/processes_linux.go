//go:build linux

package microvm

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/shim"
)

// Processes lists the shims and QEMUs of the sandboxes whose state directories lie below
// stateRoot, and QEMUs of such sandboxes that outlived their shim (see orphanQEMUs).
//
// A shim's argv marker (bothyd __vmshim <dir>) is only a claim, which any process can make;
// it is believed for a process in this process's pid namespace and of this process's user
// (a namespace sandbox's processes live in pid namespaces below it, and a microVM's in no
// host namespace at all). A QEMU ([runtime.RoleInit]: the guest's init runs in it) is a
// child of such a shim whose executable is this runtime's QEMU; its directory is its shim's.
// The shim's other children, the virtiofsds of a launch with volumes, are no init: they are
// not listed (they die with the shim, by their parent-death signal, and end with QEMU's
// connection), so that no caller takes one for the VM (NetNS would find its namespace the
// shim's).
func (r *Runtime) Processes(stateRoot string) ([]runtime.Process, error) {
	stateRoot = filepath.Clean(stateRoot)
	ownNS, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return nil, err
	}
	pids, err := procPids()
	if err != nil {
		return nil, err
	}
	var out []runtime.Process
	shims := map[int]runtime.Process{}
	for _, pid := range pids {
		if p, ok := verifiedShim(pid, stateRoot, ownNS); ok {
			shims[pid] = p
			out = append(out, p)
		}
	}
	qemu := r.cfg.QEMU
	if resolved, err := filepath.EvalSymlinks(qemu); err == nil {
		qemu = resolved
	}
	for _, pid := range pids {
		ppid, err := platform.ParentPid(pid)
		if err != nil {
			continue
		}
		parent, ok := shims[ppid]
		if !ok {
			continue
		}
		if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err != nil || exe != qemu {
			continue
		}
		id, err := platform.Identify(pid)
		if err != nil {
			continue
		}
		if again, err := platform.ParentPid(pid); err != nil || again != ppid || !id.Alive() || !parent.ID.Alive() {
			continue
		}
		out = append(out, runtime.Process{ID: id, Role: runtime.RoleInit, Dir: parent.Dir})
	}
	return append(out, r.orphanQEMUs(pids, stateRoot, ownNS, out)...), nil
}

// orphanQEMUs finds the QEMUs of sandboxes below stateRoot whose shim is gone: the parent-death
// signal that should have ended them was lost (a bug's doing, not the rule). Such a QEMU still
// holds its sandbox's overlay, and the checker must see it. It is believed by facts no
// sandbox controls: its executable is this runtime's QEMU, it runs in this pid namespace as
// this user, and its command line names the overlay of a state directory below stateRoot.
// listed are the processes found already (a shim's child is no orphan).
func (r *Runtime) orphanQEMUs(pids []int, stateRoot, ownNS string, listed []runtime.Process) []runtime.Process {
	qemu := r.cfg.QEMU
	if qemu == "" {
		return nil
	}
	if resolved, err := filepath.EvalSymlinks(qemu); err == nil {
		qemu = resolved
	}
	seen := map[int]bool{}
	for _, p := range listed {
		seen[p.ID.Pid] = true
	}
	var out []runtime.Process
	for _, pid := range pids {
		if seen[pid] {
			continue
		}
		proc := "/proc/" + strconv.Itoa(pid)
		if exe, err := os.Readlink(proc + "/exe"); err != nil || exe != qemu {
			continue
		}
		dir, ok := overlayDir(cmdline(pid), stateRoot)
		if !ok {
			continue
		}
		id, err := platform.Identify(pid)
		if err != nil {
			continue
		}
		if ns, err := os.Readlink(proc + "/ns/pid"); err != nil || ns != ownNS {
			continue
		}
		if st, err := os.Stat(proc); err != nil || !ownedByUs(st) {
			continue
		}
		if again, ok := overlayDir(cmdline(pid), stateRoot); !ok || again != dir || !id.Alive() {
			continue
		}
		out = append(out, runtime.Process{ID: id, Role: runtime.RoleInit, Dir: dir})
	}
	return out
}

// overlayDir is the state directory whose overlay a QEMU command line names as its root
// drive (the last option of the drive's argument, as shim.QEMUArgs writes it), if that lies
// below stateRoot.
func overlayDir(argv [][]byte, stateRoot string) (string, bool) {
	for _, a := range argv {
		_, file, ok := bytes.Cut(a, []byte(",file="))
		if !ok || !bytes.HasPrefix(a, []byte("if=none,id=root,")) {
			continue
		}
		path := filepath.Clean(strings.ReplaceAll(string(file), ",,", ","))
		dir := filepath.Dir(path)
		if filepath.Base(path) == shim.EntryOverlay && strings.HasPrefix(dir, stateRoot+"/") {
			return dir, true
		}
	}
	return "", false
}

func procPids() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	pids := make([]int, 0, len(ents))
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func cmdline(pid int) [][]byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil
	}
	return bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0})
}

func verifiedShim(pid int, stateRoot, ownNS string) (runtime.Process, bool) {
	claim := func() (string, bool) {
		argv := cmdline(pid)
		if len(argv) < 3 || string(argv[1]) != shim.ShimCommand {
			return "", false
		}
		dir := string(argv[2])
		return dir, strings.HasPrefix(dir, stateRoot+"/")
	}
	dir, ok := claim()
	if !ok {
		return runtime.Process{}, false
	}
	id, err := platform.Identify(pid)
	if err != nil {
		return runtime.Process{}, false
	}
	proc := "/proc/" + strconv.Itoa(pid)
	if ns, err := os.Readlink(proc + "/ns/pid"); err != nil || ns != ownNS {
		return runtime.Process{}, false
	}
	var st os.FileInfo
	if st, err = os.Stat(proc); err != nil || !ownedByUs(st) {
		return runtime.Process{}, false
	}
	if again, ok := claim(); !ok || again != dir || !id.Alive() {
		return runtime.Process{}, false
	}
	return runtime.Process{ID: id, Role: runtime.RoleShim, Dir: dir}, true
}

// strayQEMUs finds QEMU processes (of the executable qemu) whose command line names the disk
// overlay: a launch's QEMU that outlived its shim.
func strayQEMUs(qemu, overlay string) []platform.ProcessID {
	pids, err := procPids()
	if err != nil {
		return nil
	}
	want := "file=" + strings.ReplaceAll(overlay, ",", ",,")
	// /proc/<pid>/exe names the file, links resolved.
	if resolved, err := filepath.EvalSymlinks(qemu); err == nil {
		qemu = resolved
	}
	var out []platform.ProcessID
	for _, pid := range pids {
		exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
		if err != nil || exe != qemu {
			continue
		}
		id, err := platform.Identify(pid)
		if err != nil {
			continue
		}
		for _, a := range cmdline(pid) {
			if bytes.Contains(a, []byte(want)) {
				out = append(out, id)
				break
			}
		}
	}
	return out
}
