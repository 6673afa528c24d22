package tests

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// usageJSON is the part of GET /v1/sandboxes/{id}/metrics the tests read.
type usageJSON struct {
	ID         string `json:"id"`
	IntervalMs int64  `json:"interval_ms"`
	Current    struct {
		CPUSeconds       float64  `json:"cpu_seconds"`
		CPURate          *float64 `json:"cpu_rate"`
		MemoryBytes      int64    `json:"memory_bytes"`
		MemoryLimitBytes int64    `json:"memory_limit_bytes"`
		MemoryPeakBytes  *int64   `json:"memory_peak_bytes"`
		Pids             int64    `json:"pids"`
		DiskUsedBytes    *int64   `json:"disk_used_bytes"`
		DiskLimitBytes   *int64   `json:"disk_limit_bytes"`
		NetInBytes       *int64   `json:"net_in_bytes"`
		NetOutBytes      *int64   `json:"net_out_bytes"`
	} `json:"current"`
	History []struct {
		CPUSeconds float64 `json:"cpu_seconds"`
	} `json:"history"`
}

func (d *daemon) usage(id string) usageJSON {
	d.t.Helper()
	return decode[usageJSON](d.t, d.do("GET", "/v1/sandboxes/"+id+"/metrics", nil, nil), 200)
}

// TestSandboxMetricsRise: a sandbox running a CPU burner and then holding 64 MiB of memory
// shows its CPU time, CPU rate, memory and tasks rising in GET /v1/sandboxes/{id}/metrics,
// in E2B's getMetrics and in the --sandbox-metrics series of /metrics; a stopped sandbox has
// none (not-running).
func TestSandboxMetricsRise(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withArgs("--sandbox-metrics"))
	d.create("meter", true)
	idle := d.usage("meter")
	if idle.ID != "meter" || idle.Current.MemoryBytes <= 0 || idle.Current.Pids < 1 || idle.IntervalMs <= 0 {
		t.Fatalf("an idle sandbox's usage: %+v", idle)
	}
	if idle.Current.DiskLimitBytes == nil || *idle.Current.DiskLimitBytes <= 0 {
		t.Errorf("a sandbox with a disk of its own (the default) has no disk in its usage: %+v", idle.Current)
	}

	// Three CPU burners, outside the exec's process group so that they outlive the exec.
	// Their rate is judged against an idle sandbox's (about 0), not against a whole CPU: the
	// host is shared, and the burners get what the other load leaves them. Three, not one,
	// so that the task count's rise outweighs a thread the agent's Go runtime had for a
	// moment when the idle reading was taken (a CI run saw 8 and 8 with one burner).
	burn := "setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &"
	if got := d.exec("meter", map[string]any{"command": []string{"sh", "-c", burn + " " + burn + " " + burn}}); got.ExitCode != 0 {
		t.Fatalf("starting the burners: %+v", got)
	}
	var busy usageJSON
	waitFor(t, 30*time.Second, "the burners' CPU time and rate to show", func() bool {
		busy = d.usage("meter")
		return busy.Current.CPUSeconds >= idle.Current.CPUSeconds+0.5 && busy.Current.CPURate != nil && *busy.Current.CPURate > 0.05
	})
	if busy.Current.Pids <= idle.Current.Pids {
		t.Errorf("tasks did not rise with the burners: %d, idle %d", busy.Current.Pids, idle.Current.Pids)
	}

	// 64 MiB held in a tmpfs file: tmpfs pages are charged to the memory cgroup of the
	// sandbox that wrote them.
	if got := d.exec("meter", map[string]any{"command": []string{"sh", "-c", "head -c 67108864 /dev/zero > /dev/shm/hold && echo ok"}}); got.ExitCode != 0 {
		t.Fatalf("allocating: %+v", got)
	}
	var held usageJSON
	waitFor(t, 30*time.Second, "64 MiB more memory to show", func() bool {
		held = d.usage("meter")
		return held.Current.MemoryBytes >= idle.Current.MemoryBytes+60<<20
	})
	if p := held.Current.MemoryPeakBytes; p != nil && *p < held.Current.MemoryBytes {
		t.Errorf("memory peak %d below the memory now %d", *p, held.Current.MemoryBytes)
	}

	// The server's own samples: at least one, taken while the burner ran.
	waitFor(t, 30*time.Second, "a sample of the history with the burner's CPU time", func() bool {
		h := d.usage("meter").History
		return len(h) > 0 && h[len(h)-1].CPUSeconds >= busy.Current.CPUSeconds
	})

	// The labelled series of /metrics (--sandbox-metrics), from the sampler's last reading.
	waitFor(t, 30*time.Second, "the sandbox's series on /metrics", func() bool {
		m := d.scrape()
		return m[`bothy_sandbox_cpu_seconds_total{sandbox="meter"}`] >= busy.Current.CPUSeconds &&
			m[`bothy_sandbox_memory_bytes{sandbox="meter"}`] > 0
	})

	// E2B's getMetrics: a list of samples in E2B's shape.
	type e2bMetric struct {
		CPUCount   int     `json:"cpuCount"`
		CPUUsedPct float64 `json:"cpuUsedPct"`
		MemUsed    int64   `json:"memUsed"`
		MemTotal   int64   `json:"memTotal"`
		DiskTotal  int64   `json:"diskTotal"`
	}
	// The burner shows in the samples' CPU. A window's rate can read 0 where the CPU time is
	// summed from the processes (cgroup v1 without cpuacct: a process reaped while the sum is
	// read counts in it twice or not at all, and the next window's sum is lower), so this
	// waits for a sample that shows it.
	var e2b []e2bMetric
	waitFor(t, 30*time.Second, "a sample of E2B's getMetrics with the burner's CPU", func() bool {
		e2b = decode[[]e2bMetric](t, d.do("GET", "/sandboxes/meter/metrics", nil, http.Header{"X-API-KEY": {d.Token}}), 200)
		return slices.ContainsFunc(e2b, func(m e2bMetric) bool { return m.CPUUsedPct > 0 })
	})
	last := e2b[len(e2b)-1]
	if last.MemUsed < 60<<20 || last.MemTotal <= 0 || last.CPUCount < 1 {
		t.Errorf("E2B's last sample: %+v", last)
	}

	// The CLI prints the same reading.
	if out := d.ctlOK("", "metrics", "meter"); !strings.Contains(out, "memory") || !strings.Contains(out, "history") {
		t.Errorf("bothy metrics: %q", out)
	}

	if r := d.doJSON("POST", "/v1/sandboxes/meter/stop?force=true", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.do("GET", "/v1/sandboxes/meter/metrics", nil, nil), 409, "not-running")
}
