package tests

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// e2bRouterFlows are the tests of e2b/testdata/js/flow.test.mjs that run against a router:
// those of sandboxes, commands, files and their lifecycle, and volumes (routed to the node
// that holds them, docs/cluster.md "Volumes"), fork and snapshots (a snapshot on its
// sandbox's node, a create from it placed there). Secrets are held by one node each and the
// router answers 501 for them.
var e2bRouterFlows = []string{
	"create, run, files, timeout, list, kill",
	"two sandboxes, watchDir, processes across a restart of bothyd",
	"25 sandboxes in parallel",
	"getMetrics, and autoPause with autoResume",
	"volumes: create, connect, list, files, volumeMounts shared by two sandboxes, destroy",
	"fork, and snapshots: create, list, create from, delete",
}

// TestClusterE2BFlow runs the unmodified E2B JS SDK flow (e2b/testdata/js) against a real
// router in front of two real nodes and the real API server: E2B's control plane is placed
// and routed, its envd plane forwarded to each sandbox's node. The flow's "restart of bothyd"
// SIGKILLs both nodes and starts them again (BOTHY_RESTART). It needs node and the flow's
// packages (cd e2b/testdata/js && npm ci --ignore-scripts); without them it skips.
func TestClusterE2BFlow(t *testing.T) {
	flowDir, err := filepath.Abs(filepath.Join("..", "e2b", "testdata", "js"))
	if err != nil {
		t.Fatal(err)
	}
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the E2B JS SDK flow needs it")
	}
	if _, err := os.Stat(filepath.Join(flowDir, "node_modules", "e2b")); err != nil {
		t.Skip("the E2B flow's packages are not installed: run `cd e2b/testdata/js && npm ci --ignore-scripts`")
	}
	cp, admin, ctx := startInstalledCluster(t, 15*time.Minute, clusterNodeUser, clusterRouterUser)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterNodeUser); err != nil {
		t.Fatal(err)
	}
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	names := []string{"node-a", "node-b"}
	nodes := map[string]*daemon{}
	for _, name := range names {
		nodes[name] = startDaemon(t, withToken(nodeToken), withArgs("--cluster-node", "--cluster-kubeconfig", kubeconfig,
			"--cluster-node-name", name, "--cluster-lease-duration", "6s",
			"--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"))
	}
	published := func() {
		for name, d := range nodes {
			waitObject(t, admin, name+" published", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
				if n.Status.Address != d.URL {
					return fmt.Errorf("address %q, want %q", n.Status.Address, d.URL)
				}
				return nil
			})
		}
	}
	published()
	url := startRouter(t, cp, routerToken, nodeToken)

	// BOTHY_RESTART: the flow runs a script that asks the test, over loopback, to SIGKILL both
	// nodes and start them again; it returns once they serve and have published themselves.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var restarts atomic.Int32
	restartSrv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for _, name := range names {
			nodes[name].Restart(true)
		}
		published()
		restarts.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = restartSrv.Serve(ln) }()
	t.Cleanup(func() { _ = restartSrv.Close() })
	script := filepath.Join(t.TempDir(), "restart.sh")
	body := fmt.Sprintf("#!/bin/sh\nexec %s -e 'fetch(process.argv[1], {method: \"POST\"}).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' http://%s/\n", nodeBin, ln.Addr())
	if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
		t.Fatal(err)
	}

	pattern := make([]string, len(e2bRouterFlows))
	for i, name := range e2bRouterFlows {
		pattern[i] = "^" + regexpQuote(name)
	}
	cmd := exec.CommandContext(ctx, nodeBin, "--test", "--test-concurrency=1", "--test-name-pattern", strings.Join(pattern, "|"), "flow.test.mjs")
	cmd.Dir = flowDir
	cmd.Env = append(os.Environ(), "E2B_API_KEY=e2b_"+routerToken, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url,
		"E2B_VOLUME_API_URL="+url, "BOTHY_RESTART="+script)
	cmd.Env = slicesWithout(cmd.Env, "E2B_DEBUG=", "E2B_DOMAIN=")
	out, err := cmd.CombinedOutput()
	t.Logf("the E2B flow through the router:\n%s", out)
	if err != nil {
		t.Fatalf("the E2B flow through the router failed: %v", err)
	}
	if want := fmt.Sprintf("# pass %d\n", len(e2bRouterFlows)); !strings.Contains(string(out), want) {
		t.Fatalf("the flow did not pass its %d tests (%q missing)", len(e2bRouterFlows), want)
	}
	if n := restarts.Load(); n != 1 {
		t.Fatalf("the nodes were restarted %d times, want once", n)
	}
}

// regexpQuote escapes the characters of a JavaScript regular expression.
func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\^$.|?*+()[]{}/`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// slicesWithout drops the variables whose name=... starts with one of prefixes.
func slicesWithout(env []string, prefixes ...string) []string {
	out := env[:0:0]
	for _, kv := range env {
		keep := true
		for _, p := range prefixes {
			if strings.HasPrefix(kv, p) {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
