//go:build linux

package platform

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

var capNumbers = map[string]uintptr{
	"CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE,
	"CAP_DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH, "CAP_FOWNER": unix.CAP_FOWNER,
	"CAP_FSETID": unix.CAP_FSETID, "CAP_KILL": unix.CAP_KILL, "CAP_SETGID": unix.CAP_SETGID,
	"CAP_SETUID": unix.CAP_SETUID, "CAP_SETPCAP": unix.CAP_SETPCAP,
	"CAP_LINUX_IMMUTABLE": unix.CAP_LINUX_IMMUTABLE, "CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE,
	"CAP_NET_BROADCAST": unix.CAP_NET_BROADCAST, "CAP_NET_ADMIN": unix.CAP_NET_ADMIN,
	"CAP_NET_RAW": unix.CAP_NET_RAW, "CAP_IPC_LOCK": unix.CAP_IPC_LOCK, "CAP_IPC_OWNER": unix.CAP_IPC_OWNER,
	"CAP_SYS_MODULE": unix.CAP_SYS_MODULE, "CAP_SYS_RAWIO": unix.CAP_SYS_RAWIO,
	"CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT, "CAP_SYS_PTRACE": unix.CAP_SYS_PTRACE,
	"CAP_SYS_PACCT": unix.CAP_SYS_PACCT, "CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN,
	"CAP_SYS_BOOT": unix.CAP_SYS_BOOT, "CAP_SYS_NICE": unix.CAP_SYS_NICE,
	"CAP_SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "CAP_SYS_TIME": unix.CAP_SYS_TIME,
	"CAP_SYS_TTY_CONFIG": unix.CAP_SYS_TTY_CONFIG, "CAP_MKNOD": unix.CAP_MKNOD,
	"CAP_LEASE": unix.CAP_LEASE, "CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE,
	"CAP_AUDIT_CONTROL": unix.CAP_AUDIT_CONTROL, "CAP_SETFCAP": unix.CAP_SETFCAP,
	"CAP_MAC_OVERRIDE": unix.CAP_MAC_OVERRIDE, "CAP_MAC_ADMIN": unix.CAP_MAC_ADMIN,
	"CAP_SYSLOG": unix.CAP_SYSLOG, "CAP_WAKE_ALARM": unix.CAP_WAKE_ALARM,
	"CAP_BLOCK_SUSPEND": unix.CAP_BLOCK_SUSPEND, "CAP_AUDIT_READ": unix.CAP_AUDIT_READ,
	"CAP_PERFMON": unix.CAP_PERFMON, "CAP_BPF": unix.CAP_BPF,
	"CAP_CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
}

// lastCap returns the highest capability number this kernel knows. It is read once: the
// loops over capabilities call it at every step, and a sandbox start drops capabilities in
// several places.
var lastCap = sync.OnceValue(func() uintptr {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			return uintptr(n)
		}
	}
	return unix.CAP_LAST_CAP
})

// capabilitySet parses capability names into a set and the two 32-bit words of capset(2).
func capabilitySet(keep []string) (want map[uintptr]bool, mask [2]uint32, err error) {
	want = map[uintptr]bool{}
	for _, name := range keep {
		n, ok := capNumbers[name]
		if !ok {
			return nil, mask, fmt.Errorf("platform: unknown capability %q", name)
		}
		want[n] = true
		mask[n/32] |= 1 << (n % 32)
	}
	return want, mask, nil
}

