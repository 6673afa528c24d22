package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bothy/bothy/supervisor"
)

var (
	sparesDesc = prometheus.NewDesc("bothy_spares",
		"Spare sandboxes (started ahead for creates that name nothing), by kind: wanted (--spares) and ready.",
		[]string{"kind"}, nil)
	spareCreatesDesc = prometheus.NewDesc("bothy_spare_creates_total",
		"Creates that a spare could serve, by result: claimed (given one) and missed (none was ready, so the create started a sandbox of its own).",
		[]string{"result"}, nil)
)

// WatchSpares reports bothy_spares and bothy_spare_creates_total from stats, called at
// every scrape.
func (m *Metrics) WatchSpares(stats func() supervisor.SpareStats) {
	m.reg.MustRegister(&sparesCollector{stats: stats})
}

type sparesCollector struct{ stats func() supervisor.SpareStats }

func (c *sparesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sparesDesc
	ch <- spareCreatesDesc
}

func (c *sparesCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(sparesDesc, prometheus.GaugeValue, float64(st.Wanted), "wanted")
	ch <- prometheus.MustNewConstMetric(sparesDesc, prometheus.GaugeValue, float64(st.Ready), "ready")
	ch <- prometheus.MustNewConstMetric(spareCreatesDesc, prometheus.CounterValue, float64(st.Claimed), "claimed")
	ch <- prometheus.MustNewConstMetric(spareCreatesDesc, prometheus.CounterValue, float64(st.Missed), "missed")
}
