package usage

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/supervisor"
)

// Defaults of [Config].
const (
	DefaultInterval     = 5 * time.Second
	DefaultKeep         = 60 // five minutes at the default interval
	DefaultMaxSandboxes = 512
)

// minRateWindow is the shortest time between two readings that a CPU rate is taken over:
// below it the clock's and the cgroup's granularity make the rate noise, and the previous
// rate is kept.
const minRateWindow = 100 * time.Millisecond

// Supervisor is what the sampler reads: the sandboxes, and a sandbox's usage
// ([supervisor.Supervisor.ListPage] and [supervisor.Supervisor.Usage]).
type Supervisor interface {
	ListPage(after string, n int, keep func(*supervisor.Status) bool) ([]*supervisor.Status, bool, error)
	Usage(id string) (*supervisor.Status, runtime.Usage, error)
}

// Config configures a [Sampler]. Zero fields take their defaults.
type Config struct {
	Interval     time.Duration
	Keep         int
	MaxSandboxes int
	// Traffic reads a sandbox's network bytes; nil without a sandbox network.
	Traffic func(id string) (network.Traffic, error)
	Logger  *slog.Logger
}

// Sample is one reading of a sandbox's usage.
type Sample struct {
	At time.Time
	// Launched is when the launch measured started: a sample of another launch starts the
	// CPU time (and its rate) afresh.
	Launched time.Time
	// CPU is the CPU time used since the launch; CPURate the CPUs used on average since the
	// reading before (HasRate false for a first reading). CPUApproximate: see
	// platform.CgroupUsage. VCPUs is the sandbox's CPU limit in whole CPUs.
	CPU            time.Duration
	CPURate        float64
	HasRate        bool
	CPUApproximate bool
	VCPUs          int

	MemoryBytes, MemoryLimitBytes, MemoryPeakBytes int64
	HasMemoryPeak                                  bool

	Pids, PidsLimit int64

	HasDisk                       bool
	DiskUsedBytes, DiskLimitBytes int64

	HasNetwork              bool
	NetInBytes, NetOutBytes uint64
}

// Sampler samples the running sandboxes at a fixed interval and answers a sandbox's usage
// on demand. Its methods are safe for concurrent use.
type Sampler struct {
	sup Supervisor
	cfg Config

	mu      sync.Mutex
	tracked map[string]*track
}

// track is what the sampler keeps of one sandbox: its last reading (by the ticker or a
// request), and the ticker's samples, oldest first.
type track struct {
	last    Sample
	history []Sample
}

// New returns a sampler of sup; [Sampler.Run] takes the samples.
func New(sup Supervisor, cfg Config) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	if cfg.MaxSandboxes <= 0 {
		cfg.MaxSandboxes = DefaultMaxSandboxes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Sampler{sup: sup, cfg: cfg, tracked: map[string]*track{}}
}

// Interval is the time between two samples of the history.
func (s *Sampler) Interval() time.Duration { return s.cfg.Interval }

// Run samples every running sandbox at each interval until ctx ends. The first sample is
// one interval after the start: a status read right away would reconcile sandboxes beside
// the start-up reattach pass, and compete with it.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.Tick()
	}
}

