//go:build linux

package seccomp

import (
	"encoding/binary"
	"runtime"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/platform"
)

// runFilter runs prog on a system call in x/net/bpf's virtual machine. The machine reads
// big-endian words where the kernel reads native ones, so each 32-bit word of seccomp_data is
// laid out big-endian for it.
func runFilter(t *testing.T, prog *platform.SeccompProgram, arch uint32, nr uint32, args [6]uint64) uint32 {
	t.Helper()
	insns := make([]bpf.Instruction, prog.Len())
	for i, f := range prog.Filter() {
		insns[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}.Disassemble()
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatalf("the filter is not valid BPF: %v", err)
	}
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
