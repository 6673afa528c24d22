package web

import (
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	t.Parallel()
	h := Handler()
	cases := []struct {
		name, path string
		status     int
		ctype      string
		contains   string
	}{
		{"page", "/", 200, "text/html", `<script src="/assets/app.js" defer></script>`},
		{"script", "/assets/app.js", 200, "text/javascript", `"use strict"`},
		{"style", "/assets/app.css", 200, "text/css", "--accent"},
		{"vendored xterm", "/assets/vendor/xterm.js", 200, "text/javascript", "Terminal"},
		{"API reference", "/docs", 200, "text/html", `<script src="/assets/docs.js" defer></script>`},
		{"API reference script", "/assets/docs.js", 200, "text/javascript", `Redoc.init("/openapi.yaml"`},
		{"vendored Redoc", "/assets/vendor/redoc.standalone.js", 200, "text/javascript", "ReDoc"},
		{"unknown file", "/assets/nope.js", 404, "application/problem+json", `"code":"not-found"`},
		{"no listing", "/assets/", 404, "application/problem+json", `"code":"not-found"`},
		{"no listing without slash", "/assets/vendor", 404, "application/problem+json", `"code":"not-found"`},
		{"no escape", "/assets/../web.go", 404, "application/problem+json", `"code":"not-found"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", tc.path, nil))
			if rec.Code != tc.status || !strings.HasPrefix(rec.Header().Get("Content-Type"), tc.ctype) {
				t.Fatalf("%s: %d %q, want %d %q", tc.path, rec.Code, rec.Header().Get("Content-Type"), tc.status, tc.ctype)
			}
			if !strings.Contains(rec.Body.String(), tc.contains) {
				t.Fatalf("%s: the body lacks %q", tc.path, tc.contains)
			}
			csp := rec.Header().Get("Content-Security-Policy")
			if !strings.Contains(csp, "script-src 'self';") || !strings.Contains(csp, "frame-ancestors 'none'") {
				t.Fatalf("%s: Content-Security-Policy %q", tc.path, csp)
			}
		})
	}
}

// The pages have no inline script or handler attribute: the policy would block them.
func TestNoInlineScript(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"index.html", "docs.html"} {
		page, err := files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		s := string(page)
		if strings.Contains(s, "<script>") || strings.Contains(s, " onclick=") || strings.Contains(s, "javascript:") {
			t.Fatalf("%s has inline script", name)
		}
		for _, tag := range strings.Split(s, "<script")[1:] {
			if !strings.HasPrefix(strings.TrimSpace(tag), "src=") {
				t.Fatalf("%s: a script without src: <script%s", name, tag[:min(len(tag), 60)])
			}
		}
	}
}
