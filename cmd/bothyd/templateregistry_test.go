package main

import (
	"context"
	"testing"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// fakeGenerations answers every pull with err.
type fakeGenerations struct {
	supervisor.GenerationRegistry
	err error
}

func (f fakeGenerations) Pull(context.Context, string, string) error { return f.err }

// TestNotifyPulls: a pull that brought a generation here tells the cluster node; one that
// failed, or found the generation here already, does not; no registry stays none.
func TestNotifyPulls(t *testing.T) {
	t.Parallel()
	if notifyPulls(nil, func() { t.Fatal("called") }) != nil {
		t.Fatal("no registry became one")
	}
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"pulled", nil, 1},
		{"failed", errcode.New(errcode.RegistryUnavailable, "down"), 0},
		{"held already", errcode.New(errcode.TemplateExists, "here"), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			g := notifyPulls(fakeGenerations{err: tt.err}, func() { calls++ })
			if err := g.Pull(context.Background(), "tools", "g000001"); err != tt.err {
				t.Fatalf("Pull = %v, want %v", err, tt.err)
			}
			if calls != tt.want {
				t.Fatalf("notified %d times, want %d", calls, tt.want)
			}
		})
	}
}
