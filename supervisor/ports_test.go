package supervisor

import (
	"errors"
	"testing"

	"github.com/bothy/bothy/errcode"
)

// TestPortConnsBounds: a sandbox gets no more than its share, all sandboxes together no more
// than the total, and a release makes room again.
func TestPortConnsBounds(t *testing.T) {
	t.Parallel()
	p := portConns{limits: PortLimits{PerSandbox: 2, Total: 3}}
	for _, id := range []string{"a", "a", "b"} {
		if err := p.acquire(id); err != nil {
			t.Fatalf("acquire %s: %v", id, err)
		}
	}
	if err := p.acquire("a"); !errors.Is(err, errcode.LimitReached) {
		t.Fatalf("a third for a: %v, want limit-reached", err)
	}
	if err := p.acquire("c"); !errors.Is(err, errcode.LimitReached) {
		t.Fatalf("a fourth in all: %v, want limit-reached", err)
	}
	p.release("a")
	if err := p.acquire("c"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if p.total != 3 || p.per["a"] != 1 || p.per["c"] != 1 {
		t.Fatalf("counts %d %v", p.total, p.per)
	}
}

func TestPortLimitsDefaults(t *testing.T) {
	t.Parallel()
	if l := (PortLimits{}).withDefaults(); l.PerSandbox != DefaultPortConnsPerSandbox || l.Total != DefaultPortConnsTotal {
		t.Fatalf("defaults %+v", l)
	}
}
