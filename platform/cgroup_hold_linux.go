//go:build linux

package platform

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// unifiedMount is where systemd mounts the cgroup v2 hierarchy. HoldCgroup runs under systemd
// only, so it looks there rather than in the mount table.
const unifiedMount = "/sys/fs/cgroup"

// HoldCgroup makes this process's cgroup v2 cgroup a parent that can hold sandboxes' cgroups:
// it moves the process into the child leaf (created if missing), so that the cgroup itself
// holds no process, which cgroup v2 requires of a cgroup that hands controllers to its
// children, and then enables controllers in its cgroup.subtree_control (those not enabled
// yet). It returns the cgroup's path below the hierarchy's root and the controllers it
// enabled. This is what a holder process of a unit with Delegate=yes does with the subtree
// systemd delegated to it; elsewhere it would fail or rearrange someone else's cgroup.
//
// It fails with ErrNoUnifiedCgroup on a host without a cgroup v2 hierarchy at /sys/fs/cgroup,
// and when a controller is not available to the cgroup (its unit lacks MemoryAccounting=,
// CPUAccounting= or TasksAccounting=).
func HoldCgroup(leaf string, controllers []string) (cgroup string, enabled []string, err error) {
	if err := validCgroupName(leaf); err != nil || strings.Contains(leaf, "/") {
		return "", nil, fmt.Errorf("the holder's leaf %q: want one cgroup name", leaf)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(unifiedMount, &fs); err != nil {
		return "", nil, fmt.Errorf("%s: %w", unifiedMount, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return "", nil, ErrNoUnifiedCgroup
	}
	cgroup, err = ownUnifiedCgroup()
	if err != nil {
		return "", nil, err
	}
	dir := filepath.Join(unifiedMount, cgroup)
	if err := os.Mkdir(filepath.Join(dir, leaf), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", nil, fmt.Errorf("creating the holder's leaf: %w", err)
	}
	if err := moveProc(filepath.Join(dir, leaf), os.Getpid()); err != nil {
		return "", nil, fmt.Errorf("moving into the holder's leaf: %w", err)
	}
	active, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return "", nil, fmt.Errorf("platform: cgroup: %w", err)
	}
	// enableControllers writes only what is missing, in one write (the kernel applies all of
	// it or none), and says which unit setting a controller the cgroup lacks needs.
	for _, c := range missingControllers(string(active), controllers) {
		enabled = append(enabled, strings.TrimPrefix(c, "+"))
	}
	if err := enableControllers(dir, controllers); err != nil {
		return "", nil, fmt.Errorf("enabling %s for %s's children: %w", strings.Join(enabled, " "), cgroup, err)
	}
	return cgroup, enabled, nil
}

// ownUnifiedCgroup is this process's cgroup in the v2 hierarchy, from the "0::" line of
// /proc/self/cgroup (cgroups(7)).
func ownUnifiedCgroup() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, " (deleted)") {
				return "", fmt.Errorf("/proc/self/cgroup: unexpected cgroup v2 path %q", p)
			}
			return p, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("/proc/self/cgroup names no cgroup v2 cgroup")
}
