package agent

import (
	"bytes"
	"os"
	"strconv"
)

// proc is what the agent needs of one /proc/<pid>/stat line.
type proc struct {
	pid, ppid, sid int
	state          byte
	utime, stime   uint64 // clock ticks
	rssPages       uint64
}

// processes lists the processes /proc shows: inside the sandbox's pid namespace, those of the
// sandbox. Processes that vanish while we read are skipped.
func processes() []proc {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	out := make([]proc, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + n + "/stat")
		if err != nil {
			continue
		}
		if p, ok := parseStat(pid, b); ok {
			out = append(out, p)
		}
	}
	return out
}

// parseStat parses /proc/<pid>/stat. The command name is in parentheses and may itself hold
// spaces and parentheses, so fields are counted from the last ')'.
func parseStat(pid int, b []byte) (proc, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return proc{}, false
	}
	f := bytes.Fields(b[i+2:])
	// f[0] is field 3 (state); field n is f[n-3].
	if len(f) < 22 {
		return proc{}, false
	}
	num := func(n int) uint64 {
		v, _ := strconv.ParseUint(string(f[n-3]), 10, 64)
		return v
	}
	return proc{
		pid:      pid,
		state:    f[0][0],
		ppid:     int(num(4)),
		sid:      int(num(6)),
		utime:    num(14),
		stime:    num(15),
		rssPages: num(24),
	}, true
}

// descendants returns the live (non-zombie) processes descended from any of roots, roots
// included.
func descendants(all []proc, roots map[int]bool) []proc {
	children := map[int][]proc{}
	byPid := map[int]proc{}
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p)
		byPid[p.pid] = p
	}
	var out []proc
	seen := map[int]bool{}
	var walk func(p proc)
	walk = func(p proc) {
		if seen[p.pid] {
			return
		}
		seen[p.pid] = true
		if p.state != 'Z' {
			out = append(out, p)
		}
		for _, c := range children[p.pid] {
			walk(c)
		}
	}
	for pid := range roots {
		if p, ok := byPid[pid]; ok {
			walk(p)
		}
	}
	return out
}
