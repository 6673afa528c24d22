package audit

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/node"
)

// TestSecretsApart: a secret some live nodes list and other live nodes do not is a finding
// that names the secret and the nodes lacking it, and says to rotate it through the router;
// a secret every live node lists is none, and a lost node's list is not judged.
func TestSecretsApart(t *testing.T) {
	t.Parallel()
	bn := func(name string, secrets ...string) v1alpha1.BothyNode {
		return v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.BothyNodeStatus{Secrets: secrets}}
	}
	v := &view{
		nodes: map[string]v1alpha1.BothyNode{
			"a":    bn("a", "api-key", "db"),
			"b":    bn("b", "api-key", "db"),
			"c":    bn("c", "db"),
			"lost": bn("lost", "old"),
		},
		live:      map[string]bool{"a": true, "b": true, "c": true, "lost": false},
		objects:   map[string]v1alpha1.Sandbox{},
		sandboxes: map[string]map[string]sandbox{},
	}
	got := compare(v)
	if len(got) != 1 {
		t.Fatalf("findings %v, want one: api-key missing on c", got)
	}
	p := got[0]
	if p.Kind != SecretNotEverywhere || p.Secret != "api-key" || p.Node != "c" || p.Sandbox != "" {
		t.Fatalf("finding %+v, want %s of api-key lacking on c", p, SecretNotEverywhere)
	}
	for _, want := range []string{"a, b hold it", "c do not", "bothy secret rotate api-key", "/v1/secrets/api-key/rotate"} {
		if !strings.Contains(p.Detail, want) {
			t.Errorf("the finding's detail %q does not say %q", p.Detail, want)
		}
	}
	if s := p.String(); !strings.HasPrefix(s, "secret-not-everywhere secret api-key: ") {
		t.Errorf("the finding reads %q", s)
	}
	v.nodes["c"] = bn("c", "db", "api-key")
	if got := compare(v); len(got) != 0 {
		t.Fatalf("findings %v once every live node holds its secrets, want none", got)
	}
}

// TestRestartingNodeNotRead: a node whose lease a new process renews before its status names
// that process is not live to the check (as to a router): its published address is the last
// process's, which the check must not read or fail on.
func TestRestartingNodeNotRead(t *testing.T) {
	t.Parallel()
	scheme, err := node.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	d, id := int32(15), "n"
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: node.LeaseName("n"), Labels: map[string]string{node.StartLabel: "NEW"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &d, RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}
	bn := &v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: v1alpha1.BothyNodeStatus{Address: "http://127.0.0.1:1", StartID: "OLD"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(lease, bn).Build()
	rep, err := Run(t.Context(), Options{Client: c, Namespace: "ns"})
	if err != nil {
		t.Fatalf("the check failed on a restarting node: %v", err)
	}
	if rep.Nodes != 1 || rep.LiveNodes != 0 {
		t.Fatalf("%d nodes, %d live; want the restarting node counted and not live", rep.Nodes, rep.LiveNodes)
	}
}
