//go:build linux

package seccomp

//go:generate go run gen.go

import (
	"fmt"
	"runtime"
	"sort"

	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/platform"
)

// Default compiles Docker's default seccomp profile (github.com/moby/profiles/seccomp,
// maintained against new kernels and syscalls) for the native architecture, as it applies to
// a process whose bounding set is caps: rules that Docker enables only for some capabilities
// follow those capabilities. Syscalls the profile allows but this architecture lacks are
// skipped; everything else fails with the profile's errno (EPERM), as in Docker.
func Default(caps []string) (*platform.SeccompProgram, error) {
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: caps, Effective: caps, Permitted: caps,
	}}}
	prof, err := mobyseccomp.GetDefaultProfile(spec)
	if err != nil {
		return nil, fmt.Errorf("seccomp: build the default profile: %w", err)
	}
	return Compile(prof)
}

// syscallEntry is one entry of the generated syscall tables.
type syscallEntry struct {
	name string
	nr   uint32
}

// syscallNumber looks name up in this architecture's table.
func syscallNumber(name string) (uint32, bool) {
	i := sort.Search(len(syscallTable), func(i int) bool { return syscallTable[i].name >= name })
	if i < len(syscallTable) && syscallTable[i].name == name {
		return syscallTable[i].nr, true
	}
	return 0, false
}

// BPF opcodes of classic BPF, as seccomp uses them.
const (
	bpfLdAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJgtK   = unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K
	bpfJgeK   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	bpfAndK   = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	bpfRetK   = unix.BPF_RET | unix.BPF_K
)

// Offsets in struct seccomp_data.
const (
	dataNrOff   = 0
	dataArchOff = 4
	dataArgsOff = 16
)

// x32SyscallBit marks the x32 ABI's system calls on x86-64.
const x32SyscallBit = 0x40000000

func nativeArch() (uint32, error) {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64, nil
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64, nil
	}
	return 0, fmt.Errorf("seccomp: no system call table for %s", runtime.GOARCH)
}

func actionRet(a specs.LinuxSeccompAction, errnoRet *uint, defErrno uint) (uint32, error) {
	switch a {
	case specs.ActAllow:
		return unix.SECCOMP_RET_ALLOW, nil
	case specs.ActErrno:
		e := defErrno
		if errnoRet != nil {
			e = *errnoRet
		}
		if e == 0 || e > unix.SECCOMP_RET_DATA {
			return 0, fmt.Errorf("seccomp: errno %d out of range", e)
		}
		return unix.SECCOMP_RET_ERRNO | uint32(e), nil
	case specs.ActKillProcess:
		return unix.SECCOMP_RET_KILL_PROCESS, nil
	case specs.ActKill, specs.ActKillThread:
		return unix.SECCOMP_RET_KILL_THREAD, nil
	case specs.ActTrap:
		return unix.SECCOMP_RET_TRAP, nil
	case specs.ActLog:
		return unix.SECCOMP_RET_LOG, nil
	}
	return 0, fmt.Errorf("seccomp: unsupported action %q", a)
}

// Jump targets of a condition, resolved when its rule is laid out.
const (
	toNext = -1 // the next condition (or the rule's return)
	toFail = -2 // the rule does not match: on to the next rule
)

// insn is an instruction whose jump targets may still be symbolic.
type insn struct {
	code   uint16
	jt, jf int // toNext, toFail, or 0 (fall through)
	k      uint32
}

