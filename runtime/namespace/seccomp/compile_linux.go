//go:build linux

package seccomp

//go:generate go run gen.go

import (
	"fmt"
	"runtime"
	"slices"
	"sort"

	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
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

// DefaultWithClone3 is [Default] with clone3 allowed, for sandboxes on cgroup v2: there the
// agent starts every workload into the workloads' cgroup with clone3's CLONE_INTO_CGROUP,
// and the agent runs under the same filter as its workloads (the init loads it on every
// thread before the agent runs). Docker's profile answers clone3 with ENOSYS (so that libc
// falls back to clone) without CAP_SYS_ADMIN, because a filter cannot read clone3's flags,
// which lie in memory, as it reads clone's. What that rule on clone keeps a workload from
// doing stays refused by the kernel itself: a namespace other than a user namespace needs
// CAP_SYS_ADMIN, which no process of a sandbox keeps; a user namespace is refused by the
// sandbox's max_user_namespaces of 0; CLONE_INTO_CGROUP needs write access to the
// destination's cgroup.procs, and the only cgroup.procs files of the sandbox's root are the
// workloads' and their parent's, which holds no process (platform.Cgroup.SplitV2).
func DefaultWithClone3(caps []string) (*platform.SeccompProgram, error) {
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: caps, Effective: caps, Permitted: caps,
	}}}
	prof, err := mobyseccomp.GetDefaultProfile(spec)
	if err != nil {
		return nil, fmt.Errorf("seccomp: build the default profile: %w", err)
	}
	return Compile(allowClone3(prof))
}

// allowClone3 takes clone3 out of the profile's rules that refuse it, and allows it.
func allowClone3(prof *specs.LinuxSeccomp) *specs.LinuxSeccomp {
	out := *prof
	out.Syscalls = nil
	for _, sc := range prof.Syscalls {
		if sc.Action != specs.ActAllow && slices.Contains(sc.Names, "clone3") {
			sc.Names = slices.DeleteFunc(slices.Clone(sc.Names), func(n string) bool { return n == "clone3" })
			if len(sc.Names) == 0 {
				continue
			}
		}
		out.Syscalls = append(out.Syscalls, sc)
	}
	out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActAllow})
	return &out
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
	bpfJa     = unix.BPF_JMP | unix.BPF_JA
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

// rule is one rule of a profile as it applies to one system call: its argument conditions
// (all must hold) and its return.
type rule struct {
	conds [][]insn
	ret   uint32
}

// Compile turns an OCI seccomp profile into classic BPF for the native architecture: a check
// of the architecture, then a binary search of the system call number, then for the number
// found its rules in the profile's order, each its argument conditions (all must hold) and
// its action, and the default action after its last rule (or at once for a number no rule
// names). Names this architecture lacks are skipped.
//
// Why a search and not one test per name in the profile's order (the first form): the kernel
// works out, when the filter is installed, which system calls it always allows, by running it
// for every number of the architecture (seccomp_cache_prepare); with Docker's profile in 876
// instructions, a test per name made that walk some 450 instructions per number, over a
// millisecond of every sandbox's start (go test ./runtime/namespace/seccomp -bench
// LoadDefault), and every call the cache does not answer walked it as well. The search
// over the default set's 66 runs of numbers treated alike runs at most 19.
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
	rules, err := rulesByNumber(prof, defErrno)
	if err != nil {
		return nil, err
	}
	var a assembler
	// Another architecture's calling convention (i386 or x32 on x86-64, arm on arm64) would
	// bypass every rule by number: it gets the default action.
	a.emit(bpfLdAbsW, 0, 0, dataArchOff)
	a.emit(bpfJeqK, 1, 0, audit)
	a.emit(bpfRetK, 0, 0, def)
	a.emit(bpfLdAbsW, 0, 0, dataNrOff)
	if runtime.GOARCH == "amd64" {
		a.emit(bpfJgeK, 0, 1, x32SyscallBit)
		a.emit(bpfRetK, 0, 0, unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS))
	}
	nrs := make([]uint32, 0, len(rules))
	for nr := range rules {
		nrs = append(nrs, nr)
	}
	sort.Slice(nrs, func(i, j int) bool { return nrs[i] < nrs[j] })
	// The search leaves rules with conditions to code after it, reached by a jump.
	chains := map[uint32]label{}
	for _, nr := range nrs {
		if len(rules[nr][0].conds) > 0 {
			chains[nr] = a.newLabel()
		}
	}
	a.search(segments(nrs, rules, chains, def))
	for _, nr := range nrs {
		l, ok := chains[nr]
		if !ok {
			continue
		}
		a.place(l)
		if err := a.chain(rules[nr], def); err != nil {
			return nil, fmt.Errorf("seccomp: the rules of system call %d: %w", nr, err)
		}
	}
	out, err := a.resolve()
	if err != nil {
		return nil, err
	}
	if len(out) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: a program of %d instructions exceeds the kernel's %d", len(out), unix.BPF_MAXINSNS)
	}
	return platform.NewSeccompProgram(out)
}

