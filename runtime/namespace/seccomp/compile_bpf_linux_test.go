//go:build linux

package seccomp

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
)

// filterVM loads prog into x/net/bpf's virtual machine.
func filterVM(t *testing.T, prog *platform.SeccompProgram) *bpf.VM {
	t.Helper()
	insns := make([]bpf.Instruction, prog.Len())
	for i, f := range prog.Filter() {
		insns[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}.Disassemble()
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatalf("the filter is not valid BPF: %v", err)
	}
	return vm
}

// runVM runs a filter on a system call. The machine reads big-endian words where the kernel
// reads native ones, so each 32-bit word of seccomp_data is laid out big-endian for it.
func runVM(t *testing.T, vm *bpf.VM, arch uint32, nr uint32, args [6]uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], nr)
	binary.BigEndian.PutUint32(data[4:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[16+8*i+4:], uint32(a>>32))
	}
	r, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(r)
}

// runFilter runs prog on a system call in x/net/bpf's virtual machine.
func runFilter(t *testing.T, prog *platform.SeccompProgram, arch uint32, nr uint32, args [6]uint64) uint32 {
	t.Helper()
	return runVM(t, filterVM(t, prog), arch, nr, args)
}

func nrOf(t *testing.T, name string) uint32 {
	t.Helper()
	nr, ok := syscallNumber(name)
	if !ok {
		t.Skipf("no %s on %s", name, runtime.GOARCH)
	}
	return nr
}

func TestDefaultSemantics(t *testing.T) {
	t.Parallel()
	prog, err := Default(platform.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	arch, _ := nativeArch()
	eperm := uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	cases := []struct {
		name string
		call string
		args [6]uint64
		want uint32
	}{
		{"read allowed", "read", [6]uint64{}, unix.SECCOMP_RET_ALLOW},
		{"reboot refused", "reboot", [6]uint64{}, eperm},
		{"mount refused", "mount", [6]uint64{}, eperm},
		{"plain clone allowed", "clone", [6]uint64{uint64(unix.SIGCHLD)}, unix.SECCOMP_RET_ALLOW},
		{"clone into a user namespace refused", "clone", [6]uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, eperm},
		{"clone3 says ENOSYS so libc falls back", "clone3", [6]uint64{}, unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{"personality linux allowed", "personality", [6]uint64{0}, unix.SECCOMP_RET_ALLOW},
		{"personality other refused", "personality", [6]uint64{0x12345}, eperm},
		{"keyctl refused", "keyctl", [6]uint64{}, eperm},
	}
	for _, c := range cases {
		if got := runFilter(t, prog, arch, nrOf(t, c.call), c.args); got != c.want {
			t.Errorf("%s: %#x, want %#x", c.name, got, c.want)
		}
	}
	if got := runFilter(t, prog, 0x40000003 /* i386 */, nrOf(t, "read"), [6]uint64{}); got != eperm {
		t.Errorf("a foreign architecture: %#x, want the default %#x", got, eperm)
	}
	if runtime.GOARCH == "amd64" {
		if got := runFilter(t, prog, arch, x32SyscallBit|nrOf(t, "read"), [6]uint64{}); got != unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS) {
			t.Errorf("an x32 call: %#x, want ENOSYS", got)
		}
	}
}

// For cgroup v2 the agent clones workloads into their cgroup with clone3: that program
// allows clone3 and is otherwise the default, clone's flag rules included.
func TestDefaultWithClone3(t *testing.T) {
	t.Parallel()
	prog, err := DefaultWithClone3(platform.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	arch, _ := nativeArch()
	eperm := uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	for _, c := range []struct {
		name string
		call string
		args [6]uint64
		want uint32
	}{
		{"clone3 allowed", "clone3", [6]uint64{}, unix.SECCOMP_RET_ALLOW},
		{"plain clone allowed", "clone", [6]uint64{uint64(unix.SIGCHLD)}, unix.SECCOMP_RET_ALLOW},
		{"clone into a user namespace refused", "clone", [6]uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, eperm},
		{"mount refused", "mount", [6]uint64{}, eperm},
		{"read allowed", "read", [6]uint64{}, unix.SECCOMP_RET_ALLOW},
	} {
		if got := runFilter(t, prog, arch, nrOf(t, c.call), c.args); got != c.want {
			t.Errorf("%s: %#x, want %#x", c.name, got, c.want)
		}
	}
}

func TestOperators(t *testing.T) {
	t.Parallel()
	eperm := uint(unix.EPERM)
	const big = uint64(5)<<32 | 7 // a value with both words set
	rule := func(op specs.LinuxSeccompOperator, v, v2 uint64) specs.LinuxSyscall {
		return specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 2, Value: v, ValueTwo: v2, Op: op}}}
	}
	cases := []struct {
		op     specs.LinuxSeccompOperator
		v, v2  uint64
		pass   []uint64
		refuse []uint64
	}{
		{specs.OpEqualTo, big, 0, []uint64{big}, []uint64{7, 5 << 32, big + 1}},
		{specs.OpNotEqual, big, 0, []uint64{7, 5 << 32, big + 1, 0}, []uint64{big}},
		{specs.OpGreaterThan, big, 0, []uint64{big + 1, 6 << 32}, []uint64{big, big - 1, 8, 4<<32 | 9}},
		{specs.OpGreaterEqual, big, 0, []uint64{big, big + 1, 6 << 32}, []uint64{big - 1, 4<<32 | 9}},
		{specs.OpLessThan, big, 0, []uint64{big - 1, 4<<32 | 9, 0}, []uint64{big, big + 1, 6 << 32}},
		{specs.OpLessEqual, big, 0, []uint64{big, big - 1, 8}, []uint64{big + 1, 6 << 32}},
		{specs.OpMaskedEqual, 0xff<<32 | 0xf0, 0x05<<32 | 0x10, []uint64{0x05<<32 | 0x1f, 0x105<<32 | 0x13}, []uint64{0x10, 0x05 << 32, 0x06<<32 | 0x10}},
	}
	arch, _ := nativeArch()
	read := nrOf(t, "read")
	for _, c := range cases {
		prof := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &eperm,
			Syscalls: []specs.LinuxSyscall{rule(c.op, c.v, c.v2)}}
		prog, err := Compile(prof)
		if err != nil {
			t.Fatalf("%s: %v", c.op, err)
		}
		for _, a := range c.pass {
			if got := runFilter(t, prog, arch, read, [6]uint64{0, 0, a}); got != unix.SECCOMP_RET_ALLOW {
				t.Errorf("%s %#x: arg %#x refused (%#x)", c.op, c.v, a, got)
			}
		}
		for _, a := range c.refuse {
			if got := runFilter(t, prog, arch, read, [6]uint64{0, 0, a}); got == unix.SECCOMP_RET_ALLOW {
				t.Errorf("%s %#x: arg %#x allowed", c.op, c.v, a)
			}
		}
		// Another system call never matches the rule.
		if got := runFilter(t, prog, arch, nrOf(t, "write"), [6]uint64{0, 0, c.pass[0]}); got == unix.SECCOMP_RET_ALLOW {
			t.Errorf("%s: write allowed by a rule for read", c.op)
		}
	}
}

