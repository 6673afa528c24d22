//go:build linux

package platform

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupV1Controllers are the v1 hierarchies a sandbox's cgroup lives in.
var cgroupV1Controllers = []string{"memory", "cpu", "pids"}

// cfsPeriodMicros is the CFS period bothyd sets; the quota is VCPUs times this.
const cfsPeriodMicros = 100000

// Cgroup is one control group: on cgroup v2 one directory, on v1 one directory of the same
// name in each of the memory, cpu and pids hierarchies. It is a handle: creating it does not
// touch the file system until Create. What it does on each version is its driver's
// ([cgroupDriver]; the two differ as the comment there says).
type Cgroup struct {
	name string
	drv  cgroupDriver
}

type mountEntry struct {
	root, point, fstype, source, superOpts string
}

// readMountinfo parses /proc/self/mountinfo.
func readMountinfo() ([]mountEntry, error) {
	// thread-self: the mount namespace is per thread, and this thread's is the one that counts.
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		e, ok := parseMountinfoLine(sc.Text())
		if ok {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

// parseMountinfoLine parses one line of mountinfo(5): fields 4 and 5 are the root and mount
// point, then optional fields up to "-", then fstype, source and super options. Paths are
// octal-escaped by the kernel.
func parseMountinfoLine(line string) (mountEntry, bool) {
	f := strings.Fields(line)
	if len(f) < 7 {
		return mountEntry{}, false
	}
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || sep+3 > len(f) {
		return mountEntry{}, false
	}
	e := mountEntry{root: unescapeMount(f[3]), point: unescapeMount(f[4]), fstype: f[sep+1], source: f[sep+2]}
	if sep+3 < len(f) {
		e.superOpts = f[sep+3]
	}
	return e, true
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// CgroupVersion reports which cgroup version bothyd uses on this host: 2 if a cgroup2
// hierarchy has the memory, cpu and pids controllers available, else 1 if v1 hierarchies for
// all three are mounted, else an error.
func CgroupVersion() (int, error) {
	v2, v1, err := cgroupMounts()
	if err != nil {
		return 0, err
	}
	if v2 != "" {
		return 2, nil
	}
	if len(v1) == len(cgroupV1Controllers) {
		return 1, nil
	}
	return 0, fmt.Errorf("platform: no usable cgroup hierarchy: need cgroup v2 with memory, cpu and pids enabled, or cgroup v1 hierarchies for them")
}

// cgroupMounts returns the mount point of a cgroup2 hierarchy whose controllers include
// memory, cpu and pids (or ""), and the mount points of the v1 hierarchies by controller. The
// map is shared: callers must not change it.
func cgroupMounts() (v2 string, v1 map[string]string, err error) {
	h, err := cgroupHierarchies()
	return h.v2, h.v1, err
}

// hierarchies are where this mount namespace has the cgroup hierarchies that bothyd uses.
type hierarchies struct {
	v2      string
	v1      map[string]string
	freezer string // the v1 freezer hierarchy's, "" if none
}

// hierarchyCache is the last mount namespace's hierarchies. Finding them means reading and
// parsing the whole mount table, and every cgroup handle needs them: reattaching a running
// sandbox opened its cgroup three times, which made the mount table 31% of bothyd's
// start-up CPU with 1000 sandboxes (issue 17). Cgroup hierarchies are mounted when the host
// boots; a namespace is named by its nsfs device and inode.
var hierarchyCache struct {
	mu     sync.Mutex
	dev    uint64
	ino    uint64
	cached hierarchies
}

// cgroupHierarchies finds the cgroup hierarchies of this thread's mount namespace, once per
// namespace.
func cgroupHierarchies() (hierarchies, error) {
	var st unix.Stat_t
	nsErr := unix.Stat("/proc/thread-self/ns/mnt", &st)
	if nsErr == nil {
		hierarchyCache.mu.Lock()
		h, hit := hierarchyCache.cached, hierarchyCache.ino != 0 && hierarchyCache.dev == st.Dev && hierarchyCache.ino == st.Ino
		hierarchyCache.mu.Unlock()
		if hit {
			return h, nil
		}
	}
	h, err := scanHierarchies()
	if err != nil {
		return hierarchies{}, err
	}
	if nsErr == nil {
		hierarchyCache.mu.Lock()
		hierarchyCache.dev, hierarchyCache.ino, hierarchyCache.cached = st.Dev, st.Ino, h
		hierarchyCache.mu.Unlock()
	}
	return h, nil
}

// scanHierarchies reads the cgroup hierarchies from the mount table.
func scanHierarchies() (hierarchies, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return hierarchies{}, err
	}
	h := hierarchies{v1: map[string]string{}}
	for _, m := range mounts {
		switch m.fstype {
		case "cgroup2":
			if h.v2 != "" {
				continue
			}
			b, err := os.ReadFile(filepath.Join(m.point, "cgroup.controllers"))
			if err != nil {
				continue
			}
			have := map[string]bool{}
			for _, c := range strings.Fields(string(b)) {
				have[c] = true
			}
			if have["memory"] && have["cpu"] && have["pids"] {
				h.v2 = m.point
			}
		case "cgroup":
			for _, opt := range strings.Split(m.superOpts, ",") {
				for _, c := range cgroupV1Controllers {
					if opt == c {
						if _, dup := h.v1[c]; !dup {
							h.v1[c] = m.point
						}
					}
				}
				if opt == "freezer" && h.freezer == "" {
					h.freezer = m.point
				}
			}
		}
	}
	return h, nil
}

// OpenCgroup returns a handle on the cgroup name (a relative path such as "bothy/abc")
// below the root of this host's hierarchy: v2 where its controllers are enabled, v1
// otherwise. The version is chosen here, once per handle, as [CgroupVersion] chooses it.
func OpenCgroup(name string) (*Cgroup, error) {
	if err := validCgroupName(name); err != nil {
		return nil, err
	}
	h, err := cgroupHierarchies()
	if err != nil {
		return nil, err
	}
	if h.v2 != "" {
		return &Cgroup{name: name, drv: newCgroupV2(h.v2, name)}, nil
	}
	d, err := newCgroupV1(h, name)
	if err != nil {
		return nil, err
	}
	return &Cgroup{name: name, drv: d}, nil
}

// Name returns the cgroup's relative name.
func (c *Cgroup) Name() string { return c.name }

// V2 reports whether the cgroup is a cgroup v2 one.
func (c *Cgroup) V2() bool {
	_, ok := c.drv.(*cgroupV2)
	return ok
}

// Dirs returns the cgroup's directories (one on v2, one per controller on v1).
func (c *Cgroup) Dirs() []string { return c.drv.dirs() }

// Exists reports whether any of the cgroup's directories exists.
func (c *Cgroup) Exists() bool {
	for _, d := range c.drv.dirs() {
		if _, err := os.Lstat(d); err == nil {
			return true
		}
	}
	return false
}

func writeCgroupFile(dir, file, value string) error {
	p := filepath.Join(dir, file)
	f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("platform: cgroup %s: %w", p, err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("platform: write %q to %s: %w", value, p, err)
	}
	return nil
}

// Create makes the cgroup's directories (and their parents) and sets its limits. It is
// idempotent: an existing cgroup gets the limits again.
func (c *Cgroup) Create(l CgroupLimits) error {
	if l.MemoryBytes < 0 || l.VCPUs < 0 || l.Pids < 0 {
		return fmt.Errorf("platform: negative cgroup limit %+v", l)
	}
	return c.drv.create(l)
}

// threadCgroups reads /proc/self/task/<tid>/cgroup into controller → path.
func threadCgroups(tid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/cgroup", tid))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			out[ctl] = parts[2]
		}
	}
	return out, nil
}

