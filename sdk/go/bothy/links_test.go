package bothy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestPortLinks: the link calls reach their routes with their bodies (no ttl_s when none is
// given), a sandbox's and a port's lists decode, and a revocation's refusal is its code.
func TestPortLinks(t *testing.T) {
	t.Parallel()
	var seen []string
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen = append(seen, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+string(body)))
		w.Header().Set("Content-Type", "application/json")
		const info = `{"id":"0123456789abcdef0123456789abcdef","sandbox":"demo","port":8000,"created_at":"2026-12-01T00:00:00Z","expires_at":"2026-12-01T01:00:00Z"}`
		switch r.Method {
		case "POST":
			w.WriteHeader(201)
			_, _ = io.WriteString(w, `{"id":"0123456789abcdef0123456789abcdef","sandbox":"demo","port":8000,"token":"t.s","path":"/p/t.s/","created_at":"2026-12-01T00:00:00Z","expires_at":"2026-12-01T01:00:00Z"}`)
		case "GET":
			_, _ = io.WriteString(w, `{"items":[`+info+`]}`)
		default:
			problem(w, 404, "link-not-found", "No such link.")
		}
	}))
	ctx := context.Background()
	if l, err := c.CreatePortLink(ctx, "demo", 8000, 10*time.Minute); err != nil || l.Path != "/p/t.s/" {
		t.Fatalf("CreatePortLink: %+v, %v", l, err)
	}
	if _, err := c.CreatePortLink(ctx, "demo", 8000, 0); err != nil {
		t.Fatal(err)
	}
	for _, port := range []int{0, 8000} {
		if list, err := c.PortLinks(ctx, "demo", port); err != nil || len(list) != 1 || list[0].Port != 8000 {
			t.Fatalf("PortLinks(%d): %+v, %v", port, list, err)
		}
	}
	if err := c.RevokePortLink(ctx, "demo", 8000, "gone"); !IsCode(err, ErrLinkNotFound) {
		t.Fatalf("RevokePortLink of none: %v", err)
	}
	want := []string{`POST /v1/sandboxes/demo/ports/8000/links {"ttl_s":600}`, `POST /v1/sandboxes/demo/ports/8000/links {}`,
		"GET /v1/sandboxes/demo/links", "GET /v1/sandboxes/demo/ports/8000/links", "DELETE /v1/sandboxes/demo/ports/8000/links/gone"}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}
