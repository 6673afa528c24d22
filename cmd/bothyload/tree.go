package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// descendants lists the pids below pid in the process tree (children, theirs, and so on),
// from the parent pid in every /proc/<pid>/stat. A process that ends during the scan is
// left out.
func descendants(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, err := parentOf(p)
		if err != nil {
			continue // gone since the listing
		}
		children[ppid] = append(children[ppid], p)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out, nil
}

// parentOf is field 4 of /proc/<pid>/stat.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses; the fields after its last
	// ')' are plain: state, then the parent's pid.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return strconv.Atoi(f[1])
}

// treePSSKiB is the proportional set size of every process below pid (not pid itself), the
// sum of the Pss lines of their /proc/<pid>/smaps_rollup: what the sandboxes' shims, inits
// and agents cost, with the pages they share with each other (the runtime binary's text)
// divided among them. A process that ends during the scan counts nothing.
func treePSSKiB(pid int) (int64, error) {
	pids, err := descendants(pid)
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, p := range pids {
		kib, err := pssKiB(p)
		if err != nil {
			if _, gone := os.Stat("/proc/" + strconv.Itoa(p)); gone != nil {
				continue // it ended between the listing and the read (ENOENT or ESRCH)
			}
			return 0, err
		}
		sum += kib
	}
	return sum, nil
}

// pssKiB is the Pss line of /proc/<pid>/smaps_rollup; a kernel thread or a zombie has none
// and counts 0.
func pssKiB(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				break
			}
			return strconv.ParseInt(fields[0], 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("/proc/%d/smaps_rollup: %w", pid, err)
	}
	return 0, nil
}
