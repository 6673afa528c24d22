//go:build linux

package platform

import "testing"

func TestDefaultSeccompCompiles(t *testing.T) {
	t.Parallel()
	for _, caps := range [][]string{nil, DefaultCapabilities, {"CAP_SYS_ADMIN"}} {
		p, err := DefaultSeccomp(caps)
		if err != nil {
			t.Fatalf("caps %v: %v", caps, err)
		}
		if p.Len() < 100 {
			t.Fatalf("caps %v: only %d instructions", caps, p.Len())
		}
	}
}

func TestSeccompProgramRoundTrip(t *testing.T) {
	t.Parallel()
	p, err := DefaultSeccomp(DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var q SeccompProgram
	if err := q.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if len(q.filter) != len(p.filter) {
		t.Fatalf("%d instructions after the round trip, want %d", len(q.filter), len(p.filter))
	}
	for i := range p.filter {
		if p.filter[i] != q.filter[i] {
			t.Fatalf("instruction %d: %+v, want %+v", i, q.filter[i], p.filter[i])
		}
	}
	for _, bad := range [][]byte{nil, make([]byte, 7)} {
		if err := q.UnmarshalBinary(bad); err == nil {
			t.Errorf("UnmarshalBinary(%d bytes) succeeded", len(bad))
		}
	}
}
