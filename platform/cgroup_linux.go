//go:build linux

package platform

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
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

// Cgroup is one control group, either a cgroup v2 directory or, on v1, one directory of the
// same name in each of the memory, cpu and pids hierarchies. It is a handle: creating it does
// not touch the file system until Create.
type Cgroup struct {
	name string
	v2   bool
	// dirs maps a controller to its absolute directory; on v2 the key is "".
	dirs map[string]string
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
// otherwise.
func OpenCgroup(name string) (*Cgroup, error) {
	if err := validCgroupName(name); err != nil {
		return nil, err
	}
	v2, v1, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	c := &Cgroup{name: name, dirs: map[string]string{}}
	if v2 != "" {
		c.v2 = true
		c.dirs[""] = filepath.Join(v2, name)
		return c, nil
	}
	for _, ctl := range cgroupV1Controllers {
		p, ok := v1[ctl]
		if !ok {
			return nil, fmt.Errorf("platform: cgroup v1 %s hierarchy is not mounted and cgroup v2 lacks its controllers", ctl)
		}
		c.dirs[ctl] = filepath.Join(p, name)
	}
	return c, nil
}

// Name returns the cgroup's relative name.
func (c *Cgroup) Name() string { return c.name }

// V2 reports whether the cgroup is a cgroup v2 one.
func (c *Cgroup) V2() bool { return c.v2 }

// Dirs returns the cgroup's directories (one on v2, one per controller on v1).
func (c *Cgroup) Dirs() []string {
	out := make([]string, 0, len(c.dirs))
	for _, d := range c.dirs {
		out = append(out, d)
	}
	return out
}

// Exists reports whether any of the cgroup's directories exists.
func (c *Cgroup) Exists() bool {
	for _, d := range c.dirs {
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
	if c.v2 {
		return c.createV2(l)
	}
	for ctl, dir := range c.dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("platform: create cgroup: %w", err)
		}
		switch ctl {
		case "memory":
			if l.MemoryBytes > 0 {
				v := strconv.FormatInt(l.MemoryBytes, 10)
				if err := writeCgroupFile(dir, "memory.limit_in_bytes", v); err != nil {
					return err
				}
				// With swap accounting, also cap memory+swap so that swap is no way around
				// the limit.
				if _, err := os.Stat(filepath.Join(dir, "memory.memsw.limit_in_bytes")); err == nil {
					if err := writeCgroupFile(dir, "memory.memsw.limit_in_bytes", v); err != nil {
						return err
					}
				}
			}
		case "cpu":
			if l.VCPUs > 0 {
				if err := writeCgroupFile(dir, "cpu.cfs_period_us", strconv.Itoa(cfsPeriodMicros)); err != nil {
					return err
				}
				if err := writeCgroupFile(dir, "cpu.cfs_quota_us", strconv.Itoa(l.VCPUs*cfsPeriodMicros)); err != nil {
					return err
				}
			}
		case "pids":
			if l.Pids > 0 {
				if err := writeCgroupFile(dir, "pids.max", strconv.Itoa(l.Pids)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (c *Cgroup) createV2(l CgroupLimits) error {
	root := strings.TrimSuffix(c.dirs[""], c.name)
	// Every ancestor must delegate the controllers to its children.
	cur := filepath.Clean(root)
	parts := strings.Split(c.name, "/")
	for _, part := range parts {
		if err := writeCgroupFile(cur, "cgroup.subtree_control", "+memory +cpu +pids"); err != nil {
			if errors.Is(err, unix.EBUSY) {
				// cgroup v2 lets no cgroup but the root both hold processes and delegate
				// controllers: typically bothyd runs in the root of a container's cgroup
				// namespace.
				return fmt.Errorf("%w: the cgroup %s holds processes, so it cannot delegate controllers; run bothyd in a leaf cgroup of its own (move it, and everything else in %s, into a child cgroup first)", err, cur, cur)
			}
			return err
		}
		cur = filepath.Join(cur, part)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("platform: create cgroup: %w", err)
		}
	}
	dir := c.dirs[""]
	if l.MemoryBytes > 0 {
		v := strconv.FormatInt(l.MemoryBytes, 10)
		if err := writeCgroupFile(dir, "memory.max", v); err != nil {
			return err
		}
		if err := writeCgroupFile(dir, "memory.swap.max", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if l.VCPUs > 0 {
		if err := writeCgroupFile(dir, "cpu.max", fmt.Sprintf("%d %d", l.VCPUs*cfsPeriodMicros, cfsPeriodMicros)); err != nil {
			return err
		}
	}
	if l.Pids > 0 {
		if err := writeCgroupFile(dir, "pids.max", strconv.Itoa(l.Pids)); err != nil {
			return err
		}
	}
	return nil
}

// OpenDir opens the cgroup v2 directory, for clone3's CLONE_INTO_CGROUP
// (syscall.SysProcAttr.CgroupFD). It fails on v1.
func (c *Cgroup) OpenDir() (*os.File, error) {
	if !c.v2 {
		return nil, fmt.Errorf("platform: CLONE_INTO_CGROUP needs cgroup v2")
	}
	return os.OpenFile(c.dirs[""], os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
}

// EnterThread moves the calling OS thread, and no other, into the cgroup (cgroup v1 only: v1
// lets the threads of one process live in different cgroups). A process that thread then
// forks is born inside the cgroup, and a cgroup namespace it creates is rooted there. The
// caller must hold runtime.LockOSThread for the whole time, and call the returned function,
// which moves the thread back to where it was, on that same thread.
//
// The thread is named by writing "0" (the writer itself) to each hierarchy's tasks file, not
// its tid: the kernel (since 6.0) moves the writing thread alone without taking
// cgroup_threadgroup_rwsem for writing, whose percpu_down_write waits for an RCU grace period
// (about 11 ms on this host, once per hierarchy that the lock is idle) when a tid is written.
// Older kernels take "0" as the writer too and pay the wait as before.
func (c *Cgroup) EnterThread() (leave func() error, err error) {
	if c.v2 {
		return nil, fmt.Errorf("platform: moving one thread needs cgroup v1; use OpenDir on v2")
	}
	tid := unix.Gettid()
	prev, err := threadCgroups(tid)
	if err != nil {
		return nil, err
	}
	_, v1, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	var moved []string
	back := func() error {
		var first error
		for _, ctl := range moved {
			dir := filepath.Join(v1[ctl], prev[ctl])
			if err := writeCgroupFile(dir, "tasks", "0"); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	for _, ctl := range cgroupV1Controllers {
		if _, ok := prev[ctl]; !ok {
			_ = back()
			return nil, fmt.Errorf("platform: thread %d has no %s cgroup", tid, ctl)
		}
		if err := writeCgroupFile(c.dirs[ctl], "tasks", "0"); err != nil {
			_ = back()
			return nil, err
		}
		moved = append(moved, ctl)
	}
	return back, nil
}

// PidsChild makes the child cgroup name of the cgroup in its pids hierarchy (cgroup v1 only),
// limited to max tasks, and opens for writing the tasks files of the child and of the cgroup
// itself. A thread that writes "0" to one of them moves itself there ([MoveThreadTo]). The
// kernel judges such a write by the credentials of the file's opener, so a process handed the
// two files can move its own threads between the two cgroups, and nowhere else, whatever it
// runs as. It is idempotent; the child goes with the cgroup ([Cgroup.Remove]).
func (c *Cgroup) PidsChild(name string, max int) (child, self *os.File, err error) {
	dir, ok := c.dirs["pids"]
	if c.v2 || !ok {
		return nil, nil, errors.New("platform: a pids child cgroup needs cgroup v1's pids hierarchy")
	}
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || max < 1 {
		return nil, nil, fmt.Errorf("platform: pids child cgroup %q of %d tasks", name, max)
	}
	sub := filepath.Join(dir, name)
	if err := os.Mkdir(sub, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, nil, fmt.Errorf("platform: create cgroup: %w", err)
	}
	if err := writeCgroupFile(sub, "pids.max", strconv.Itoa(max)); err != nil {
		return nil, nil, err
	}
	if child, err = os.OpenFile(filepath.Join(sub, "tasks"), os.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
		return nil, nil, fmt.Errorf("platform: open a cgroup's tasks: %w", err)
	}
	if self, err = os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
		child.Close()
		return nil, nil, fmt.Errorf("platform: open a cgroup's tasks: %w", err)
	}
	return child, self, nil
}

// MoveThreadTo moves the calling OS thread, and no other, into the cgroup v1 whose tasks file
// is open for writing as tasks (see [Cgroup.PidsChild]); a process it forks then is born
// there. Writing "0", the writer itself, spares the RCU wait a tid costs (see
// [Cgroup.EnterThread]). The caller holds runtime.LockOSThread.
func MoveThreadTo(tasks *os.File) error {
	err := IgnoringEINTR(func() error {
		_, err := unix.Pwrite(int(tasks.Fd()), []byte("0"), 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("platform: move a thread to %s: %w", tasks.Name(), err)
	}
	return nil
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
// children ([Cgroup.PidsChild]).
func (c *Cgroup) Pids() ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, dir := range c.dirs {
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
// children bothyd makes ([Cgroup.PidsChild]). Nothing in a sandbox can make one: its
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
		pids, err := c.Pids()
		if err != nil {
			return err
		}
		for _, pid := range pids {
			c.killMember(pid)
		}
		var busy error
		for _, dir := range c.dirs {
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

// OOMKilled reports whether the kernel's OOM killer killed a process of this cgroup because
// of its memory limit.
func (c *Cgroup) OOMKilled() (bool, error) {
	if c.v2 {
		b, err := os.ReadFile(filepath.Join(c.dirs[""], "memory.events"))
		if err != nil {
			return false, err
		}
		return keyedCounter(b, "oom_kill") > 0, nil
	}
	dir := c.dirs["memory"]
	b, err := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return false, err
	}
	// The oom_kill counter exists since Linux 4.13.
	return keyedCounter(b, "oom_kill") > 0, nil
}

// MemoryFailures returns how often the cgroup hit its memory limit (v1 memory.failcnt, v2
// memory.events max).
func (c *Cgroup) MemoryFailures() (uint64, error) {
	if c.v2 {
		b, err := os.ReadFile(filepath.Join(c.dirs[""], "memory.events"))
		if err != nil {
			return 0, err
		}
		return keyedCounter(b, "max"), nil
	}
	b, err := os.ReadFile(filepath.Join(c.dirs["memory"], "memory.failcnt"))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
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
