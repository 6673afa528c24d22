//go:build linux

package shim

import "testing"

func TestSeccompProgramRefusesNone(t *testing.T) {
	t.Parallel()
	// The sandbox side cannot compile a filter, and a sandbox must never run without one.
	for _, b := range [][]byte{nil, {}} {
		if p, err := seccompProgram(b); err == nil {
			t.Errorf("seccompProgram(%v) = a program of %d instructions, want an error", b, p.Len())
		}
	}
	if _, err := seccompProgram(make([]byte, 7)); err == nil {
		t.Error("seccompProgram(7 bytes) succeeded")
	}
	p, err := seccompProgram(make([]byte, 16))
	if err != nil || p.Len() != 2 {
		t.Fatalf("seccompProgram(16 bytes) = %v, %v; want 2 instructions", p, err)
	}
}
