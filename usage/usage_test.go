package usage

import (
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/supervisor"
)

// fakeSupervisor answers a fixed set of sandboxes whose CPU time the test sets.
type fakeSupervisor struct {
	mu    sync.Mutex
	state map[string]supervisor.State
	cpu   map[string]time.Duration
	// approximate and started are every sandbox's CPUApproximate and launch start.
	approximate bool
	started     time.Time
}

func (f *fakeSupervisor) ListPage(after string, n int, keep func(*supervisor.Status) bool) ([]*supervisor.Status, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*supervisor.Status
	for _, id := range []string{"a", "b", "c"} {
		st, ok := f.state[id]
		if !ok || id <= after {
			continue
		}
		s := &supervisor.Status{Config: supervisor.Config{ID: id}, State: st}
		if !keep(s) {
			continue
		}
		if len(out) == n {
			return out, true, nil
		}
		out = append(out, s)
	}
	return out, false, nil
}

func (f *fakeSupervisor) Usage(id string) (*supervisor.Status, runtime.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.state[id]
	if !ok || st != supervisor.StateRunning {
		return nil, runtime.Usage{}, errcode.New(errcode.NotRunning, "not running")
	}
	var u runtime.Usage
	u.CPU, u.MemoryBytes, u.Pids, u.CPUApproximate = f.cpu[id], 1<<20, 2, f.approximate
	started := f.started
	return &supervisor.Status{Config: supervisor.Config{ID: id}, State: st, StartedAt: &started}, u, nil
}

func (f *fakeSupervisor) set(id string, st supervisor.State, cpu time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state[id], f.cpu[id] = st, cpu
}

func TestSamplerBoundsAndForgets(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{state: map[string]supervisor.State{}, cpu: map[string]time.Duration{}}
	f.set("a", supervisor.StateRunning, 0)
	f.set("b", supervisor.StateRunning, 0)
	f.set("c", supervisor.StateRunning, 0)
	s := New(f, Config{Keep: 3, MaxSandboxes: 2, Traffic: func(id string) (network.Traffic, error) {
		return network.Traffic{InBytes: 10, OutBytes: 20}, nil
	}})
	for range 5 {
		s.Tick()
	}
	_, hist, err := s.Read("a")
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 3 {
		t.Fatalf("a has %d samples, want the 3 kept", len(hist))
	}
	if !hist[0].HasNetwork || hist[0].NetOutBytes != 20 {
		t.Fatalf("a sample without its traffic: %+v", hist[0])
	}
	cur, hist, err := s.Read("c")
	if err != nil || len(hist) != 0 || cur.MemoryBytes != 1<<20 {
		t.Fatalf("c, beyond the cap: %+v %d samples, %v; want a reading and no history", cur, len(hist), err)
	}
	if latest, more := s.Latest(1); len(latest) != 1 || !more {
		t.Fatalf("Latest(1) = %d sandboxes, more %v", len(latest), more)
	}
	f.set("a", supervisor.StateStopped, 0)
	s.Tick()
	if _, _, err := s.Read("a"); errcode.Of(err) != errcode.NotRunning {
		t.Fatalf("a stopped: %v", err)
	}
	if latest, _ := s.Latest(10); len(latest) != 1 {
		t.Fatalf("after a stopped, %d sandboxes tracked, want b alone", len(latest))
	}
}

func TestSamplerRate(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{state: map[string]supervisor.State{}, cpu: map[string]time.Duration{}}
	f.set("a", supervisor.StateRunning, time.Second)
	s := New(f, Config{})
	first, _, err := s.Read("a")
	if err != nil || first.HasRate {
		t.Fatalf("a first reading has a rate: %+v, %v", first, err)
	}
	// Half a CPU over at least the rate window: wait for the window to pass, then add CPU
	// time worth half of what passed.
	deadline := time.Now().Add(time.Second)
	for time.Since(first.At) < 2*minRateWindow && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	f.set("a", supervisor.StateRunning, time.Second+time.Since(first.At)/2)
	second, _, err := s.Read("a")
	if err != nil || !second.HasRate {
		t.Fatalf("second reading: %+v, %v", second, err)
	}
	if second.CPURate < 0.3 || second.CPURate > 0.55 {
		t.Fatalf("rate %.3f, want about 0.5", second.CPURate)
	}
	// At once again: too close for a rate of its own, it keeps the last.
	third, _, _ := s.Read("a")
	if third.CPURate != second.CPURate {
		t.Fatalf("a reading within the window has rate %.3f, want the last %.3f", third.CPURate, second.CPURate)
	}
}

// TestSamplerApproximateCPUIsACounter: a summed CPU time that dips holds at the last reading
// (it is exported as a counter), and a new launch starts it afresh.
func TestSamplerApproximateCPUIsACounter(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{state: map[string]supervisor.State{}, cpu: map[string]time.Duration{}, approximate: true, started: time.Unix(100, 0)}
	f.set("a", supervisor.StateRunning, 3*time.Second)
	s := New(f, Config{})
	if _, _, err := s.Read("a"); err != nil {
		t.Fatal(err)
	}
	f.set("a", supervisor.StateRunning, 2*time.Second) // a process reaped as it was read
	if sm, _, _ := s.Read("a"); sm.CPU != 3*time.Second {
		t.Fatalf("a dip read %v, want the last 3s held", sm.CPU)
	}
	f.mu.Lock()
	f.started = time.Unix(200, 0) // stopped and started again
	f.mu.Unlock()
	if sm, _, _ := s.Read("a"); sm.CPU != 2*time.Second || sm.HasRate {
		t.Fatalf("a new launch read %v (rate %v), want its own 2s and no rate yet", sm.CPU, sm.HasRate)
	}
}