func TestSyscallTableSorted(t *testing.T) {
	t.Parallel()
	if len(syscallTable) == 0 {
		t.Skipf("no syscall table for %s", runtime.GOARCH)
	}
	for i := 1; i < len(syscallTable); i++ {
		if syscallTable[i-1].name >= syscallTable[i].name {
			t.Fatalf("table not sorted at %q, %q", syscallTable[i-1].name, syscallTable[i].name)
		}
	}
	if nr, ok := syscallNumber("read"); !ok || (runtime.GOARCH == "amd64" && nr != unix.SYS_READ) {
		t.Fatalf("read = %d, %v", nr, ok)
	}
}

// profileVerdict is what prof says of a native call nr with args, read straight from the
// profile: the first rule, in order, that names the call and whose conditions all hold.
func profileVerdict(t *testing.T, prof *specs.LinuxSeccomp, nr uint32, args [6]uint64) uint32 {
	t.Helper()
	defErrno := uint(unix.EPERM)
	if prof.DefaultErrnoRet != nil {
		defErrno = *prof.DefaultErrnoRet
	}
	for _, r := range prof.Syscalls {
		named := false
		for _, name := range r.Names {
			if n, ok := syscallNumber(name); ok && n == nr {
				named = true
			}
		}
		holds := named
		for _, a := range r.Args {
			v := args[a.Index]
			switch a.Op {
			case specs.OpEqualTo:
				holds = holds && v == a.Value
			case specs.OpNotEqual:
				holds = holds && v != a.Value
			case specs.OpGreaterThan:
				holds = holds && v > a.Value
			case specs.OpGreaterEqual:
				holds = holds && v >= a.Value
			case specs.OpLessThan:
				holds = holds && v < a.Value
			case specs.OpLessEqual:
				holds = holds && v <= a.Value
			case specs.OpMaskedEqual:
				holds = holds && v&a.Value == a.ValueTwo
			default:
				t.Fatalf("operator %q", a.Op)
			}
		}
		if holds {
			ret, err := actionRet(r.Action, r.ErrnoRet, defErrno)
			if err != nil {
				t.Fatal(err)
			}
			return ret
		}
	}
	ret, err := actionRet(prof.DefaultAction, nil, defErrno)
	if err != nil {
		t.Fatal(err)
	}
	return ret
}

