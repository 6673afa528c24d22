//go:build linux

package platform

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestSeccompProgramRoundTrip(t *testing.T) {
	t.Parallel()
	// A program that reaches every field's full width: the binary form must keep each bit.
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0xfe, Jf: 0x01, K: 0xc000003e},
		{Code: 0xffff, Jt: 0xff, Jf: 0xff, K: 0xffffffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	p, err := NewSeccompProgram(filter)
	if err != nil {
		t.Fatal(err)
	}
	filter[0].K = 99 // the program holds its own copy
	b, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 8*len(filter) {
		t.Fatalf("%d bytes for %d instructions", len(b), len(filter))
	}
	var q SeccompProgram
	if err := q.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	want := p.Filter()
	if want[0].K != 4 {
		t.Fatalf("the program shares its caller's slice: K %d", want[0].K)
	}
	got := q.Filter()
	if len(got) != len(want) || q.Len() != len(want) {
		t.Fatalf("%d instructions after the round trip, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("instruction %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, bad := range [][]byte{nil, make([]byte, 7)} {
		if err := q.UnmarshalBinary(bad); err == nil {
			t.Errorf("UnmarshalBinary(%d bytes) succeeded", len(bad))
		}
	}
}

func TestNewSeccompProgramRefusesBadLengths(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, unix.BPF_MAXINSNS + 1} {
		if _, err := NewSeccompProgram(make([]unix.SockFilter, n)); err == nil {
			t.Errorf("NewSeccompProgram(%d instructions) succeeded", n)
		}
	}
	if _, err := NewSeccompProgram(make([]unix.SockFilter, unix.BPF_MAXINSNS)); err != nil {
		t.Errorf("NewSeccompProgram(%d instructions): %v", unix.BPF_MAXINSNS, err)
	}
}
