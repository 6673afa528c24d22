package tests

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// hostileRegistry is a registry on loopback that breaks a pull's bounds one way per
// repository, counting the requests each draws. It holds nothing large: oversized bodies are
// streamed from one small buffer.
type hostileRegistry struct {
	mu    sync.Mutex
	count map[string]int
}

const hostileBytes = 200 << 20

func hostileDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// hostileManifest is an OCI manifest naming a configuration of cfgSize bytes and n layers.
func hostileManifest(cfgSize int64, n int) []byte {
	layers := make([]map[string]any, n)
	for i := range layers {
		layers[i] = map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
			"digest": hostileDigest(fmt.Appendf(nil, "layer %d", i)), "size": 10}
	}
	b, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": hostileDigest([]byte("config")), "size": cfgSize},
		"layers": layers,
	})
	return b
}

func (h *hostileRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v2/"), "/")
	if len(parts) != 3 {
		w.WriteHeader(http.StatusOK) // the ping, /v2/
		return
	}
	repo, kind := parts[0], parts[1]
	h.mu.Lock()
	h.count[repo]++
	h.mu.Unlock()
	stream := func() {
		chunk := make([]byte, 64<<10)
		for i := range chunk {
			chunk[i] = ' '
		}
		for n := 0; n < hostileBytes; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}
	w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
	switch {
	case repo == "loop":
		http.Redirect(w, r, "http://"+r.Host+r.URL.Path, http.StatusFound)
	case repo == "huge" && kind == "manifests":
		stream()
	case repo == "bigconfig" && kind == "manifests":
		w.Write(hostileManifest(hostileBytes, 1))
	case repo == "many" && kind == "manifests":
		w.Write(hostileManifest(100, 5000))
	case kind == "blobs":
		stream()
	default:
		http.NotFound(w, r)
	}
}

func (h *hostileRegistry) requests(repo string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count[repo]
}

// procStatus reads a field of /proc/<pid>/status in bytes (VmRSS, VmHWM).
func procStatus(t testing.TB, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// TestHostileRegistryPull pulls from a registry that redirects in a loop, serves a 200 MiB
// manifest, declares a 200 MiB configuration and 5000 layers: each pull fails with a message
// that says which bound, the registry sees a bounded number of requests, and bothyd's memory
// at its peak stays within hostilePullGrowth of what it was before (issue 37: a redirect loop
// drew ~50 000 requests and grew the server by 250 MB, a 200 MiB manifest by 245 MB).
func TestHostileRegistryPull(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// The bound is on the growth of the peak resident set over the pulls: each reads at most
	// a 4 MiB manifest or an 8 MiB configuration, and the Go runtime's heap target doubles
	// what is live; 64 MiB leaves room for that and for the pull's own goroutines and
	// buffers, and is a quarter of what one redirect loop cost before.
	const hostilePullGrowth = 64 << 20
	// A refused pull draws from its repository one request and its redirects (at most 5);
	// a broken bound is not retried.
	const maxRequests = 5 + 1
	h := &hostileRegistry{count: map[string]int{}}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	d := startDaemon(t)
	pid := d.cmd.Process.Pid

	pull := func(repo string) imageJSON {
		t.Helper()
		name := repo + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		decode[imageJSON](t, d.doJSON("POST", "/v1/images", map[string]any{"ref": host + "/" + repo + ":1", "name": name}), 202)
		var img imageJSON
		waitFor(t, time.Minute, "the pull of "+repo+" to end", func() bool {
			img = decode[imageJSON](t, d.doJSON("GET", "/v1/images/"+name, nil), 200)
			return img.State != "pulling"
		})
		return img
	}
	// One pull first, so that what every pull sets up once (the registry client, its
	// connection pools) is in the baseline.
	pull("loop")
	before := procStatus(t, pid, "VmRSS")

	for _, tc := range []struct{ repo, want string }{
		{"loop", "redirected a request"},
		{"huge", "manifest"},
		{"bigconfig", "configuration of 209715200 bytes"},
		{"many", "5000 layers"},
	} {
		for range 3 {
			img := pull(tc.repo)
			if img.State != "failed" || !strings.Contains(img.Error, tc.want) {
				t.Errorf("pull of %s: %s %q; want failed, saying %q", tc.repo, img.State, img.Error, tc.want)
			}
		}
		// Three pulls each, and the first pull of the loop.
		if n := h.requests(tc.repo); n > 4*maxRequests {
			t.Errorf("the pulls of %s drew %d requests; want at most %d", tc.repo, n, 4*maxRequests)
		}
	}
	peak := procStatus(t, pid, "VmHWM")
	t.Logf("bothyd: resident %d MiB before the hostile pulls, peak %d MiB after", before>>20, peak>>20)
	if peak-before > hostilePullGrowth {
		t.Errorf("bothyd's peak resident set grew by %d MiB over the hostile pulls; want at most %d MiB", (peak-before)>>20, hostilePullGrowth>>20)
	}
}
