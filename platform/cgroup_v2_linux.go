//go:build linux

package platform

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupV2Controllers are the controllers a sandbox's cgroup needs from its parent.
var cgroupV2Controllers = []string{"memory", "cpu", "pids"}

// The children of a sandbox's cgroup on cgroup v2 with a pids limit ([Cgroup.SplitV2]).
const (
	// V2AgentCgroup holds the init, which becomes the agent, and whatever it starts but
	// workloads.
	V2AgentCgroup = "agent"
	// V2WorkloadsCgroup holds every workload, limited to the sandbox's pids.
	V2WorkloadsCgroup = "workloads"
)

// cgroupV2 is a cgroup on cgroup v2: one directory of the unified hierarchy ([cgroupDriver]
// says how v1 and v2 differ).
type cgroupV2 struct {
	// root is the hierarchy's mount point (a temporary directory in tests).
	root string
	name string
	dir  string
}

func newCgroupV2(root, name string) *cgroupV2 {
	return &cgroupV2{root: filepath.Clean(root), name: name, dir: filepath.Join(root, name)}
}

func (d *cgroupV2) dirs() []string { return []string{d.dir} }

// create makes the cgroup and its missing parents, each parent delegating the controllers to
// its children, and writes the limits.
func (d *cgroupV2) create(l CgroupLimits) error {
	cur := d.root
	for _, part := range strings.Split(d.name, "/") {
		if err := enableControllers(cur, cgroupV2Controllers); err != nil {
			return err
		}
		cur = filepath.Join(cur, part)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("platform: create cgroup: %w", err)
		}
	}
	if l.MemoryBytes > 0 {
		if err := writeCgroupFile(d.dir, "memory.max", strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return err
		}
		// v2 accounts swap apart from memory: without this a workload could swap its way past
		// the limit. A kernel without swap accounting has no such file, and no swap to count.
		if err := writeCgroupFile(d.dir, "memory.swap.max", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if l.VCPUs > 0 {
		if err := writeCgroupFile(d.dir, "cpu.max", fmt.Sprintf("%d %d", l.VCPUs*cfsPeriodMicros, cfsPeriodMicros)); err != nil {
			return err
		}
	}
	if l.Pids > 0 {
		if err := writeCgroupFile(d.dir, "pids.max", strconv.Itoa(l.Pids)); err != nil {
			return err
		}
	}
	return nil
}

// missingControllers returns the controllers of want that subtreeControl (the contents of a
// cgroup.subtree_control) lacks, each as "+name".
func missingControllers(subtreeControl string, want []string) []string {
	have := strings.Fields(subtreeControl)
	var add []string
	for _, c := range want {
		if !slices.Contains(have, c) {
			add = append(add, "+"+c)
		}
	}
	return add
}

// enableControllers delegates the controllers want from the cgroup dir to its children,
// writing to its cgroup.subtree_control only those not enabled yet: under systemd the
// levels above a delegated subtree are systemd's, which enables what its units account for
// and may refuse, or later undo, a write of anyone else's.
func enableControllers(dir string, want []string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("platform: cgroup: %w", err)
	}
	add := missingControllers(string(b), want)
	if len(add) == 0 {
		return nil
	}
	err = writeCgroupFile(dir, "cgroup.subtree_control", strings.Join(add, " "))
	switch {
	case errors.Is(err, unix.EBUSY):
		// cgroup v2 lets no cgroup but the root both hold processes and delegate
		// controllers: typically bothyd runs in the root of a container's cgroup namespace.
		return fmt.Errorf("%w: the cgroup %s holds processes, so it cannot delegate controllers; run bothyd in a leaf cgroup of its own (move it, and everything else in %s, into a child cgroup first), or give it a --cgroup-parent that holds none", err, dir, dir)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: %s does not have %s in its cgroup.controllers; under systemd, run bothyd's sandboxes in a unit with Delegate=yes, MemoryAccounting=yes, CPUAccounting=yes and TasksAccounting=yes", err, dir, strings.Join(add, " "))
	}
	return err
}

// killAll writes cgroup.kill, which kills every process of the cgroup and of its children
// (Linux 5.14+; before, the file does not exist and Remove kills member by member).
func (d *cgroupV2) killAll() {
	_ = writeCgroupFile(d.dir, "cgroup.kill", "1")
}

// oomKilled reads oom_kill from memory.events, which counts the OOM kills of the cgroup's
// descendants too (unless the hierarchy is mounted with memory_localevents): an OOM in a
// sandbox's workloads child shows in the sandbox's cgroup.
func (d *cgroupV2) oomKilled() (bool, error) {
	b, err := os.ReadFile(filepath.Join(d.dir, "memory.events"))
	if err != nil {
		return false, err
	}
	return keyedCounter(b, "oom_kill") > 0, nil
}

