package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// tsRouterFiles are the TypeScript SDK's live test files that run against a router: those of
// sandboxes, exec, files, checkpoints, port links, errors, waiting, events, volumes (routed
// to their node), nodes and templates (a capture to its sandbox's node, the rest to every
// node). Not secrets: its sandbox binds one, so has a network policy, and when
// TestClusterSecrets first ran two nodes in one network namespace, as here, the second
// node's sandbox with a policy was refused ("make the filter of …: file exists");
// TestClusterSecrets runs secrets through a router over nodes in namespaces of their own.
var tsRouterFiles = []string{"sandboxes", "exec", "files", "checkpoints", "links", "errors", "wait", "sse", "generated", "volumes", "nodes", "templates"}

// TestClusterTSSDKLive runs the TypeScript SDK's live tests (sdk/typescript/test) against a
// real router in front of two real nodes and the real API server, as scripts/test-live.sh runs
// them against one bothyd. It needs node and the SDK's packages (cd sdk/typescript && npm ci
// --ignore-scripts && npm run build); without them it skips.
func TestClusterTSSDKLive(t *testing.T) {
	sdkDir, err := filepath.Abs(filepath.Join("..", "sdk", "typescript"))
	if err != nil {
		t.Fatal(err)
	}
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the SDK's tests need it")
	}
	var files []string
	for _, f := range tsRouterFiles {
		path := filepath.Join(sdkDir, "dist", "test", f+".test.js")
		if _, err := os.Stat(path); err != nil {
			t.Skip("the SDK is not built: run `cd sdk/typescript && npm ci --ignore-scripts && npm run build`")
		}
		files = append(files, path)
	}
	cp, admin, ctx := startInstalledCluster(t, 15*time.Minute, clusterNodeUser, clusterRouterUser)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterNodeUser); err != nil {
		t.Fatal(err)
	}
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	for _, name := range []string{"node-a", "node-b"} {
		d := startDaemon(t, withToken(nodeToken), withArgs("--cluster-node", "--cluster-kubeconfig", kubeconfig,
			"--cluster-node-name", name, "--cluster-lease-duration", "6s",
			"--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"))
		waitObject(t, admin, name+" published", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
			if n.Status.Address != d.URL {
				return fmt.Errorf("address %q, want %q", n.Status.Address, d.URL)
			}
			return nil
		})
	}
	url := startRouter(t, cp, routerToken, nodeToken)
	cmd := exec.CommandContext(ctx, nodeBin, append([]string{"--test", "--test-concurrency=1"}, files...)...)
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(), "BOTHY_URL="+url, "BOTHY_TOKEN="+routerToken)
	out, err := cmd.CombinedOutput()
	t.Logf("the TypeScript SDK's live tests through the router:\n%s", out)
	if err != nil {
		t.Fatalf("the TypeScript SDK's live tests through the router failed: %v", err)
	}
	if !strings.Contains(string(out), "# fail 0\n") {
		t.Fatal("the SDK's tests did not all pass")
	}
}
