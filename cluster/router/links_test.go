package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/bothy/bothy/portlink"
)

// TestLinkRouting: a link's request goes, without any token, to the node whose tag begins
// the link's id; a link of a lost node is 503 node-lost without naming the node; a link of
// no node, or no link's shape, is 404 link-not-found.
func TestLinkRouting(t *testing.T) {
	t.Parallel()
	// The node "up": a link's request reaches it with neither the client's token nor the
	// node's, and the path and query unchanged but for access_token.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" || r.URL.Query().Has("access_token") {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Node", "up")
		w.Header().Set("X-Path", r.URL.RequestURI())
		w.Header().Set("X-Host", r.Host)
		w.WriteHeader(http.StatusTeapot)
	}))
	t.Cleanup(up.Close)
	rt := newRouter(t, up.URL)
	sig := ".mX0cJ2p6dQm3u9b1Yk7wq4eRtZs8aVn5LhG0fDjCkIo"
	onUp := portlink.NodeTag("up") + strings.Repeat("0", portlink.IDLen-portlink.TagLen) + sig
	onDown := portlink.NodeTag("down") + strings.Repeat("0", portlink.IDLen-portlink.TagLen) + sig
	onNone := portlink.NodeTag("gone") + strings.Repeat("0", portlink.IDLen-portlink.TagLen) + sig
	tests := []struct {
		name, method, path, auth string
		wantStatus               int
		wantCode                 string
	}{
		{"to its node", "GET", "/p/" + onUp + "/page?q=1", "", http.StatusTeapot, ""},
		{"a post", "POST", "/p/" + onUp + "/form", "", http.StatusTeapot, ""},
		{"the client's token goes no further", "GET", "/p/" + onUp + "/?access_token=client-token", "Bearer client-token", http.StatusTeapot, ""},
		{"without its slash, for the node to redirect", "GET", "/p/" + onUp, "", http.StatusTeapot, ""},
		{"a lost node", "GET", "/p/" + onDown + "/", "", http.StatusServiceUnavailable, CodeNodeLost},
		{"no node", "GET", "/p/" + onNone + "/", "", http.StatusNotFound, "link-not-found"},
		{"no token", "GET", "/p/", "", http.StatusNotFound, "link-not-found"},
		{"no link's shape", "GET", "/p/nothing/", "", http.StatusNotFound, "link-not-found"},
		{"bare /p", "GET", "/p", "", http.StatusNotFound, "link-not-found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(tc.method, "http://router.example"+tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			w := httptest.NewRecorder()
			rt.ServeHTTP(w, req)
			if w.Code != tc.wantStatus {
				t.Fatalf("%d %s, want %d", w.Code, w.Body, tc.wantStatus)
			}
			if tc.wantStatus == http.StatusTeapot {
				want := strings.Replace(tc.path, "?access_token=client-token", "", 1)
				if w.Header().Get("X-Node") != "up" || w.Header().Get("X-Path") != want || w.Header().Get("X-Host") != "router.example" {
					t.Fatalf("reached %q at %q for the host %q, want up at %q for router.example", w.Header().Get("X-Node"), w.Header().Get("X-Path"), w.Header().Get("X-Host"), want)
				}
				return
			}
			var p struct{ Code, Detail string }
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Code != tc.wantCode {
				t.Fatalf("%s, want the code %s", w.Body, tc.wantCode)
			}
			if strings.Contains(p.Detail, `"down"`) || strings.Contains(p.Detail, `"up"`) {
				t.Fatalf("the detail names a node: %s", p.Detail)
			}
		})
	}
}
