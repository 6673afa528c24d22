//go:build linux

package namespace

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// Processes lists the shims and inits of the sandboxes whose state directories lie below
// stateRoot.
//
// Any process can give itself any argv, and a workload inside a sandbox can run one whose
// argv reads "bothyd __shim <dir>". So the marker in argv only says which process claims to
// be a shim, and for which directory; the claim is believed only for a process that shows
// what no process inside a sandbox can:
//
//   - A shim runs in this process's pid namespace (the host's, where the runtime starts its
//     shims) and as this process's user. Every process of a sandbox is in the sandbox's own
//     pid namespace, below the host's, and cannot leave it; and a host user other than ours
//     cannot make a process of our user.
//   - An init is a child of such a shim that is PID 1 of a pid namespace of its own. A shim
//     starts no other child, and no process of a sandbox can become a shim's child: its
//     descendants are the init's, and the kernel refuses CLONE_PARENT to a namespace's init.
//     Its directory is its shim's, whatever its own argv says.
//
// The executable is not compared with this runtime's: a shim of another build (an upgrade, a
// server using bothyd-runtime) is still a runtime process, whose identity the supervisor
// and the checker judge (runtime-mismatch).
//
// Each process is identified (pid and start time) before its facts are read, and checked to
// be alive after, with the first fact read again: facts of a process that ended meanwhile are
// never attributed to another one that reuses its pid.
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
	if len(shims) == 0 {
		return out, nil
	}
	for _, pid := range pids {
		if p, ok := verifiedInit(pid, shims); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// procPids lists the pids in /proc.
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

// verifiedShim returns pid as a shim of a state directory below stateRoot if its argv says it
// is one and it runs in the pid namespace ownNS as this process's user.
func verifiedShim(pid int, stateRoot, ownNS string) (runtime.Process, bool) {
	proc := "/proc/" + strconv.Itoa(pid)
	dir, ok := shimClaim(proc, stateRoot)
	if !ok {
		return runtime.Process{}, false
	}
	id, err := platform.Identify(pid)
	if err != nil {
		return runtime.Process{}, false
	}
	ns, err := os.Readlink(proc + "/ns/pid")
	if err != nil || ns != ownNS {
		return runtime.Process{}, false
	}
	st, err := readProcStatus(pid)
	if err != nil || !st.ownedBy(os.Geteuid()) {
		return runtime.Process{}, false
	}
	// The claim read before the identity may have been another process's, at a pid reused
	// since: read it again, from the process identified (alive after the read).
	if again, ok := shimClaim(proc, stateRoot); !ok || again != dir || !id.Alive() {
		return runtime.Process{}, false
	}
	return runtime.Process{ID: id, Role: runtime.RoleShim, Dir: dir}, true
}

// shimClaim returns the state directory that the process at proc (its /proc directory) names
// in a shim's marker (argv: bothyd __shim <dir>), if it is one below stateRoot.
func shimClaim(proc, stateRoot string) (string, bool) {
	b, err := os.ReadFile(proc + "/cmdline")
	if err != nil {
		return "", false
	}
	argv := bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0})
	if len(argv) < 3 || string(argv[1]) != shim.ShimCommand {
		return "", false
	}
	dir := string(argv[2])
	return dir, strings.HasPrefix(dir, stateRoot+"/")
}

// verifiedInit returns pid as an init if it is PID 1 of a pid namespace of its own and the
// child of one of shims (by pid), which is still the process that was found.
func verifiedInit(pid int, shims map[int]runtime.Process) (runtime.Process, bool) {
	ppid, err := platform.ParentPid(pid)
	if err != nil {
		return runtime.Process{}, false
	}
	parent, ok := shims[ppid]
	if !ok {
		return runtime.Process{}, false
	}
	id, err := platform.Identify(pid)
	if err != nil {
		return runtime.Process{}, false
	}
	st, err := readProcStatus(pid)
	if err != nil || !st.namespaceInit() {
		return runtime.Process{}, false
	}
	// As for a shim's claim: the parent read before the identity is read again.
	if again, err := platform.ParentPid(pid); err != nil || again != ppid || !id.Alive() || !parent.ID.Alive() {
		return runtime.Process{}, false
	}
	return runtime.Process{ID: id, Role: runtime.RoleInit, Dir: parent.Dir}, true
}

// procStatus is what Processes reads from /proc/<pid>/status.
type procStatus struct {
	// uids are the real, effective, saved and file-system user ids.
	uids []string
	// nsPids is the process's pid in each pid namespace it is in, outermost (this /proc's)
	// first.
	nsPids []string
}

func readProcStatus(pid int) (procStatus, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return procStatus{}, err
	}
	var st procStatus
	for line := range strings.SplitSeq(string(b), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch key {
		case "Uid":
			st.uids = strings.Fields(val)
		case "NSpid":
			st.nsPids = strings.Fields(val)
		}
	}
	return st, nil
}

// ownedBy says whether every user id of the process is uid.
func (st procStatus) ownedBy(uid int) bool {
	want := strconv.Itoa(uid)
	return len(st.uids) > 0 && !slices.ContainsFunc(st.uids, func(u string) bool { return u != want })
}

// namespaceInit says whether the process is PID 1 of a pid namespace below this /proc's.
func (st procStatus) namespaceInit() bool {
	return len(st.nsPids) >= 2 && st.nsPids[len(st.nsPids)-1] == "1"
}

// HostResources implements runtime.Runtime: the cgroups named <CgroupParent>/<id>.<hash of
// sandboxesDir/id> (shim.CgroupLeaf), which are those of this state root's sandboxes; other
// state roots' hash differently.
func (r *Runtime) HostResources(sandboxesDir string) ([]runtime.HostResource, error) {
	sandboxesDir = filepath.Clean(sandboxesDir)
	parent, err := platform.OpenCgroup(r.cfg.CgroupParent)
	if err != nil {
		return nil, err
	}
	byID := map[string]*runtime.HostResource{}
	for _, d := range parent.Dirs() {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue // no sandbox cgroup made yet in this hierarchy
		}
		for _, e := range ents {
			id, _, ok := strings.Cut(e.Name(), ".")
			dir := filepath.Join(sandboxesDir, id)
			if !ok || !e.IsDir() || e.Name() != shim.CgroupLeaf(id, dir) {
				continue
			}
			res := byID[id]
			if res == nil {
				res = &runtime.HostResource{Kind: runtime.ResourceCgroup, SandboxID: id, Dir: dir, Name: r.cgroupName(id, dir)}
				byID[id] = res
			}
			res.Paths = append(res.Paths, filepath.Join(d, e.Name()))
		}
	}
	out := make([]runtime.HostResource, 0, len(byID))
	for _, res := range byID {
		out = append(out, *res)
	}
	slices.SortFunc(out, func(a, b runtime.HostResource) int { return strings.Compare(a.SandboxID, b.SandboxID) })
	return out, nil
}
