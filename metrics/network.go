package metrics

import "github.com/prometheus/client_golang/prometheus"

var networkDeniedDesc = prometheus.NewDesc("bothy_network_denied_total",
	"Sandbox egress denied, by kind: always-denied and policy (packets a sandbox's filter dropped), host (packets from a sandbox to the host), dns-refused (names a sandbox's resolver refused).",
	[]string{"kind"}, nil)

// NetworkKinds are the kinds bothy_network_denied_total reports, all of them on every
// scrape (zeros included).
var NetworkKinds = []string{"always-denied", "policy", "host", "dns-refused"}

// WatchNetwork reports bothy_network_denied_total from denied, called at every scrape with
// the counts by kind (see NetworkKinds); they only grow while bothyd runs.
func (m *Metrics) WatchNetwork(denied func() map[string]uint64) {
	m.reg.MustRegister(&networkCollector{denied: denied})
}

type networkCollector struct{ denied func() map[string]uint64 }

func (c *networkCollector) Describe(ch chan<- *prometheus.Desc) { ch <- networkDeniedDesc }

func (c *networkCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.denied()
	for _, k := range NetworkKinds {
		ch <- prometheus.MustNewConstMetric(networkDeniedDesc, prometheus.CounterValue, float64(counts[k]), k)
	}
}
