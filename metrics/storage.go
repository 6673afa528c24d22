package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bothy/bothy/errcode"
)

func newStorageFaults() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bothy_storage_faults_total",
		Help: "Writes under the state root that its file system failed, by error code (storage-full, storage-unavailable).",
	}, []string{"code"})
	// Both codes are reported from the start, so that a query sees the first fault as an
	// increase rather than as a new series.
	c.WithLabelValues(string(errcode.StorageFull))
	c.WithLabelValues(string(errcode.StorageUnavailable))
	return c
}

// OnStorageFault counts a storage fault (supervisor.StorageHealth's hook).
func (m *Metrics) OnStorageFault(code errcode.Code) {
	m.storageFaults.WithLabelValues(string(code)).Inc()
}