// Pids returns the processes in the cgroup (on v1, in any of its directories) and in its
// children ([Cgroup.PidsChild], [Cgroup.SplitV2]).
func (c *Cgroup) Pids() ([]int, error) { return procsOf(c.drv.dirs()) }

// procsOf returns the processes in the cgroup directories dirs and in their children.
func procsOf(dirs []string) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, dir := range dirs {
		for _, d := range append([]string{dir}, childCgroups(dir)...) {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err == nil && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
		}
	}
	return out, nil
}

// childCgroups lists the child cgroups of the cgroup directory dir, one level deep: the only
// children bothyd makes ([Cgroup.PidsChild] on v1, [Cgroup.SplitV2] on v2). Nothing in a sandbox can make one: its
// cgroup file system is mounted read-only, or not at all.
func childCgroups(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// killMember sends SIGKILL to pid if, once pinned by a pidfd, it is still in the cgroup.
func (c *Cgroup) killMember(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(line, ":/"+c.name) || strings.Contains(line, ":/"+c.name+"/") {
			_ = unix.PidfdSendSignal(fd, syscall.SIGKILL, nil, 0)
			return
		}
	}
}

// Remove kills every process left in the cgroup and removes its directories, retrying until
// they are gone or ctx ends. A cgroup that does not exist is removed already.
func (c *Cgroup) Remove(ctx context.Context) error {
	for {
		// v2's cgroup.kill (Linux 5.14) kills the whole subtree at once, processes forked
		// meanwhile included; each member is also killed by pidfd below, which is all that
		// v1 (and an older v2 kernel) has.
		c.drv.killAll()
		pids, err := c.Pids()
		if err != nil {
			return err
		}
		for _, pid := range pids {
			c.killMember(pid)
		}
		var busy error
		for _, dir := range c.drv.dirs() {
			for _, d := range append(childCgroups(dir), dir) { // children first
				if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
					busy = fmt.Errorf("platform: remove cgroup %s: %w", d, err)
				}
			}
		}
		if busy == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%v)", busy, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// OOMKilled reports whether the kernel's OOM killer killed a process of this cgroup, or of a
