//go:build linux

package shim

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/bothy/bothy/platform"
)

// idRange is the host ids of a running sandbox's user namespace: IDRangeSize of them from
// base, slot slot of the registry, held for as long as lock stays open (the shim's life).
type idRange struct {
	slot int
	base uint32
	lock *platform.IDRangeLock
}

// allocateIDs takes the first free slot of the registry that overlaps no range that
// /etc/subuid or /etc/subgid hands to a host user (their owners may map those ids in
// namespaces of their own). It returns nil for a sandbox without a user namespace.
//
// The slot is taken before the init exists and is held by the shim's open registry, which
// no child inherits (close-on-exec): it is the record, and it is released by the kernel when
// the shim ends, so no crash leaks a slot and no two live shims ever hold one.
func allocateIDs(c IDConfig) (*idRange, error) {
	if c.Off {
		return nil, nil
	}
	if c.Slots <= 0 || uint64(c.Base)+uint64(c.Slots)*IDRangeSize > 1<<32-1 {
		return nil, fmt.Errorf("user namespace: %d slots from host id %d do not fit below 2^32-1", c.Slots, c.Base)
	}
	taken := subordinateRanges("/etc/subuid", "/etc/subgid")
	lock, err := platform.OpenIDRangeLock(c.Registry)
	if err != nil {
		return nil, err
	}
	for n := 0; n < c.Slots; n++ {
		base := uint64(c.Base) + uint64(n)*IDRangeSize
		if overlaps(taken, base, base+IDRangeSize) {
			continue
		}
		ok, err := lock.TryLock(n)
		if err != nil {
			lock.Close()
			return nil, err
		}
		if ok {
			return &idRange{slot: n, base: uint32(base), lock: lock}, nil
		}
	}
	lock.Close()
	return nil, fmt.Errorf("user namespace: all %d id ranges of %s are in use", c.Slots, c.Registry)
}

// release gives the slot back (the shim's exit does the same).
func (r *idRange) release() {
	if r != nil {
		r.lock.Close()
	}
}

// span is a half-open range of host ids.
type span struct{ from, to uint64 }

func overlaps(spans []span, from, to uint64) bool {
	for _, s := range spans {
		if from < s.to && s.from < to {
			return true
		}
	}
	return false
}

// subordinateRanges reads the ranges of the subordinate id files (name:first:count per line);
// a missing file has none.
func subordinateRanges(files ...string) []span {
	var out []span
	for _, f := range files {
		b, err := platform.ReadFile(f, 4<<20)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			fields := strings.Split(strings.TrimSpace(sc.Text()), ":")
			if len(fields) != 3 {
				continue
			}
			first, err1 := strconv.ParseUint(fields[1], 10, 32)
			count, err2 := strconv.ParseUint(fields[2], 10, 32)
			if err1 != nil || err2 != nil || count == 0 {
				continue
			}
			out = append(out, span{first, first + count})
		}
	}
	return out
}

// openUserNamespace opens the user namespace of the child pid (one not yet waited for, so
// that its pid names it alone).
func openUserNamespace(pid int) (*os.File, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return nil, fmt.Errorf("user namespace of the init: %w", err)
	}
	return f, nil
}
