package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bothy/bothy/usage"
)

// The per-sandbox series (--sandbox-metrics), labelled by the sandbox id alone.
var (
	sandboxCPUDesc = prometheus.NewDesc("bothy_sandbox_cpu_seconds_total",
		"CPU time a running sandbox used since its launch.", []string{"sandbox"}, nil)
	sandboxMemoryDesc = prometheus.NewDesc("bothy_sandbox_memory_bytes",
		"Memory a running sandbox's cgroup is charged now.", []string{"sandbox"}, nil)
	sandboxMemoryLimitDesc = prometheus.NewDesc("bothy_sandbox_memory_limit_bytes",
		"A running sandbox's memory limit (0: none).", []string{"sandbox"}, nil)
	sandboxPidsDesc = prometheus.NewDesc("bothy_sandbox_pids",
		"Tasks (processes and threads) in a running sandbox.", []string{"sandbox"}, nil)
	sandboxDiskDesc = prometheus.NewDesc("bothy_sandbox_disk_used_bytes",
		"What a running sandbox's own disk holds on the host.", []string{"sandbox"}, nil)
	sandboxNetInDesc = prometheus.NewDesc("bothy_sandbox_network_receive_bytes_total",
		"Bytes that arrived at a running sandbox's interface since its network was set up.", []string{"sandbox"}, nil)
	sandboxNetOutDesc = prometheus.NewDesc("bothy_sandbox_network_transmit_bytes_total",
		"Bytes that left a running sandbox's interface since its network was set up.", []string{"sandbox"}, nil)
	sandboxOmittedDesc = prometheus.NewDesc("bothy_sandbox_series_truncated",
		"1 when more running sandboxes were sampled than --sandbox-metrics-max exports.", nil, nil)
)

// WatchUsage exports the sampler's last reading of up to max running sandboxes (in id
// order) as series labelled by the sandbox id: the label's values are bounded by max, and a
// scrape reads nothing from the host.
func (m *Metrics) WatchUsage(s *usage.Sampler, max int) {
	m.reg.MustRegister(&usageCollector{s: s, max: max})
}

type usageCollector struct {
	s   *usage.Sampler
	max int
}

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxCPUDesc, sandboxMemoryDesc, sandboxMemoryLimitDesc, sandboxPidsDesc, sandboxDiskDesc, sandboxNetInDesc, sandboxNetOutDesc, sandboxOmittedDesc} {
		ch <- d
	}
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	latest, more := c.s.Latest(c.max)
	truncated := 0.0
	if more {
		truncated = 1
	}
	ch <- prometheus.MustNewConstMetric(sandboxOmittedDesc, prometheus.GaugeValue, truncated)
	for id, sm := range latest {
		ch <- prometheus.MustNewConstMetric(sandboxCPUDesc, prometheus.CounterValue, sm.CPU.Seconds(), id)
		ch <- prometheus.MustNewConstMetric(sandboxMemoryDesc, prometheus.GaugeValue, float64(sm.MemoryBytes), id)
		ch <- prometheus.MustNewConstMetric(sandboxMemoryLimitDesc, prometheus.GaugeValue, float64(sm.MemoryLimitBytes), id)
		ch <- prometheus.MustNewConstMetric(sandboxPidsDesc, prometheus.GaugeValue, float64(sm.Pids), id)
		if sm.HasDisk {
			ch <- prometheus.MustNewConstMetric(sandboxDiskDesc, prometheus.GaugeValue, float64(sm.DiskUsedBytes), id)
		}
		if sm.HasNetwork {
			ch <- prometheus.MustNewConstMetric(sandboxNetInDesc, prometheus.CounterValue, float64(sm.NetInBytes), id)
			ch <- prometheus.MustNewConstMetric(sandboxNetOutDesc, prometheus.CounterValue, float64(sm.NetOutBytes), id)
		}
	}
}
