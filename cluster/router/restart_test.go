package router

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/node"
)

// TestRestartedNodeNotLiveUntilItsStatusIs: a restarted node renews its lease at once, and a
// router that reads that lease beside the last process's status (the old address) must not
// take the node for live; it does once the status names the process that holds the lease.
func TestRestartedNodeNotLiveUntilItsStatusIs(t *testing.T) {
	t.Parallel()
	scheme := testScheme(t)
	tests := []struct {
		name             string
		leaseID, status  string
		labelled, wantUp bool
	}{
		{name: "the status names the lease's process", leaseID: "NEW", status: "NEW", labelled: true, wantUp: true},
		{name: "the lease renewed by a new process, the status still the last one's", leaseID: "NEW", status: "OLD", labelled: true},
		{name: "the lease renewed by a new process, a status from before start ids", leaseID: "NEW", labelled: true},
		{name: "a node from before start ids", status: "", wantUp: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lease := testLease("n", time.Now(), 15)
			if tt.labelled {
				lease.Labels = map[string]string{node.StartLabel: tt.leaseID}
			}
			bn := &v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: "n"},
				Status: v1alpha1.BothyNodeStatus{Address: "http://127.0.0.1:1", StartID: tt.status, Health: v1alpha1.NodeHealthy}}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(lease, bn).Build()
			rt, err := New(Config{Client: c, Namespace: ns, Token: "t"})
			if err != nil {
				t.Fatal(err)
			}
			nodes, err := rt.nodes(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := nodes["n"].live; got != tt.wantUp {
				t.Fatalf("live = %v, want %v", got, tt.wantUp)
			}
		})
	}
}
