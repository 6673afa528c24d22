package config_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/internal/kubetest"
)

func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestInstallAndUseObjects installs the generated CRDs and RBAC into a real API server,
// whose own validation checks them, and writes and reads a Sandbox and a BothyNode.
func TestInstallAndUseObjects(t *testing.T) {
	cp := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := newClient(t, cp.Config)
	if err := config.Install(ctx, c); err != nil {
		t.Fatal(err)
	}
	// Installing twice replaces rather than fails: an upgrade is the same call.
	if err := config.Install(ctx, c); err != nil {
		t.Fatalf("installing again: %v", err)
	}

	sb := &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "sb-1", Namespace: config.Namespace, Labels: map[string]string{v1alpha1.NodeLabel: "node-a"}},
		Spec:       v1alpha1.SandboxSpec{Image: "host", Resources: v1alpha1.Resources{VCPUs: 1, MemoryMB: 512, Pids: 512}},
	}
	if err := c.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	sb.Status = v1alpha1.SandboxStatus{Node: "node-a", State: v1alpha1.StateRunning}
	if err := c.Status().Update(ctx, sb); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.Sandbox
	if err := c.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: "sb-1"}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Node != "node-a" || got.Status.State != v1alpha1.StateRunning || got.Spec.Resources.MemoryMB != 512 {
		t.Fatalf("read back %+v %+v", got.Spec, got.Status)
	}
	var list v1alpha1.SandboxList
	if err := c.List(ctx, &list, client.InNamespace(config.Namespace), client.MatchingLabels{v1alpha1.NodeLabel: "node-a"}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "sb-1" {
		t.Fatalf("listed %d sandboxes, want sb-1 alone", len(list.Items))
	}

	// The schema's enum is the API server's to enforce: a state no node writes is refused.
	bad := got.DeepCopy()
	bad.Status.State = "exploded"
	if err := c.Status().Update(ctx, bad); !apierrors.IsInvalid(err) {
		t.Fatalf("a status with state %q: got %v, want the API server's Invalid", bad.Status.State, err)
	}

	node := &v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	if err := c.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	node.Status = v1alpha1.BothyNodeStatus{
		Address:  "http://127.0.0.1:7780",
		Capacity: v1alpha1.Capacity{MemoryMB: 8192, MilliCPU: 2000, Sandboxes: 100},
		Free:     v1alpha1.Capacity{MemoryMB: 7680, MilliCPU: 1000, Sandboxes: 99},
		Health:   v1alpha1.NodeHealthy, Sandboxes: 1,
		Images: []string{"host"},
	}
	if err := c.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	var gotNode v1alpha1.BothyNode
	if err := c.Get(ctx, client.ObjectKey{Name: "node-a"}, &gotNode); err != nil {
		t.Fatal(err)
	}
	if gotNode.Status.Free.Sandboxes != 99 || gotNode.Status.Health != v1alpha1.NodeHealthy {
		t.Fatalf("read back node status %+v", gotNode.Status)
	}
	var nodes v1alpha1.BothyNodeList
	if err := c.List(ctx, &nodes); err != nil || len(nodes.Items) != 1 {
		t.Fatalf("listing nodes: %d, %v", len(nodes.Items), err)
	}

	// kubectl get sandboxes -o wide asks for a Table: the printer columns must name the
	// node and the state, and carry this sandbox's values.
	table := getTable(ctx, t, cp.Config, "/apis/cluster.bothy.dev/v1alpha1/namespaces/bothy-system/sandboxes?includeObject=None")
	cols := map[string]int{}
	for i, col := range table.ColumnDefinitions {
		cols[col.Name] = i
	}
	ni, okN := cols["Node"]
	si, okS := cols["State"]
	if !okN || !okS || len(table.Rows) != 1 {
		t.Fatalf("table columns %v, %d rows; want Node and State and one row", cols, len(table.Rows))
	}
	if row := table.Rows[0].Cells; row[ni] != "node-a" || row[si] != "running" {
		t.Fatalf("table row %v: want node-a, running", row)
	}
}

func getTable(ctx context.Context, t *testing.T, cfg *rest.Config, path string) metav1.Table {
	t.Helper()
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+path, nil)
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", path, resp.Status, body)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatal(err)
	}
	return table
}
