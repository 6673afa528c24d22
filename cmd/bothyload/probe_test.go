package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// waitForProbes waits while a runtime is probing, says so once, and returns once none is.
func TestWaitForProbes(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/info" {
			http.NotFound(w, r)
			return
		}
		state := "probing"
		if calls.Add(1) > 2 {
			state = "ready"
		}
		fmt.Fprintf(w, `{"runtimes":[{"kind":"namespace","state":"ready"},{"kind":"microvm","state":%q}]}`, state)
	}))
	defer srv.Close()
	var log strings.Builder
	if err := newAPI(srv.URL, "", 1).waitForProbes(context.Background(), &log); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("asked %d times, want 3 (twice probing, then ready)", n)
	}
	if got := log.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "microvm runtime probe") {
		t.Fatalf("said %q, want one line naming the microvm probe", got)
	}
}
