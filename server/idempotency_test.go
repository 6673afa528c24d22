package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bothy/bothy/idempotency"
)

// TestIdempotentCreate: the first answer of a create with a key is replayed for the same
// request and credential, another request with the key is refused 422, a repeat while the
// first runs is refused 409, and another credential's key of the same name is its own.
func TestIdempotentCreate(t *testing.T) {
	t.Parallel()
	store, err := idempotency.Open(t.TempDir(), idempotency.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newTestServer(t, Config{})
	var created atomic.Int32
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	// Behind matchContract, as the server has it: the contract's operation says what a create is.
	h := s.matchContract(s.idempotent(store, 1<<20)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "slow") {
			entered <- struct{}{}
			<-release
		}
		n := created.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/sandboxes/x")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"n":`+string(rune('0'+n))+`}`)
	})))
	do := func(token, key, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/sandboxes", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if key != "" {
			req.Header.Set(IdempotencyHeader, key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}

	first := do("alice", "k", `{"id":"x"}`)
	again := do("alice", "k", `{"id":"x"}`)
	if first.Code != 201 || again.Code != 201 || again.Body.String() != first.Body.String() ||
		again.Header().Get("Location") != "/v1/sandboxes/x" || again.Header().Get(ReplayedHeader) != "true" || created.Load() != 1 {
		t.Fatalf("first %d %s, repeat %d %s %v; %d creates", first.Code, first.Body, again.Code, again.Body, again.Header(), created.Load())
	}
	if rec := do("alice", "k", `{"id":"y"}`); rec.Code != 422 || decodeProblem(t, rec).Code != "idempotency-key-reused" {
		t.Fatalf("another body: %d %s", rec.Code, rec.Body)
	}
	if rec := do("bob", "k", `{"id":"x"}`); rec.Code != 201 || rec.Header().Get(ReplayedHeader) != "" || created.Load() != 2 {
		t.Fatalf("another credential: %d %v", rec.Code, rec.Header())
	}
	if rec := do("alice", "", `{"id":"x"}`); rec.Code != 201 || created.Load() != 3 {
		t.Fatalf("without a key: %d", rec.Code)
	}

	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- do("alice", "slow-key", `{"id":"slow"}`) }()
	<-entered
	if rec := do("alice", "slow-key", `{"id":"slow"}`); rec.Code != 409 || decodeProblem(t, rec).Code != "idempotency-key-in-flight" || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("a repeat in flight: %d %s", rec.Code, rec.Body)
	}
	close(release)
	if rec := <-done; rec.Code != 201 {
		t.Fatalf("the slow first: %d", rec.Code)
	}
	if rec := do("alice", "slow-key", `{"id":"slow"}`); rec.Header().Get(ReplayedHeader) != "true" {
		t.Fatalf("after the slow first: %d %v", rec.Code, rec.Header())
	}
	if rec := do("alice", "k", "\x00"); rec.Code != 422 {
		t.Fatalf("a bad body with a used key: %d", rec.Code)
	}
}

func TestIsCreate(t *testing.T) {
	t.Parallel()
	s, _ := newTestServer(t, Config{})
	isCreateRoute := func(method, path string) bool {
		var got bool
		s.matchContract(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = isCreate(r) })).
			ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, path, nil))
		return got
	}
	for path, want := range map[string]bool{
		"/v1/sandboxes": true, "/sandboxes": true, "/v1/templates": true, "/v1/templates/t/generations": true,
		"/v1/images": true, "/v1/webhooks": true, "/v1/sandboxes/a/ports/80/links": true,
		"/v1/sandboxes/a/exec": false, "/v1/sandboxes/a/start": false, "/v1/templates/t/generations/g/tombstone": false,
	} {
		if got := isCreateRoute(http.MethodPost, path); got != want {
			t.Errorf("isCreate(POST %s) = %v", path, got)
		}
	}
	if isCreateRoute(http.MethodGet, "/v1/sandboxes") {
		t.Error("a GET is a create")
	}
}
