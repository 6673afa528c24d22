package kubetest

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// TestCacheKeyMatchesScript: the harness looks for the binaries where scripts/kube/build
// puts them, so the two hashes of the control plane's module must agree.
func TestCacheKeyMatchesScript(t *testing.T) {
	if os.Getenv(EnvBin) != "" {
		t.Skipf("%s is set: the harness does not compute the cache directory", EnvBin)
	}
	module, err := controlPlaneModule()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", filepath.Join(module, "..", "build"), "--dir").Output()
	if err != nil {
		t.Fatalf("scripts/kube/build --dir: %v", err)
	}
	script := strings.TrimSpace(string(out))
	dir, _ := Binaries() // the binaries may be missing; the directory is what is compared
	if dir != script {
		t.Fatalf("the harness looks in %s, scripts/kube/build builds into %s", dir, script)
	}
}

// TestMissingBinariesSayHowToBuild: a directory without the binaries is an error that names
// the script, which Start turns into the skip (or, with BOTHY_KUBE_REQUIRED, the failure).
func TestMissingBinariesSayHowToBuild(t *testing.T) {
	t.Setenv(EnvBin, t.TempDir())
	_, err := Binaries()
	if err == nil || !strings.Contains(err.Error(), "scripts/kube/build") {
		t.Fatalf("got %v, want an error naming scripts/kube/build", err)
	}
}

// TestStart starts the control plane and lists namespaces as the admin, which may, and as
// a user with no role, whom RBAC refuses: the tokens authenticate and RBAC authorizes.
func TestStart(t *testing.T) {
	cp := Start(t, Options{Users: []string{"someone"}})
	for user, want := range map[string]int{Admin: http.StatusOK, "someone": http.StatusForbidden} {
		transport, err := rest.TransportFor(cp.ConfigFor(user))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, cp.URL+"/api/v1/namespaces", nil)
		resp, err := (&http.Client{Transport: transport}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("GET /api/v1/namespaces as %s: %s, want %d", user, resp.Status, want)
		}
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kc, "someone"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(kc); err != nil {
		t.Fatal(err)
	}
}
