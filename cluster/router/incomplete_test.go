package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// TestCreateOnIncompleteImageList: a node that holds more images than its status lists is a
// possible holder of an image it does not list. A create of an image that one full node
// lists reaches the node that holds it unlisted; a node with an incomplete list that turns
// out not to hold the image answers image-not-found, which the router does not pass on while
// another possible holder is untried; when no possible holder is left, it does.
func TestCreateOnIncompleteImageList(t *testing.T) {
	t.Parallel()
	type fakeNode struct {
		holds      bool
		free       int32 // free slots of 10: placement prefers the emptier node
		incomplete bool
		lists      bool
	}
	tests := []struct {
		name       string
		nodes      map[string]fakeNode
		wantStatus int
		wantCode   string
		wantOn     string   // the node that made the sandbox
		wantAsked  []string // the nodes asked to create, in order
	}{
		{
			name: "the lister is full; an incomplete node holds it unlisted",
			nodes: map[string]fakeNode{
				"lister":   {holds: true, free: 0, lists: true},
				"unlisted": {holds: true, free: 5, incomplete: true},
				"other":    {free: 9},
			},
			wantStatus: 201, wantOn: "unlisted", wantAsked: []string{"unlisted"},
		},
		{
			name: "an incomplete node lacks it: placed again on one that may hold it",
			nodes: map[string]fakeNode{
				"lister":  {holds: true, free: 0, lists: true},
				"lacks":   {free: 9, incomplete: true},
				"holds":   {holds: true, free: 5, incomplete: true},
				"neither": {free: 8},
			},
			wantStatus: 201, wantOn: "holds", wantAsked: []string{"lacks", "holds"},
		},
		{
			name: "no node lists it: an incomplete node is preferred, and placed again on the next",
			nodes: map[string]fakeNode{
				"complete": {free: 9},
				"lacks":    {free: 8, incomplete: true},
				"holds":    {holds: true, free: 5, incomplete: true},
			},
			wantStatus: 201, wantOn: "holds", wantAsked: []string{"lacks", "holds"},
		},
		{
			name: "no possible holder left: the node's image-not-found is the answer",
			nodes: map[string]fakeNode{
				"complete": {free: 9},
				"lacks":    {free: 5, incomplete: true},
			},
			wantStatus: 404, wantCode: "image-not-found", wantAsked: []string{"lacks"},
		},
		{
			name: "the only other possible holder lists it and is full: no room, not image-not-found",
			nodes: map[string]fakeNode{
				"lister": {holds: true, free: 0, lists: true},
				"lacks":  {free: 9, incomplete: true},
			},
			wantStatus: 503, wantCode: CodeNoNode, wantAsked: []string{"lacks"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var asked []string
			urls := map[string]string{}
			for name, fn := range tt.nodes {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method != "POST" || r.URL.Path != "/v1/sandboxes" {
						w.WriteHeader(http.StatusNotFound)
						return
					}
					mu.Lock()
					asked = append(asked, name)
					mu.Unlock()
					w.Header().Set("Content-Type", "application/json")
					if !fn.holds {
						w.WriteHeader(http.StatusNotFound)
						_, _ = w.Write([]byte(`{"code":"image-not-found","detail":"No image big here."}`))
						return
					}
					w.WriteHeader(http.StatusCreated)
					_ = json.NewEncoder(w).Encode(map[string]string{"id": "sb", "node": name})
				}))
				t.Cleanup(srv.Close)
				urls[name] = srv.URL
			}
			rt := routerOver(t, urls)
			for name, fn := range tt.nodes {
				var n v1alpha1.BothyNode
				if err := rt.cfg.Client.Get(t.Context(), client.ObjectKey{Name: name}, &n); err != nil {
					t.Fatal(err)
				}
				n.Status.Capacity = v1alpha1.Capacity{MemoryMB: 100000, MilliCPU: 100000, Sandboxes: 10}
				n.Status.Free = v1alpha1.Capacity{MemoryMB: 100000, MilliCPU: 100000, Sandboxes: fn.free}
				n.Status.Images = []string{"host"}
				if fn.lists {
					n.Status.Images = append(n.Status.Images, "big")
				}
				n.Status.ImagesIncomplete = fn.incomplete
				if err := rt.cfg.Client.Update(t.Context(), &n); err != nil {
					t.Fatal(err)
				}
			}
			req := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(`{"image":"big"}`))
			req.Header.Set("Authorization", "Bearer client-token")
			w := httptest.NewRecorder()
			rt.ServeHTTP(w, req)
			var got struct{ Node, Code string }
			_ = json.Unmarshal(w.Body.Bytes(), &got)
			if w.Code != tt.wantStatus || got.Node != tt.wantOn || got.Code != tt.wantCode {
				t.Fatalf("the create: %d %s, want %d on %q (code %q)", w.Code, w.Body, tt.wantStatus, tt.wantOn, tt.wantCode)
			}
			mu.Lock()
			defer mu.Unlock()
			if strings.Join(asked, ",") != strings.Join(tt.wantAsked, ",") {
				t.Fatalf("the nodes asked: %v, want %v", asked, tt.wantAsked)
			}
		})
	}
}
