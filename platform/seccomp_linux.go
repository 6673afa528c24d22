//go:build linux

package platform

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SeccompProgram is a compiled seccomp BPF filter, ready to install. Platform holds and
// installs programs but does not compile them: the host compiles a profile (package
// runtime/namespace/seccomp) and hands the program to the sandbox in its binary form
// ([SeccompProgram.MarshalBinary]), so that the sandbox side links no profile library.
type SeccompProgram struct {
	filter []unix.SockFilter
}

// NewSeccompProgram returns the program of the instructions filter (copied), which must be
// between one and the kernel's BPF_MAXINSNS instructions long.
func NewSeccompProgram(filter []unix.SockFilter) (*SeccompProgram, error) {
	if len(filter) == 0 || len(filter) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("platform: a seccomp program of %d instructions is not between 1 and the kernel's %d", len(filter), unix.BPF_MAXINSNS)
	}
	return &SeccompProgram{filter: append([]unix.SockFilter(nil), filter...)}, nil
}

// Filter returns a copy of the program's instructions.
func (p *SeccompProgram) Filter() []unix.SockFilter {
	return append([]unix.SockFilter(nil), p.filter...)
}

// MarshalBinary encodes the program (8 bytes an instruction, little endian), so that it can
// be compiled once and handed to the processes that load it.
func (p *SeccompProgram) MarshalBinary() ([]byte, error) {
	out := make([]byte, 0, 8*len(p.filter))
	for _, f := range p.filter {
		out = binary.LittleEndian.AppendUint16(out, f.Code)
		out = append(out, f.Jt, f.Jf)
		out = binary.LittleEndian.AppendUint32(out, f.K)
	}
	return out, nil
}

// UnmarshalBinary decodes what MarshalBinary encoded.
func (p *SeccompProgram) UnmarshalBinary(b []byte) error {
	if len(b) == 0 || len(b)%8 != 0 || len(b)/8 > 0xffff {
		return fmt.Errorf("platform: a seccomp program of %d bytes is malformed", len(b))
	}
	p.filter = make([]unix.SockFilter, len(b)/8)
	for i := range p.filter {
		r := b[8*i:]
		p.filter[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(r), Jt: r[2], Jf: r[3], K: binary.LittleEndian.Uint32(r[4:])}
	}
	return nil
}

// Len returns the number of BPF instructions.
func (p *SeccompProgram) Len() int { return len(p.filter) }

// LoadThread installs the filter on the calling thread (no TSYNC: the caller holds
// runtime.LockOSThread and execs next, so the exec'd program and everything it forks inherit
// it). The kernel requires no_new_privs or CAP_SYS_ADMIN first; SetNoNewPrivs provides it.
func (p *SeccompProgram) LoadThread() error {
	if len(p.filter) == 0 {
		return fmt.Errorf("platform: empty seccomp program")
	}
	fprog := unix.SockFprog{Len: uint16(len(p.filter)), Filter: &p.filter[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("platform: seccomp(SET_MODE_FILTER): %w", errno)
	}
	return nil
}

// LoadProcess installs the filter on every thread of the process (SECCOMP_FILTER_FLAG_TSYNC).
// The calling thread must have no_new_privs set first (SetNoNewPrivs); the kernel then sets
// it on every thread it synchronises as well (seccomp_sync_threads), so no other thread needs
// a change of its own (each would be a stop-the-world of the Go runtime).
func (p *SeccompProgram) LoadProcess() error {
	if len(p.filter) == 0 {
		return fmt.Errorf("platform: empty seccomp program")
	}
	fprog := unix.SockFprog{Len: uint16(len(p.filter)), Filter: &p.filter[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("platform: seccomp(SET_MODE_FILTER, TSYNC): %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("platform: seccomp TSYNC failed on thread %d", r)
	}
	return nil
}
