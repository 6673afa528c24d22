//go:build linux

package seccomp

import (
	"testing"

	"github.com/bothy/bothy/platform"
)

func TestDefaultCompiles(t *testing.T) {
	t.Parallel()
	for _, caps := range [][]string{nil, platform.DefaultCapabilities, {"CAP_SYS_ADMIN"}} {
		p, err := Default(caps)
		if err != nil {
			t.Fatalf("caps %v: %v", caps, err)
		}
		if p.Len() < 100 {
			t.Fatalf("caps %v: only %d instructions", caps, p.Len())
		}
	}
}

func TestDefaultRoundTrip(t *testing.T) {
	t.Parallel()
	p, err := Default(platform.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var q platform.SeccompProgram
	if err := q.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	pf, qf := p.Filter(), q.Filter()
	if len(qf) != len(pf) {
		t.Fatalf("%d instructions after the round trip, want %d", len(qf), len(pf))
	}
	for i := range pf {
		if pf[i] != qf[i] {
			t.Fatalf("instruction %d: %+v, want %+v", i, qf[i], pf[i])
		}
	}
	for _, bad := range [][]byte{nil, make([]byte, 7)} {
		if err := q.UnmarshalBinary(bad); err == nil {
			t.Errorf("UnmarshalBinary(%d bytes) succeeded", len(bad))
		}
	}
}
