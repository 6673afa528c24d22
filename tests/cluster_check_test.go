package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/audit"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/internal/kubetest"
)

// clusterChecker runs `bothyd check --cluster` as the operator (the control plane's admin).
type clusterChecker struct {
	t                     testing.TB
	kubeconfig, tokenFile string
}

func newClusterChecker(t testing.TB, cp *kubetest.ControlPlane, nodeToken string) *clusterChecker {
	t.Helper()
	dir := t.TempDir()
	c := &clusterChecker{t: t, kubeconfig: filepath.Join(dir, "kubeconfig"), tokenFile: filepath.Join(dir, "node-token")}
	if err := cp.WriteKubeconfig(c.kubeconfig, kubetest.Admin); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.tokenFile, []byte(nodeToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// run runs the check and returns its report and exit status.
func (c *clusterChecker) run(extra ...string) (*audit.Report, int) {
	c.t.Helper()
	args := append([]string{"check", "--cluster", "--cluster-kubeconfig", c.kubeconfig, "--node-token-file", c.tokenFile, "--json"}, extra...)
	cmd := exec.Command(bothydBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		c.t.Fatalf("bothyd check --cluster: %v", err)
	}
	if code == 2 {
		c.t.Fatalf("bothyd check --cluster could not run: %s", stderr.String())
	}
	var rep audit.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		c.t.Fatalf("bothyd check --cluster's report: %v\n%s\n%s", err, out, stderr.String())
	}
	return &rep, code
}

// kinds lists a report's problems as "kind sandbox", sorted.
func kinds(rep *audit.Report, repaired bool) []string {
	var out []string
	for _, p := range rep.Problems {
		if p.Repaired == repaired {
			out = append(out, p.Kind+" "+p.Sandbox)
		}
	}
	sort.Strings(out)
	return out
}

// TestClusterCheck makes every kind of disagreement between the Sandbox objects and two real
// nodes' stores on purpose — the nodes' object writes are cut off by taking the rights from
// their role, as an API server out of reach would — and checks that `bothyd check --cluster`
// reports each (exit 1), that --repair fixes all but the id on two nodes, which is the
// operator's, and that once that is settled and the nodes write again the check is clean.
func TestClusterCheck(t *testing.T) {
	requireRoot(t)
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser)
	const nodeToken = "node-token-0123456789abcdef"
	a := startClusterNode(t, cp, admin, "check-a", withToken(nodeToken))
	b := startClusterNode(t, cp, admin, "check-b", withToken(nodeToken))
	checker := newClusterChecker(t, cp, nodeToken)
	key := func(id string) client.ObjectKey { return client.ObjectKey{Namespace: config.Namespace, Name: id} }
	running := func(s *v1alpha1.Sandbox) error {
		if s.Status.State != v1alpha1.StateRunning {
			return fmt.Errorf("state %q", s.Status.State)
		}
		return nil
	}
	for _, id := range []string{"c-state", "c-node", "c-gone", "c-ok"} {
		if r := a.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": true}); r.Status != 201 {
			t.Fatalf("create %s: %d %s", id, r.Status, r.Body)
		}
		waitObject(t, admin, id+" mirrored", key(id), &v1alpha1.Sandbox{}, running)
	}
	if rep, code := checker.run(); code != 0 || len(rep.Problems) != 0 || rep.Sandboxes != 4 || rep.LiveNodes != 2 {
		t.Fatalf("the check of a consistent cluster: exit %d, %+v", code, rep)
	}

	// The nodes can no longer write their objects.
	var role rbacv1.Role
	if err := admin.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: "bothy-node"}, &role); err != nil {
		t.Fatal(err)
	}
	saved := role.DeepCopy()
	role.Rules = slices.DeleteFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.APIGroups, v1alpha1.GroupVersion.Group) })
	if err := admin.Update(ctx, &role); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		var now rbacv1.Role
		if err := admin.Get(ctx, client.ObjectKeyFromObject(saved), &now); err != nil {
			t.Fatal(err)
		}
		now.Rules = saved.Rules
		if err := admin.Update(ctx, &now); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(restore)
	// Wait until the authorizer refuses the node: a create's object is refused (the node
	// logs it and retries) rather than written.
	newID := ""
	for attempt := 0; newID == ""; attempt++ {
		id := fmt.Sprintf("c-new-%d", attempt)
		if r := a.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id}); r.Status != 201 {
			t.Fatalf("create %s: %d %s", id, r.Status, r.Body)
		}
		waitCond(t, 30*time.Second, id+"'s object written or refused", func() (bool, error) {
			// The object first: the node claims the id by creating it before the sandbox is
			// made, so an object made by a claim the authorizer still allowed stands even if
			// the node's later writes of it are refused (the refusal alone would not do).
			err := admin.Get(ctx, key(id), &v1alpha1.Sandbox{})
			if err == nil {
				a.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
				return true, nil
			}
			if client.IgnoreNotFound(err) != nil {
				return false, err
			}
			for _, line := range strings.Split(a.logs.String(), "\n") {
				if strings.Contains(line, `"sandbox":"`+id+`"`) && strings.Contains(line, "forbidden") {
					newID = id
					return true, nil
				}
			}
			return false, nil
		})
	}
	// Now each kind: a sandbox without object (the c-new above), an object without sandbox,
	// a state the object does not follow, an object naming another node, an id on two nodes.
	if r := a.doJSON("DELETE", "/v1/sandboxes/c-gone?force=true", nil); r.Status != 204 {
		t.Fatalf("delete c-gone: %d %s", r.Status, r.Body)
	}
	if r := a.doJSON("POST", "/v1/sandboxes/c-state/stop", nil); r.Status != 200 {
		t.Fatalf("stop c-state: %d %s", r.Status, r.Body)
	}
	var moved v1alpha1.Sandbox
	if err := admin.Get(ctx, key("c-node"), &moved); err != nil {
		t.Fatal(err)
	}
	moved.Labels[v1alpha1.NodeLabel] = "check-b"
	if err := admin.Update(ctx, &moved); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*daemon{a, b} {
		if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "c-twin"}); r.Status != 201 {
			t.Fatalf("create c-twin: %d %s", r.Status, r.Body)
		}
	}
	want := []string{audit.NodeMismatch + " c-node", "object-without-sandbox c-gone", "on-two-nodes c-twin", "sandbox-without-object " + newID, "state-mismatch c-state"}
	sort.Strings(want)
	rep, code := checker.run()
	if got := kinds(rep, false); code != 1 || !slices.Equal(got, want) {
		t.Fatalf("the check: exit %d, problems %v, want exit 1 and %v", code, got, want)
	}
	t.Logf("found: %v", rep.Problems)

	// Repair: everything but the id on two nodes, which stays (exit 1).
	rep, code = checker.run("--repair")
	wantRepaired := slices.DeleteFunc(slices.Clone(want), func(s string) bool { return s == "on-two-nodes c-twin" })
	if got := kinds(rep, true); code != 1 || !slices.Equal(got, wantRepaired) || !slices.Equal(kinds(rep, false), []string{"on-two-nodes c-twin"}) {
		t.Fatalf("the repair: exit %d, repaired %v, left %v; want exit 1, %v repaired and the twin left", code, got, kinds(rep, false), wantRepaired)
	}
	waitObject(t, admin, "c-state stopped by the repair", key("c-state"), &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
		if s.Status.State != v1alpha1.StateStopped {
			return fmt.Errorf("state %q", s.Status.State)
		}
		return nil
	})
	// The operator settles the twin; the nodes write again; the check is clean.
	if r := b.doJSON("DELETE", "/v1/sandboxes/c-twin", nil); r.Status != 204 {
		t.Fatalf("delete c-twin on check-b: %d %s", r.Status, r.Body)
	}
	restore()
	waitCond(t, 120*time.Second, "a clean check", func() (bool, error) {
		rep, code := checker.run()
		if code == 0 {
			t.Logf("clean: %+v", rep)
		}
		return code == 0, nil
	})
}