// Tick takes one sample of every running sandbox (up to the cap) and forgets the sandboxes
// that no longer run.
func (s *Sampler) Tick() {
	// The first MaxSandboxes running ones by id: a page reads the statuses up to them, not
	// the whole state root's.
	list, _, err := s.sup.ListPage("", s.cfg.MaxSandboxes, func(st *supervisor.Status) bool {
		return st.State == supervisor.StateRunning || st.State == supervisor.StatePaused
	})
	if err != nil {
		s.cfg.Logger.Warn("usage: the sandboxes do not list", "err", err)
		return
	}
	live := map[string]bool{}
	for _, st := range list {
		live[st.Config.ID] = true
		sm, err := s.read(st.Config.ID)
		if err != nil {
			continue // it ended meanwhile, or its runtime does not measure
		}
		s.mu.Lock()
		tr := s.tracked[st.Config.ID]
		if tr != nil {
			tr.history = append(tr.history, sm)
			if len(tr.history) > s.cfg.Keep {
				tr.history = slices.Delete(tr.history, 0, len(tr.history)-s.cfg.Keep)
			}
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	for id := range s.tracked {
		if !live[id] {
			delete(s.tracked, id)
		}
	}
	s.mu.Unlock()
}

// Read takes a reading of sandbox id now, with its CPU rate since the reading before, and
// returns it with the history (oldest first, a copy).
func (s *Sampler) Read(id string) (Sample, []Sample, error) {
	sm, err := s.read(id)
	if err != nil {
		return Sample{}, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var hist []Sample
	if tr := s.tracked[id]; tr != nil {
		hist = slices.Clone(tr.history)
	}
	return sm, hist, nil
}

// Latest returns the last reading of every sandbox that has one, in id order, at most max
// (and whether some were left out), for /metrics: a scrape reads nothing from the host.
func (s *Sampler) Latest(max int) (map[string]Sample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.tracked))
	for id := range s.tracked {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := map[string]Sample{}
	for _, id := range ids {
		if len(out) >= max {
			return out, true
		}
		out[id] = s.tracked[id].last
	}
	return out, false
}

// read reads sandbox id and records the reading as its last, computing the CPU rate against
// the last one.
func (s *Sampler) read(id string) (Sample, error) {
	st, u, err := s.sup.Usage(id)
	if err != nil {
		return Sample{}, err
	}
	sm := Sample{
		At: time.Now(), CPU: u.CPU, CPUApproximate: u.CPUApproximate, VCPUs: st.Config.Resources.VCPUs,
		MemoryBytes: u.MemoryBytes, MemoryLimitBytes: u.MemoryLimitBytes,
		MemoryPeakBytes: u.MemoryPeakBytes, HasMemoryPeak: u.HasMemoryPeak,
		Pids: u.Pids, PidsLimit: int64(st.Config.Resources.Pids),
		HasDisk: u.HasDisk, DiskUsedBytes: u.DiskUsedBytes, DiskLimitBytes: u.DiskLimitBytes,
	}
	if s.cfg.Traffic != nil {
		// A sandbox without a network has none to read: the sample says so by HasNetwork.
		if tr, err := s.cfg.Traffic(id); err == nil {
			sm.HasNetwork, sm.NetInBytes, sm.NetOutBytes = true, tr.InBytes, tr.OutBytes
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tr := s.tracked[id]
	if tr == nil {
		if len(s.tracked) >= s.cfg.MaxSandboxes {
			return sm, nil // beyond the cap: answered, not kept
		}
		tr = &track{}
		s.tracked[id] = tr
	}
	prev := tr.last
	if st.StartedAt != nil {
		sm.Launched = *st.StartedAt
	}
	if !prev.Launched.Equal(sm.Launched) {
		prev = Sample{} // another launch: its CPU time starts at 0
	}
	// A CPU time summed from the processes (CPUApproximate) can dip when a process is reaped
	// while it is read; the CPU time is a counter (bothy_sandbox_cpu_seconds_total), and a
	// counter that goes back reads as a reset, so it holds at the last until it is passed.
	if sm.CPUApproximate && !prev.At.IsZero() && sm.CPU < prev.CPU {
		sm.CPU = prev.CPU
	}
	dt := sm.At.Sub(prev.At)
	switch {
	case prev.At.IsZero():
		tr.last = sm
	case dt < minRateWindow:
		// Too close to the last reading for a rate of its own: it keeps the last one, and the
		// last reading stays the start of the next window.
		sm.CPURate, sm.HasRate = prev.CPURate, prev.HasRate
	default:
		sm.HasRate = true
		if sm.CPU > prev.CPU {
			sm.CPURate = (sm.CPU - prev.CPU).Seconds() / dt.Seconds()
		}
		tr.last = sm
	}
	return sm, nil
}