// AgentOOMKilled reports whether the kernel's OOM killer killed a process of a sandbox's
// agent. On cgroup v2 with the children of [Cgroup.SplitV2] and a memory limit, that is one
// in [V2AgentCgroup], whose memory.events counts the agent's kills and no workload's.
// Otherwise (v1, whose memory hierarchy has no such child, or v2 without the split) it is
// [Cgroup.OOMKilled]: a kill of any process of the sandbox, the workloads' included, which
// the caller must judge with how the agent ended.
func (c *Cgroup) AgentOOMKilled() (bool, error) {
	if d, ok := c.drv.(*cgroupV2); ok {
		b, err := os.ReadFile(filepath.Join(d.dir, V2AgentCgroup, "memory.events"))
		if err == nil {
			return keyedCounter(b, "oom_kill") > 0, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return false, err
		}
	}
	return c.drv.oomKilled()
}

func (d *cgroupV2) memoryFailures() (uint64, error) {
	b, err := os.ReadFile(filepath.Join(d.dir, "memory.events"))
	if err != nil {
		return 0, err
	}
	return keyedCounter(b, "max"), nil
}

// frozen reads cgroup.freeze: 1 once a freeze was asked, before every process stopped.
func (d *cgroupV2) frozen() (bool, error) {
	b, err := os.ReadFile(filepath.Join(d.dir, "cgroup.freeze"))
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) == "1", nil
}

// freeze writes cgroup.freeze and waits until cgroup.events says "frozen 1": the kernel sets
// it once every process of the cgroup and of its children stopped.
func (d *cgroupV2) freeze(ctx context.Context) error {
	if err := writeCgroupFile(d.dir, "cgroup.freeze", "1"); err != nil {
		return err
	}
	return waitCgroup(ctx, func() (bool, error) { return d.eventsFrozen(1) })
}

func (d *cgroupV2) thaw(ctx context.Context) error {
	if _, err := os.Lstat(d.dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := writeCgroupFile(d.dir, "cgroup.freeze", "0"); err != nil {
		return err
	}
	return waitCgroup(ctx, func() (bool, error) { return d.eventsFrozen(0) })
}

// eventsFrozen reports whether cgroup.events has "frozen want".
func (d *cgroupV2) eventsFrozen(want uint64) (bool, error) {
	b, err := os.ReadFile(filepath.Join(d.dir, "cgroup.events"))
	if err != nil {
		return false, err
	}
	return keyedCounter(b, "frozen") == want, nil
}

// v2 returns the cgroup's v2 driver, or an error naming what needs it.
func (c *Cgroup) v2(what string) (*cgroupV2, error) {
	d, ok := c.drv.(*cgroupV2)
	if !ok {
		return nil, fmt.Errorf("platform: %s needs cgroup v2", what)
	}
	return d, nil
}

// OpenDir opens the cgroup v2 directory, for clone3's CLONE_INTO_CGROUP
// (syscall.SysProcAttr.CgroupFD). It fails on v1.
func (c *Cgroup) OpenDir() (*os.File, error) {
	d, err := c.v2("CLONE_INTO_CGROUP")
	if err != nil {
		return nil, err
	}
	return openCgroupDir(d.dir)
}

func openCgroupDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("platform: open cgroup: %w", err)
	}
	return f, nil
}

// OpenLeaf makes the cgroup v2 directory if it is missing (and its parents, with no
// controllers delegated: a leaf that holds processes needs none) and opens it for
// CLONE_INTO_CGROUP. bothyd starts the processes that must outlive it there
// (runtime.SpawnDetached). It fails on v1.
func (c *Cgroup) OpenLeaf() (*os.File, error) {
	d, err := c.v2("a leaf cgroup")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return nil, fmt.Errorf("platform: create cgroup: %w", err)
	}
	return openCgroupDir(d.dir)
}

