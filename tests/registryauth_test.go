package tests

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
)

// secretVolume lays out files as the kubelet lays out a Secret's volume: the files in a
// timestamped directory, a link ..data to it, and each name a link through ..data, read-only
// (the chart's defaultMode 0400).
func secretVolume(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_12_07_14_00_00.000000001")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(data, name), content, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRegistryCredentialsFromSecretMount: a node given the registries' credentials as the
// Helm chart gives them (node.registries.authSecret: a kubernetes.io/dockerconfigjson
// Secret mounted at /run/secrets/bothy-registry, BOTHY_REGISTRY_AUTH naming its
// config.json; docs/cluster.md) pushes its captures to a template registry that refuses
// anonymous requests, and another node with the same mount pulls and clones them. The
// registry refuses what comes without the credentials, so the push shows they were sent.
func TestRegistryCredentialsFromSecretMount(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	const user, password = "bothy", "s3cret-registry-password"
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"credentials required"}]}`, http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	// What `kubectl create secret docker-registry` stores under .dockerconfigjson.
	cfg, err := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{
		"username": user, "password": password, "auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))}}})
	if err != nil {
		t.Fatal(err)
	}
	mount := secretVolume(t, map[string][]byte{"config.json": cfg})
	opts := []daemonOption{withArgs("--template-registry", host+"/bothy/templates"), withEnv("BOTHY_REGISTRY_AUTH=" + filepath.Join(mount, "config.json"))}
	a, b := startDaemon(t, opts...), startDaemon(t, opts...)

	if resp, err := http.Get(srv.URL + "/v2/"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the registry without credentials: %v %v, want 401", resp, err)
	} else {
		resp.Body.Close()
	}
	g := a.buildTemplate("tools")
	// The push with the mounted credentials.
	waitManifest(t, srv.URL, "tools."+g.ID, func(r *http.Request) { r.SetBasicAuth(user, password) })
	c := decode[cloneJSON](t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b1", "template": "tools", "generation": g.ID, "start": true}), 201)
	if c.Template == nil || c.Template.Generation != g.ID {
		t.Fatalf("B's clone: %+v", c)
	}
	if got := b.exec("b1", map[string]any{"command": []string{"/opt/tool/run", "x"}}); got.ExitCode != 0 || !strings.Contains(got.Stdout, "tool says x") {
		t.Fatalf("the tool in B's clone: %+v", got)
	}
}
