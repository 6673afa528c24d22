//go:build linux

package platform

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	bpfseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// SeccompProgram is a compiled seccomp BPF filter.
type SeccompProgram struct {
	filter []unix.SockFilter
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

// DefaultSeccomp compiles Docker's default seccomp profile (github.com/moby/profiles/seccomp,
// maintained against new kernels and syscalls) for the native architecture, as it applies to
// a process whose bounding set is caps: rules that Docker enables only for some capabilities
// follow those capabilities. Syscalls the profile allows but this architecture lacks are
// skipped; everything else fails with the profile's errno (EPERM), as in Docker.
func DefaultSeccomp(caps []string) (*SeccompProgram, error) {
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: caps, Effective: caps, Permitted: caps,
	}}}
	prof, err := mobyseccomp.GetDefaultProfile(spec)
	if err != nil {
		return nil, fmt.Errorf("platform: build the default seccomp profile: %w", err)
	}
	return compileSeccomp(prof)
}

func seccompAction(a specs.LinuxSeccompAction, errnoRet *uint, defErrno uint) (bpfseccomp.Action, error) {
	switch a {
	case specs.ActAllow:
		return bpfseccomp.ActionAllow, nil
	case specs.ActErrno:
		e := defErrno
		if errnoRet != nil {
			e = *errnoRet
		}
		if e == 0 || e > 0xffff {
			return 0, fmt.Errorf("platform: seccomp errno %d out of range", e)
		}
		return bpfseccomp.ActionErrno | bpfseccomp.Action(e), nil
	case specs.ActKillProcess:
		return bpfseccomp.ActionKillProcess, nil
	case specs.ActKill, specs.ActKillThread:
		return bpfseccomp.ActionKillThread, nil
	case specs.ActTrap:
		return bpfseccomp.ActionTrap, nil
	case specs.ActLog:
		return bpfseccomp.ActionLog, nil
	}
	return 0, fmt.Errorf("platform: unsupported seccomp action %q", a)
}

func seccompCondition(a specs.LinuxSeccompArg) (bpfseccomp.Condition, error) {
	c := bpfseccomp.Condition{Argument: uint32(a.Index), Value: a.Value}
	switch a.Op {
	case specs.OpEqualTo:
		c.Operation = bpfseccomp.Equal
	case specs.OpNotEqual:
		c.Operation = bpfseccomp.NotEqual
	case specs.OpLessThan:
		c.Operation = bpfseccomp.LessThan
	case specs.OpLessEqual:
		c.Operation = bpfseccomp.LessOrEqual
	case specs.OpGreaterThan:
		c.Operation = bpfseccomp.GreaterThan
	case specs.OpGreaterEqual:
		c.Operation = bpfseccomp.GreaterOrEqual
	case specs.OpMaskedEqual:
		// (arg & Value) == ValueTwo: with ValueTwo 0 this is "none of Value's bits set", which
		// is how the default profile uses it (clone's namespace flags).
		if a.ValueTwo != 0 {
			return c, fmt.Errorf("platform: seccomp masked-equal with a non-zero value is not supported")
		}
		c.Operation = bpfseccomp.BitsNotSet
	default:
		return c, fmt.Errorf("platform: unsupported seccomp operator %q", a.Op)
	}
	return c, nil
}

// compileSeccomp turns an OCI seccomp profile into BPF for the native architecture.
func compileSeccomp(prof *specs.LinuxSeccomp) (*SeccompProgram, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, err
	}
	var defErrno uint = uint(unix.EPERM)
	if prof.DefaultErrnoRet != nil {
		defErrno = *prof.DefaultErrnoRet
	}
	def, err := seccompAction(prof.DefaultAction, nil, defErrno)
	if err != nil {
		return nil, err
	}
	// The library validates the default action against its plain names and adds EPERM to a
	// plain errno action itself, so an EPERM default must be spelled as the plain action.
	if def == bpfseccomp.ActionErrno|bpfseccomp.Action(unix.EPERM) {
		def = bpfseccomp.ActionErrno
	} else if def&0xffff0000 == bpfseccomp.ActionErrno {
		return nil, fmt.Errorf("platform: a default seccomp errno other than EPERM is not supported")
	}
	policy := bpfseccomp.Policy{DefaultAction: def}
	for _, sc := range prof.Syscalls {
		act, err := seccompAction(sc.Action, sc.ErrnoRet, defErrno)
		if err != nil {
			return nil, err
		}
		group := bpfseccomp.SyscallGroup{Action: act}
		var conds bpfseccomp.ArgumentConditions
		for _, a := range sc.Args {
			c, err := seccompCondition(a)
			if err != nil {
				return nil, err
			}
			conds = append(conds, c)
		}
		for _, name := range sc.Names {
			if _, ok := info.SyscallNames[name]; !ok {
				continue // another architecture's syscall (e.g. chown32)
			}
			if len(conds) == 0 {
				group.Names = append(group.Names, name)
			} else {
				group.NamesWithCondtions = append(group.NamesWithCondtions, bpfseccomp.NameWithConditions{Name: name, Conditions: conds})
			}
		}
		if len(group.Names)+len(group.NamesWithCondtions) > 0 {
			policy.Syscalls = append(policy.Syscalls, group)
		}
	}
	insts, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("platform: assemble seccomp policy: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("platform: assemble seccomp BPF: %w", err)
	}
	prog := &SeccompProgram{filter: make([]unix.SockFilter, len(raw))}
	for i, r := range raw {
		prog.filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return prog, nil
}

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
// Every thread must have no_new_privs set first (SetProcessNoNewPrivs).
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
