package supervisor

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/store"
)

// recordNet is a Networker that keeps only the Manager's records: what a sandbox's network
// leaves on disk for the next process.
type recordNet struct {
	mu       sync.Mutex
	records  map[string]bool
	tornDown []string
}

func (n *recordNet) Setup(id string, _ network.Target, _ *network.Rules) (network.Attachment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.records[id] = true
	return network.Attachment{}, nil
}

func (n *recordNet) Update(string, *network.Rules) error { return nil }

func (n *recordNet) Teardown(id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.records, id)
	n.tornDown = append(n.tornDown, id)
	return nil
}

func (n *recordNet) Recorded() ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Sorted(maps.Keys(n.records)), nil
}

// TestStartupTearsDownNetworksOfSandboxesNotRunning: a network record can outlive its launch
// (a `bothyd check --repair`, whose supervisor has no Manager, cleared the launch's runtime
// record; a Teardown failed), and then no launch is left whose end would tear it down. The
// start-up reconciliation removes the records of a stopped sandbox and of one that is gone,
// and keeps those of a running sandbox and of a sandbox whose lock another process holds.
func TestStartupTearsDownNetworksOfSandboxesNotRunning(t *testing.T) {
	s, root := newSupervisor(t)
	ctx := testContext(t)
	startNew(t, ctx, s, "netrun")
	for _, id := range []string{"netstopped", "netbusy"} {
		if _, err := s.Create(ctx, CreateRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	// Another process's transition on netbusy: its own store, so its own lock file
	// description, which excludes this process's.
	other, err := store.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	held, err := other.LockExisting(lctx, "netbusy")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock()

	// A restarted bothyd on the same root, with the records an earlier process left.
	net := &recordNet{records: map[string]bool{"netrun": true, "netstopped": true, "netgone": true, "netbusy": true}}
	st, err := store.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := namespace.New(namespace.Config{CgroupParent: testCgroupParent})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := New(Options{Store: st, Runtime: rt, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StopGrace: time.Second, Network: net})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.ReattachAll(ctx, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	left, _ := net.Recorded()
	if want := []string{"netbusy", "netrun"}; !slices.Equal(left, want) {
		t.Errorf("after start-up the network records are %v, want %v (torn down: %v)", left, want, net.tornDown)
	}
	if slices.Contains(net.tornDown, "netrun") || slices.Contains(net.tornDown, "netbusy") {
		t.Errorf("start-up tore down the network of a running or locked sandbox: %v", net.tornDown)
	}
	// The lock taken for the id that has no sandbox leaves no state directory behind.
	if _, err := os.Lstat(filepath.Join(root, store.SandboxesDir, "netgone")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the lock taken for netgone, which has no sandbox, left its state directory: %v", err)
	}
}
