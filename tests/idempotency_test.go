package tests

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
)

// TestIdempotencyKeySurvivesRestart: a create with an Idempotency-Key, repeated after bothyd
// was SIGKILLed and started again, gets the first answer (and creates nothing); the same key
// with another body is refused 422 idempotency-key-reused; another credential's key of the
// same name is a key of its own. Both bothyd's create and E2B's are covered.
func TestIdempotencyKeySurvivesRestart(t *testing.T) {
	requireRoot(t)
	d := startDaemon(t)
	post := func(path, key, body string, header http.Header) response {
		t.Helper()
		h := http.Header{"Idempotency-Key": {key}}
		for k, v := range header {
			h[k] = v
		}
		return d.do("POST", path, bytes.NewReader([]byte(body)), h)
	}
	t.Cleanup(func() {
		for _, id := range []string{"idem-a", "idem-b"} {
			d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
		}
	})

	first := post("/v1/sandboxes", "create-a", `{"id":"idem-a"}`, nil)
	if first.Status != 201 || first.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the first create: %d %s", first.Status, first.Body)
	}
	e2bKey := http.Header{"X-Api-Key": {"e2b_" + d.Token}, "Authorization": nil}
	e2bFirst := post("/sandboxes", "create-e2b", `{"templateID":"base"}`, e2bKey)
	if e2bFirst.Status != 201 {
		t.Fatalf("the first E2B create: %d %s", e2bFirst.Status, e2bFirst.Body)
	}
	var e2bSandbox struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(e2bFirst.Body, &e2bSandbox); err != nil || e2bSandbox.SandboxID == "" {
		t.Fatalf("the E2B answer: %v %s", err, e2bFirst.Body)
	}
	t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/"+e2bSandbox.SandboxID+"/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/"+e2bSandbox.SandboxID, nil)
	})

	d.Restart(true)

	again := post("/v1/sandboxes", "create-a", `{"id":"idem-a"}`, nil)
	if again.Status != 201 || !bytes.Equal(again.Body, first.Body) || again.Header.Get("Idempotent-Replayed") != "true" ||
		again.Header.Get("Location") != first.Header.Get("Location") {
		t.Fatalf("the repeat after a restart: %d %v %s, want the first answer %s", again.Status, again.Header, again.Body, first.Body)
	}
	e2bAgain := post("/sandboxes", "create-e2b", `{"templateID":"base"}`, e2bKey)
	if e2bAgain.Status != 201 || !bytes.Equal(e2bAgain.Body, e2bFirst.Body) {
		t.Fatalf("the E2B repeat after a restart: %d %s, want %s", e2bAgain.Status, e2bAgain.Body, e2bFirst.Body)
	}
	list := decode[struct {
		Items []sandboxJSON `json:"items"`
	}](t, d.doJSON("GET", "/v1/sandboxes", nil), 200)
	if len(list.Items) != 2 {
		t.Fatalf("%d sandboxes after the repeats, want 2 (idem-a and the E2B one): %+v", len(list.Items), list.Items)
	}

	wantProblem(t, post("/v1/sandboxes", "create-a", `{"id":"idem-b"}`, nil), 422, "idempotency-key-reused")
	wantProblem(t, post("/sandboxes", "create-e2b", `{"templateID":"base","timeout":60}`, e2bKey), 422, "idempotency-key-reused")
	wantProblem(t, d.doJSON("GET", "/v1/sandboxes/idem-b", nil), 404, "sandbox-not-found")

	// The same key name under another credential is a key of its own: the first create's
	// answer is not that client's to read, and its request runs.
	other := post("/sandboxes", "create-a", `{"templateID":"base"}`, http.Header{"X-Api-Key": {d.Token}, "Authorization": nil})
	if other.Status != 201 || other.Header.Get("Idempotent-Replayed") != "" || bytes.Equal(other.Body, first.Body) {
		t.Fatalf("another credential's create-a: %d %v %s", other.Status, other.Header, other.Body)
	}
	var o struct {
		SandboxID string `json:"sandboxID"`
	}
	_ = json.Unmarshal(other.Body, &o)
	d.doJSON("POST", "/v1/sandboxes/"+o.SandboxID+"/stop?force=true", nil)
	d.doJSON("DELETE", "/v1/sandboxes/"+o.SandboxID, nil)
}