// argCondition compiles "argument a.Index op a.Value" on 64-bit arguments split into two 32-bit
// words (little endian: the low word first).
func argCondition(a specs.LinuxSeccompArg) ([]insn, error) {
	if a.Index > 5 {
		return nil, fmt.Errorf("seccomp: argument index %d out of range", a.Index)
	}
	lo := uint32(dataArgsOff + 8*a.Index)
	hi := lo + 4
	vlo, vhi := uint32(a.Value), uint32(a.Value>>32)
	ld := func(off uint32) insn { return insn{code: bpfLdAbsW, k: off} }
	switch a.Op {
	case specs.OpEqualTo:
		return []insn{ld(hi), {code: bpfJeqK, k: vhi, jf: toFail}, ld(lo), {code: bpfJeqK, k: vlo, jf: toFail}}, nil
	case specs.OpNotEqual:
		// Different if either word differs: a differing high word passes at once (skipping
		// the low word's load and test).
		return []insn{ld(hi), {code: bpfJeqK, k: vhi, jf: 2}, ld(lo), {code: bpfJeqK, k: vlo, jt: toFail}}, nil
	case specs.OpMaskedEqual:
		mlo, mhi := uint32(a.Value), uint32(a.Value>>32)
		wlo, whi := uint32(a.ValueTwo), uint32(a.ValueTwo>>32)
		return []insn{ld(hi), {code: bpfAndK, k: mhi}, {code: bpfJeqK, k: whi, jf: toFail},
			ld(lo), {code: bpfAndK, k: mlo}, {code: bpfJeqK, k: wlo, jf: toFail}}, nil
	case specs.OpGreaterThan, specs.OpGreaterEqual:
		last := uint16(bpfJgtK)
		if a.Op == specs.OpGreaterEqual {
			last = bpfJgeK
		}
		// hi > vhi passes; hi < vhi fails; equal high words compare the low words.
		return []insn{ld(hi), {code: bpfJgtK, k: vhi, jt: 3}, {code: bpfJeqK, k: vhi, jf: toFail},
			ld(lo), {code: last, k: vlo, jf: toFail}}, nil
	case specs.OpLessThan, specs.OpLessEqual:
		last := uint16(bpfJgeK)
		if a.Op == specs.OpLessEqual {
			last = bpfJgtK
		}
		return []insn{ld(hi), {code: bpfJgtK, k: vhi, jt: toFail}, {code: bpfJeqK, k: vhi, jf: 2},
			ld(lo), {code: last, k: vlo, jt: toFail}}, nil
	}
	return nil, fmt.Errorf("seccomp: unsupported operator %q", a.Op)
}

// Compile turns an OCI seccomp profile into classic BPF for the native architecture: a check
// of the architecture, then, rule by rule in the profile's order, one test of the system call
// number per name, the rule's argument conditions (all must hold), and its action; the
// default action last. Names this architecture lacks are skipped.
func Compile(prof *specs.LinuxSeccomp) (*platform.SeccompProgram, error) {
	audit, err := nativeArch()
	if err != nil {
		return nil, err
	}
	defErrno := uint(unix.EPERM)
	if prof.DefaultErrnoRet != nil {
		defErrno = *prof.DefaultErrnoRet
	}
	def, err := actionRet(prof.DefaultAction, nil, defErrno)
	if err != nil {
		return nil, err
	}
	var out []unix.SockFilter
	emit := func(code uint16, jt, jf uint8, k uint32) {
		out = append(out, unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k})
	}
	// Another architecture's calling convention (i386 or x32 on x86-64, arm on arm64) would
	// bypass every rule by number: it gets the default action.
	emit(bpfLdAbsW, 0, 0, dataArchOff)
	emit(bpfJeqK, 1, 0, audit)
	emit(bpfRetK, 0, 0, def)
	emit(bpfLdAbsW, 0, 0, dataNrOff)
	if runtime.GOARCH == "amd64" {
		emit(bpfJgeK, 0, 1, x32SyscallBit)
		emit(bpfRetK, 0, 0, unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS))
	}
	for _, rule := range prof.Syscalls {
		ret, err := actionRet(rule.Action, rule.ErrnoRet, defErrno)
		if err != nil {
			return nil, err
		}
		var conds [][]insn
		for _, a := range rule.Args {
			c, err := argCondition(a)
			if err != nil {
				return nil, err
			}
			conds = append(conds, c)
		}
		for _, name := range rule.Names {
			nr, ok := syscallNumber(name)
			if !ok {
				continue // another architecture's system call (e.g. chown32)
			}
			if len(conds) == 0 {
				emit(bpfJeqK, 0, 1, nr)
				emit(bpfRetK, 0, 0, ret)
				continue
			}
			// body: the conditions, the return, then a reload of the number that a failed
			// condition lands on (the conditions load arguments into A).
			var body []insn
			for _, c := range conds {
				body = append(body, c...)
			}
			retAt := len(body)
			failAt := retAt + 1
			if failAt > 255 {
				return nil, fmt.Errorf("seccomp: rule for %s is too long", name)
			}
			emit(bpfJeqK, 0, uint8(failAt+1), nr)
			pos := 0
			for ci, c := range conds {
				next := pos + len(c)
				if ci == len(conds)-1 {
					next = retAt
				}
				for j, in := range c {
					at := pos + j
					resolve := func(t int) uint8 {
						switch t {
						case toNext:
							return uint8(next - at - 1)
						case toFail:
							return uint8(failAt - at - 1)
						}
						return uint8(t)
					}
					emit(in.code, resolve(in.jt), resolve(in.jf), in.k)
				}
				pos += len(c)
			}
			emit(bpfRetK, 0, 0, ret)
			emit(bpfLdAbsW, 0, 0, dataNrOff)
		}
	}
	emit(bpfRetK, 0, 0, def)
	if len(out) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: a program of %d instructions exceeds the kernel's %d", len(out), unix.BPF_MAXINSNS)
	}
	return platform.NewSeccompProgram(out)
}