// rulesByNumber lists the profile's rules by the system call number they name, each
// number's in the profile's order; a rule without conditions ends its numbers' lists, since
// no rule after it can be reached.
func rulesByNumber(prof *specs.LinuxSeccomp, defErrno uint) (map[uint32][]rule, error) {
	out := map[uint32][]rule{}
	for _, r := range prof.Syscalls {
		ret, err := actionRet(r.Action, r.ErrnoRet, defErrno)
		if err != nil {
			return nil, err
		}
		var conds [][]insn
		for _, a := range r.Args {
			c, err := argCondition(a)
			if err != nil {
				return nil, err
			}
			conds = append(conds, c)
		}
		for _, name := range r.Names {
			nr, ok := syscallNumber(name)
			if !ok {
				continue // another architecture's system call (e.g. chown32)
			}
			if prev := out[nr]; len(prev) > 0 && len(prev[len(prev)-1].conds) == 0 {
				continue // an earlier rule always decides this call
			}
			out[nr] = append(out[nr], rule{conds: conds, ret: ret})
		}
	}
	return out, nil
}

// A segment is a run of system call numbers, from first up to the next segment's first,
// that the filter treats alike: each returns ret, or, when chain is set, goes to its rules'
// code there (a segment of one number, then).
type segment struct {
	first    uint32
	ret      uint32
	chain    label
	hasChain bool
}

// segments splits all system call numbers into runs the filter treats alike, in order, the
// first from 0: numbers no rule names get def, numbers whose first rule has no condition get
// its return (neighbours with the same return, the default's included, make one run), and a
// number with conditions is a run of its own that goes to chains[nr].
func segments(nrs []uint32, rules map[uint32][]rule, chains map[uint32]label, def uint32) []segment {
	out := []segment{{first: 0, ret: def}}
	add := func(s segment) {
		if out[len(out)-1].first == s.first {
			out = out[:len(out)-1] // a run of no number: the default between two neighbours
		}
		if n := len(out); n > 0 && !s.hasChain && !out[n-1].hasChain && s.ret == out[n-1].ret {
			return // the same treatment: the run goes on
		}
		out = append(out, s)
	}
	for _, nr := range nrs {
		if l, ok := chains[nr]; ok {
			add(segment{first: nr, chain: l, hasChain: true})
		} else {
			add(segment{first: nr, ret: rules[nr][0].ret})
		}
		if nr < ^uint32(0) {
			add(segment{first: nr + 1, ret: def})
		}
	}
	return out
}

// search lays out the binary search of the system call number (in A) over segs: where the
// number's segment starts, its return, or a jump to its rules' code. Every conditional jump
// skips at most one instruction, an unconditional jump (whose offset has 32 bits) bridging
// longer distances, so no layout can outgrow the 8-bit offsets of a conditional jump.
func (a *assembler) search(segs []segment) {
	if len(segs) == 1 {
		if segs[0].hasChain {
			a.jump(segs[0].chain)
		} else {
			a.emit(bpfRetK, 0, 0, segs[0].ret)
		}
		return
	}
	mid := len(segs) / 2
	upper := a.newLabel()
	a.emit(bpfJgeK, 0, 1, segs[mid].first)
	a.jump(upper)
	a.search(segs[:mid])
	a.place(upper)
	a.search(segs[mid:])
}

// chain lays out one number's rules in order: each rule's conditions and return, a failed
// condition going on to the next rule, and def after the last.
func (a *assembler) chain(rules []rule, def uint32) error {
	for _, r := range rules {
		retAt := 0 // the conditions' length
		for _, c := range r.conds {
			retAt += len(c)
		}
		failAt := retAt + 1 // the next rule's first instruction
		if failAt > 255 {
			return fmt.Errorf("a rule of %d instructions is too long", failAt)
		}
		pos := 0
		for ci, c := range r.conds {
			next := pos + len(c)
			if ci == len(r.conds)-1 {
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
				a.emit(in.code, resolve(in.jt), resolve(in.jf), in.k)
			}
			pos += len(c)
		}
		a.emit(bpfRetK, 0, 0, r.ret)
		if len(r.conds) == 0 {
			return nil // rulesByNumber ended the list here
		}
	}
	a.emit(bpfRetK, 0, 0, def)
	return nil
}

// A label is a place in a program being assembled, known before its position is.
type label int

// assembler lays out a program whose unconditional jumps name labels.
type assembler struct {
	out   []unix.SockFilter
	at    []int // each label's position, -1 until placed
	jumps []int // positions of the jumps, whose K holds their label until resolve
}

func (a *assembler) emit(code uint16, jt, jf uint8, k uint32) {
	a.out = append(a.out, unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k})
}

func (a *assembler) newLabel() label {
	a.at = append(a.at, -1)
	return label(len(a.at) - 1)
}

func (a *assembler) place(l label) { a.at[l] = len(a.out) }

// jump lays out an unconditional jump to l, which must come later.
func (a *assembler) jump(l label) {
	a.jumps = append(a.jumps, len(a.out))
	a.emit(bpfJa, 0, 0, uint32(l))
}

// resolve turns the jumps' labels into offsets and returns the program.
func (a *assembler) resolve() ([]unix.SockFilter, error) {
	for _, j := range a.jumps {
		to := a.at[a.out[j].K]
		if to <= j {
			return nil, fmt.Errorf("seccomp: a jump at %d to an unplaced or earlier label", j)
		}
		a.out[j].K = uint32(to - j - 1)
	}
	return a.out, nil
}