// LimitThreadCapabilities reduces the calling THREAD's capabilities to keep (names such as
// "CAP_KILL"): the bounding set, permitted, effective and inheritable sets, and clears the
// ambient set. Capabilities are per thread, so the caller must hold runtime.LockOSThread and
// exec right after on the same thread: the exec'd program then starts, on every thread it
// ever makes, with at most keep.
func LimitThreadCapabilities(keep []string) error {
	want, mask, err := capabilitySet(keep)
	if err != nil {
		return err
	}
	for c := uintptr(0); c <= lastCap(); c++ {
		if want[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			return fmt.Errorf("platform: drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("platform: clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for i := range data {
		data[i] = unix.CapUserData{Effective: mask[i], Permitted: mask[i], Inheritable: mask[i]}
	}
	if err := unix.Capset(&hdr, (*unix.CapUserData)(unsafe.Pointer(&data[0]))); err != nil {
		return fmt.Errorf("platform: capset: %w", err)
	}
	return nil
}

// BoundThreadCapabilities drops every capability but keep from the calling THREAD's bounding
// set, and nothing else: the thread keeps its own capabilities, but a process it forks and
// execs can never hold more than keep. The caller holds runtime.LockOSThread.
func BoundThreadCapabilities(keep []string) error {
	want := map[uintptr]bool{}
	for _, name := range keep {
		n, ok := capNumbers[name]
		if !ok {
			return fmt.Errorf("platform: unknown capability %q", name)
		}
		want[n] = true
	}
	for c := uintptr(0); c <= lastCap(); c++ {
		if want[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			return fmt.Errorf("platform: drop capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

// SetNoNewPrivs sets the calling thread's no_new_privs bit: from then on no exec can grant
// privileges (set-user-ID bits and file capabilities are ignored). It is per thread and
// inherited across fork and exec.
func SetNoNewPrivs() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("platform: PR_SET_NO_NEW_PRIVS: %w", err)
	}
	return nil
}

// ErrAllThreadsUnsupported is returned by the whole-process variants below in a binary that
// links cgo: Go can then not run a system call on every thread (syscall.AllThreadsSyscall).
// Callers fall back to the per-thread variants and an exec.
var ErrAllThreadsUnsupported = errors.New("platform: per-process credential changes need a binary built without cgo")

func allThreads(trap, a1, a2, a3 uintptr) error {
	_, _, errno := syscall.AllThreadsSyscall(trap, a1, a2, a3)
	if errno == syscall.ENOTSUP {
		return ErrAllThreadsUnsupported
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// LimitProcessCapabilities reduces the permitted, effective and inheritable capabilities of
// every thread of the process at once (and so of every thread it makes later) to keep, and
// clears the ambient set; it bounds the calling thread's bounding set as well, but no other
// thread's. A workload inherits its forking thread's bounding set, so the one who forks calls
// BoundThreadCapabilities on that thread first ([agent.Config.WorkloadCapabilities]).
//
// Why not every thread's bounding set: each whole-process change is a stop-the-world of the Go
// runtime, about 85 µs with an agent's threads on a quiet host, and the bounding set is
// dropped one capability at a time: 27 of the 30 stops a start made. What the other threads
// keep in their bounding set gives them nothing: their permitted set is keep, capset(2) can
// never raise it, and with no_new_privs (which the seccomp filter's TSYNC sets on them) no exec
// of theirs can either.
//
// It returns ErrAllThreadsUnsupported, having changed nothing, in a binary that links cgo.
func LimitProcessCapabilities(keep []string) error {
	want, mask, err := capabilitySet(keep)
	if err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for i := range data {
		data[i] = unix.CapUserData{Effective: mask[i], Permitted: mask[i], Inheritable: mask[i]}
	}
	err = allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if errors.Is(err, ErrAllThreadsUnsupported) {
		return err
	}
	if err != nil {
		return fmt.Errorf("platform: capset: %w", err)
	}
	// capset left in the ambient set only what is in keep (it is a subset of permitted and
	// inheritable), and every thread holds the same one: the calling thread's tells whether
	// another stop is needed. A new user namespace starts with an empty one.
	if ambientHolds(want) {
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil {
			return fmt.Errorf("platform: clear ambient capabilities: %w", err)
		}
	}
	return BoundThreadCapabilities(keep)
}

// ambientHolds reports whether the calling thread's ambient set holds any capability of set
// (or cannot be read).
func ambientHolds(set map[uintptr]bool) bool {
	for c := range set {
		r, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, c, 0, 0)
		if err != nil || r != 0 {
			return true
		}
	}
	return false
}