// argCases are argument vectors that sit on and beside every value prof's conditions test,
// with zeros besides.
func argCases(prof *specs.LinuxSeccomp) [][6]uint64 {
	out := [][6]uint64{{}}
	for _, r := range prof.Syscalls {
		for _, a := range r.Args {
			for _, v := range []uint64{a.Value, a.Value + 1, a.Value - 1, a.ValueTwo, a.ValueTwo | ^a.Value, a.Value<<32 | a.Value} {
				var args [6]uint64
				args[a.Index] = v
				out = append(out, args)
			}
		}
	}
	return out
}

// checkAgainstProfile runs prog for every native system call number up to beyond the table's
// last, with argCases, and wants what the profile says.
func checkAgainstProfile(t *testing.T, what string, prof *specs.LinuxSeccomp, prog *platform.SeccompProgram) {
	t.Helper()
	arch, _ := nativeArch()
	var maxNr uint32
	for _, e := range syscallTable {
		maxNr = max(maxNr, e.nr)
	}
	cases := argCases(prof)
	// A call that no rule with conditions names is tried with a few of the vectors only.
	conditional := map[uint32]bool{}
	for _, r := range prof.Syscalls {
		for _, name := range r.Names {
			if nr, ok := syscallNumber(name); ok && len(r.Args) > 0 {
				conditional[nr] = true
			}
		}
	}
	vm := filterVM(t, prog)
	bad := 0
	for nr := uint32(0); nr <= maxNr+64; nr++ {
		tried := cases
		if !conditional[nr] {
			tried = cases[:min(len(cases), 4)]
		}
		for _, args := range tried {
			want := profileVerdict(t, prof, nr, args)
			if got := runVM(t, vm, arch, nr, args); got != want && bad < 10 {
				bad++
				t.Errorf("%s: call %d with %#x: %#x, the profile says %#x", what, nr, args, got, want)
			}
		}
	}
}

// The compiled default profile decides every call as the profile reads, for each set of
// capabilities that changes its rules.
func TestDefaultAgreesWithTheProfile(t *testing.T) {
	t.Parallel()
	if len(syscallTable) == 0 {
		t.Skipf("no syscall table for %s", runtime.GOARCH)
	}
	for _, caps := range [][]string{nil, platform.DefaultCapabilities, {"CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_BOOT"}} {
		spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}}}
		prof, err := mobyseccomp.GetDefaultProfile(spec)
		if err != nil {
			t.Fatal(err)
		}
		prog, err := Compile(prof)
		if err != nil {
			t.Fatal(err)
		}
		checkAgainstProfile(t, fmt.Sprintf("caps %v", caps), prof, prog)
	}
}

// Random profiles, whose rules name neighbouring calls with the same, different and
// conditional actions, the default's included, compile to filters that agree with them.
func TestRandomProfilesAgree(t *testing.T) {
	t.Parallel()
	if len(syscallTable) == 0 {
		t.Skipf("no syscall table for %s", runtime.GOARCH)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	// Names of the lowest numbers, so that rules name neighbours often.
	var names []string
	for _, e := range syscallTable {
		if e.nr < 40 {
			names = append(names, e.name)
		}
	}
	eperm, enosys := uint(unix.EPERM), uint(unix.ENOSYS)
	actions := []struct {
		act   specs.LinuxSeccompAction
		errno *uint
	}{{specs.ActAllow, nil}, {specs.ActErrno, nil}, {specs.ActErrno, &enosys}, {specs.ActKillProcess, nil}, {specs.ActLog, nil}}
	ops := []specs.LinuxSeccompOperator{specs.OpEqualTo, specs.OpNotEqual, specs.OpGreaterThan, specs.OpGreaterEqual, specs.OpLessThan, specs.OpLessEqual, specs.OpMaskedEqual}
	for round := range 40 {
		def := actions[rng.IntN(len(actions))]
		prof := &specs.LinuxSeccomp{DefaultAction: def.act, DefaultErrnoRet: &eperm}
		if def.act != specs.ActErrno {
			prof.DefaultErrnoRet = nil
		}
		for range 1 + rng.IntN(12) {
			a := actions[rng.IntN(len(actions))]
			r := specs.LinuxSyscall{Action: a.act, ErrnoRet: a.errno}
			for range 1 + rng.IntN(8) {
				r.Names = append(r.Names, names[rng.IntN(len(names))])
			}
			for range rng.IntN(3) {
				r.Args = append(r.Args, specs.LinuxSeccompArg{Index: uint(rng.IntN(6)), Op: ops[rng.IntN(len(ops))],
					Value: rng.Uint64() >> rng.IntN(64), ValueTwo: rng.Uint64() >> rng.IntN(64)})
			}
			prof.Syscalls = append(prof.Syscalls, r)
		}
		prog, err := Compile(prof)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		checkAgainstProfile(t, fmt.Sprintf("round %d", round), prof, prog)
	}
}