// SplitV2 prepares the pids allowance of a sandbox's cgroup (made by Create) on cgroup v2:
// it makes the children [V2AgentCgroup] and [V2WorkloadsCgroup] and returns the workloads'
// directory, open, for the agent to clone every workload into (CLONE_INTO_CGROUP). The init
// is cloned into the cgroup itself, makes its cgroup namespace there, and is then moved into
// the agent's child by [Cgroup.SettleV2], which also gives the workloads their limit. The
// children go with the cgroup ([Cgroup.Remove]). owner is the host uid (and gid) that the
// sandbox's root is, or -1 without a user namespace.
//
// # Permissions
//
// clone3 with CLONE_INTO_CGROUP is judged by the cloning process's own credentials and
// cgroup namespace (there is no opened cgroup.procs whose opener could be judged instead, as
// a write(2) to cgroup.procs is since Linux 5.16): it must be allowed to write the
// destination's cgroup.procs and that of the common ancestor of its own cgroup and the
// destination, and, on a hierarchy mounted with nsdelegate (systemd's default), both cgroups
// must be inside its cgroup namespace. The agent is the sandbox's root: in its user
// namespace, an unprivileged host uid (owner) with no capability over host-owned files.
// So the cgroup.procs files of workloads and of the sandbox's cgroup (the common ancestor
// of agent and workloads) are given to owner, and nothing else is: not agent's cgroup.procs,
// not cgroup.subtree_control, not a limit, not a directory (no child can be made), nothing
// above the sandbox's cgroup. The cgroup namespace is rooted at the sandbox's cgroup, so
// both children are inside it.
//
// What can root inside do with that? The cgroup file system inside is mounted read-only, so
// no write(2) reaches a cgroup file (a new mount or a remount needs CAP_SYS_ADMIN, which no
// process of a sandbox keeps, and the agent, which holds the workloads' descriptor, is not
// dumpable). But clone3 needs no write(2): a directory opened on the read-only mount serves
// as CLONE_INTO_CGROUP's descriptor, and the kernel checks the permission of the
// cgroup.procs inodes, not the mount. So root inside, as owner, can clone its own new
// children into workloads, and into nothing else: agent's cgroup.procs stays host root's,
// the sandbox's cgroup takes no process once it delegates a controller (EBUSY), and
// everything above is host root's and outside its cgroup namespace. No limit file,
// cgroup.subtree_control or directory is owner's, so no limit changes and no cgroup is made.
// A process already in agent (the agent) is not moved by it either: a write(2) to
// cgroup.procs is what moves one, and no writable mount is there to write through.
func (c *Cgroup) SplitV2(owner int) (workloads *os.File, err error) {
	d, err := c.v2("the workloads' cgroup")
	if err != nil {
		return nil, err
	}
	for _, child := range []string{V2AgentCgroup, V2WorkloadsCgroup} {
		if err := os.Mkdir(filepath.Join(d.dir, child), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("platform: create cgroup: %w", err)
		}
	}
	if owner >= 0 {
		for _, p := range []string{filepath.Join(d.dir, V2WorkloadsCgroup, "cgroup.procs"), filepath.Join(d.dir, "cgroup.procs")} {
			if err := os.Lchown(p, owner, owner); err != nil {
				return nil, fmt.Errorf("platform: cgroup: %w", err)
			}
		}
	}
	return openCgroupDir(filepath.Join(d.dir, V2WorkloadsCgroup))
}

// SettleV2 finishes [Cgroup.SplitV2] once the init (pid), cloned into the cgroup, has made
// its cgroup namespace there: it moves the init into [V2AgentCgroup], delegates the pids
// controller (and, with memoryBytes > 0, the memory controller) to the children (which the
// cgroup may do only once it holds no process), and limits [V2WorkloadsCgroup] to pids tasks
// and memoryBytes of memory without swap. The agent's allowance is what the cgroup's own
// limits leave.
//
// The memory limit of the workloads' own is what keeps the agent alive through a workload's
// OOM: a memory cgroup's OOM killer picks its victim among that cgroup's processes, so a
// workload over its limit is killed in workloads, never the agent. With one limit on the
// sandbox's cgroup for both, the kernel killed the workload and then, 0.1 s later with the
// memory not yet returned, the agent (seen in the cgroup-v2 guest, tests/guest).
func (c *Cgroup) SettleV2(pid, pids int, memoryBytes int64) error {
	d, err := c.v2("the workloads' cgroup")
	if err != nil {
		return err
	}
	if pids < 1 {
		return fmt.Errorf("platform: a workloads' cgroup of %d tasks", pids)
	}
	if err := moveProc(filepath.Join(d.dir, V2AgentCgroup), pid); err != nil {
		return err
	}
	controllers := []string{"pids"}
	if memoryBytes > 0 {
		controllers = append(controllers, "memory")
	}
	if err := enableControllers(d.dir, controllers); err != nil {
		return err
	}
	workloads := filepath.Join(d.dir, V2WorkloadsCgroup)
	if memoryBytes > 0 {
		if err := writeCgroupFile(workloads, "memory.max", strconv.FormatInt(memoryBytes, 10)); err != nil {
			return err
		}
		if err := writeCgroupFile(workloads, "memory.swap.max", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return writeCgroupFile(workloads, "pids.max", strconv.Itoa(pids))
}

// usage reads cpu.stat's usage_usec, memory.current, memory.peak (Linux 5.19+, optional),
// memory.max and pids.current of the sandbox's cgroup, which count its children too.
func (d *cgroupV2) usage() (CgroupUsage, error) {
	var u CgroupUsage
	b, err := os.ReadFile(filepath.Join(d.dir, "cpu.stat"))
	if err != nil {
		return u, err
	}
	u.CPU = time.Duration(keyedCounter(b, "usage_usec")) * time.Microsecond
	if u.MemoryBytes, err = readCgroupInt(d.dir, "memory.current"); err != nil {
		return u, err
	}
	if u.MemoryLimitBytes, err = readCgroupInt(d.dir, "memory.max"); err != nil {
		return u, err
	}
	if peak, err := readCgroupInt(d.dir, "memory.peak"); err == nil {
		u.MemoryPeakBytes, u.HasMemoryPeak = peak, true
	}
	if u.Pids, err = readCgroupInt(d.dir, "pids.current"); err != nil {
		return u, err
	}
	return u, nil
}
