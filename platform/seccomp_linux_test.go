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