// child of it, because of its memory limit.
func (c *Cgroup) OOMKilled() (bool, error) { return c.drv.oomKilled() }

// MemoryFailures returns how often the cgroup hit its memory limit (v1 memory.failcnt, v2
// memory.events max).
func (c *Cgroup) MemoryFailures() (uint64, error) { return c.drv.memoryFailures() }

// Usage reads what the cgroup and its children have used: CPU time, memory now, at its peak
// and its limit, and tasks. v2 reads cpu.stat, memory.current, memory.peak, memory.max and
// pids.current; v1 the same from memory.usage_in_bytes, memory.max_usage_in_bytes,
// memory.limit_in_bytes, pids.current, and cpuacct.usage where the cpuacct controller shares
// the cpu hierarchy (bothyd makes no cgroup in a cpuacct hierarchy of its own, so elsewhere
// the CPU time is summed from the members' /proc stat, [CgroupUsage.CPUApproximate]).
func (c *Cgroup) Usage() (CgroupUsage, error) { return c.drv.usage() }

// readCgroupInt reads a cgroup file holding one integer, or "max" (read as 0, no limit).
func readCgroupInt(dir, file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	v := strings.TrimSpace(string(b))
	if v == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("platform: cgroup %s: %q is not a number", filepath.Join(dir, file), v)
	}
	return n, nil
}

// keyedCounter reads "key value" lines.
func keyedCounter(b []byte, key string) uint64 {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseUint(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// cgroupDriver is what one cgroup version does for a [Cgroup]: [cgroupV1] (the memory, cpu,
// pids and freezer hierarchies) or [cgroupV2] (the unified hierarchy), like runc's fs and
// fs2. [OpenCgroup] chooses one, as [CgroupVersion] does: v2 where a cgroup2 hierarchy has
// the memory, cpu and pids controllers, else v1. Everything bothyd does to a cgroup that
// differs between the two versions differs here, and only here:
//
//   - Where a cgroup is. v1: a directory of the same name in each of the memory, cpu and pids
//     hierarchies. v2: one directory; every ancestor must have the controllers in its
//     cgroup.subtree_control, and only those missing are written (systemd owns the levels
//     above a delegated subtree, and a write there may be refused or undone).
//   - Limits. v1: memory.limit_in_bytes (and memory.memsw.limit_in_bytes with swap
//     accounting), cpu.cfs_period_us/cpu.cfs_quota_us, pids.max. v2: memory.max with
//     memory.swap.max 0, cpu.max, pids.max.
//   - Freezing. v1: a hierarchy of its own, in which a cgroup of the same name exists only
//     while frozen (processes are moved in, frozen, thawed and moved back out). v2:
//     cgroup.freeze, done once cgroup.events says "frozen 1".
//   - OOM. v1: oom_kill in memory.oom_control. v2: oom_kill in memory.events, which counts
//     the cgroup's descendants too (memory.events.local would not).
//   - Removal. v1: every member is killed by pidfd until the directories can go. v2 the same,
//     after writing 1 to cgroup.kill where the kernel has it (5.14+), which kills the whole
//     subtree, forks in flight included.
//   - The pids allowance of a sandbox (see runtime/namespace/shim's AgentPids): the agent
//     keeps a few tasks for itself, and every workload is started in a child cgroup limited
//     to the sandbox's pids, so that a fork bomb's refusals count there and never starve
//     the agent. v1 lets the threads of one process be in different cgroups: the agent's
//     forking thread moves into the child's pids cgroup for the fork ([Cgroup.PidsChild],
//     [MoveThreadTo]). v2 places whole processes only, and a cgroup with children holds
//     none of its own: the sandbox's cgroup gets two children, agent and workloads, and each
//     workload is cloned straight into workloads with CLONE_INTO_CGROUP ([Cgroup.SplitV2],
//     whose comment has the permissions).
//   - A cgroup namespace rooted at the sandbox's cgroup. v1: the shim's forking thread enters
//     the cgroup for the fork ([Cgroup.EnterThread]), so the namespace the clone makes is
//     rooted there. v2: clone3 makes namespaces before it places the child into its cgroup,
//     so the init is cloned into the sandbox's cgroup without one and makes its own there.
type cgroupDriver interface {
	// dirs are the cgroup's directories.
	dirs() []string
	// create makes the directories and sets the limits.
	create(l CgroupLimits) error
	// killAll kills every process of the cgroup and its children at once where the kernel
	// can; [Cgroup.Remove] kills members one by one after it either way.
	killAll()
	oomKilled() (bool, error)
	memoryFailures() (uint64, error)
	// usage reads what the cgroup has used ([Cgroup.Usage]).
	usage() (CgroupUsage, error)
	frozen() (bool, error)
	freeze(ctx context.Context) error
	thaw(ctx context.Context) error
}
