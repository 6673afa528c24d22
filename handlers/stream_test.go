package handlers

import (
	"net/http/httptest"
	"testing"
	"time"
)

func TestParseStreamQuery(t *testing.T) {
	t.Parallel()
	cases := []struct {
		query string
		ok    bool
	}{
		{"command=sh", true},
		{"command=sh&command=-c&command=echo+hi&env=A%3D1&cwd=/tmp&user=root&tty=true&rows=30&cols=100&timeout_ms=5000&wait_ms=10", true},
		{"", false},
		{"command=sh&tty=maybe", false},
		{"command=sh&rows=0", false},
		{"command=sh&cols=100000", false},
		{"command=sh&timeout_ms=0", false},
		{"command=sh&timeout_ms=99999999999", false},
		{"command=sh&wait_ms=-5", false},
	}
	for _, tc := range cases {
		r := httptest.NewRequest("GET", "/v1/sandboxes/a/exec/stream?"+tc.query, nil)
		req, wait, err := parseStreamQuery(r)
		if (err == nil) != tc.ok {
			t.Errorf("%q: err = %v, want ok=%v", tc.query, err, tc.ok)
		}
		if err == nil && (len(req.Argv) == 0 || wait <= 0 || req.TimeoutMS <= 0) {
			t.Errorf("%q: accepted as %+v, wait %v", tc.query, req, wait)
		}
	}
}

// FuzzStreamQuery: whatever the query, parsing never panics, and what it accepts is within
// the bounds the agent and the admission rely on.
func FuzzStreamQuery(f *testing.F) {
	for _, seed := range []string{
		"command=sh", "command=sh&tty=1&rows=5&cols=5", "command=&wait_ms=1", "command=a&timeout_ms=3600000",
		"command=%00", "rows=65536&command=x", "command=x&cols=-1", "command=x;y", "%zz",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, query string) {
		r := httptest.NewRequest("GET", "/v1/sandboxes/a/exec/stream", nil)
		r.URL.RawQuery = query
		req, wait, err := parseStreamQuery(r)
		if err != nil {
			return
		}
		if len(req.Argv) == 0 {
			t.Fatalf("%q: accepted without a command", query)
		}
		if wait <= 0 || wait > time.Hour {
			t.Fatalf("%q: wait %v", query, wait)
		}
		if req.TimeoutMS <= 0 || req.TimeoutMS > streamTimeout.Milliseconds() {
			t.Fatalf("%q: timeout %d", query, req.TimeoutMS)
		}
		if req.TTY && (req.Rows > 1000 || req.Cols > 1000) {
			t.Fatalf("%q: size %dx%d", query, req.Rows, req.Cols)
		}
	})
}
