package tests

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/openapi"
)

// hookReceiver is a webhook receiver on loopback that is down (answers 503) for its first
// `down` deliveries and takes the rest, verifying each one's signature independently of
// package webhook: HMAC-SHA256(secret, "<Bothy-Timestamp>.<body>"), as docs/webhooks.md says.
type hookReceiver struct {
	t      *testing.T
	secret string
	down   int
	srv    *httptest.Server

	mu       sync.Mutex
	attempts int
	took     map[int64]int // event id: deliveries taken
	types    map[int64]string
}

func newHookReceiver(t *testing.T, secret string, down int) *hookReceiver {
	r := &hookReceiver{t: t, secret: secret, down: down, took: map[int64]int{}, types: map[int64]string{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *hookReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		r.t.Errorf("reading a delivery: %v", err)
		return
	}
	ts := req.Header.Get("Bothy-Timestamp")
	m := hmac.New(sha256.New, []byte(r.secret))
	m.Write([]byte(ts + "."))
	m.Write(body)
	want := "v1=" + hex.EncodeToString(m.Sum(nil))
	if got := req.Header.Get("Bothy-Signature"); !hmac.Equal([]byte(got), []byte(want)) {
		r.t.Errorf("a delivery's signature %q does not verify (want %q)", got, want)
	}
	if n, err := strconv.ParseInt(ts, 10, 64); err != nil || time.Since(time.Unix(n, 0)).Abs() > 5*time.Minute {
		r.t.Errorf("a delivery's timestamp %q is not now", ts)
	}
	var e openapi.Event
	if err := json.Unmarshal(body, &e); err != nil {
		r.t.Errorf("a delivery's body is not an event: %v: %s", err, body)
	}
	if id := req.Header.Get("Bothy-Event-Id"); id != strconv.FormatInt(e.Seq, 10) || req.Header.Get("Bothy-Event-Type") != e.Type {
		r.t.Errorf("headers %q %q for event %d %s", id, req.Header.Get("Bothy-Event-Type"), e.Seq, e.Type)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts++
	if r.attempts <= r.down {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	r.took[e.Seq]++
	r.types[e.Seq] = e.Type
	w.WriteHeader(http.StatusNoContent)
}

func (r *hookReceiver) state() (attempts int, took map[int64]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	took = map[int64]int{}
	for k, v := range r.took {
		took[k] = v
	}
	return r.attempts, took
}

type webhookJSON struct {
	ID       string   `json:"id"`
	URL      string   `json:"url"`
	Events   []string `json:"events"`
	Delivery struct {
		Pending       int        `json:"pending"`
		Delivered     int64      `json:"delivered"`
		LastStatus    int        `json:"last_status"`
		LastError     string     `json:"last_error"`
		NextAttemptAt *time.Time `json:"next_attempt_at"`
	} `json:"delivery"`
}

// TestWebhookDeliversThroughOutageAndCrash: a receiver that is down for the first three
// deliveries, with bothyd SIGKILLed while events wait in the outbox and started again, gets
// every event of the types it asked for, as the event stream numbered them, once or more, each
// signed; the delivery state says what happened, and never carries the secret.
func TestWebhookDeliversThroughOutageAndCrash(t *testing.T) {
	requireRoot(t)
	const secret = "a-receiver-secret-0123456789"
	rcv := newHookReceiver(t, secret, 3)
	// The receiver is on loopback, where only --webhook-allow-private lets deliveries go.
	d := startDaemon(t, withArgs("--webhook-allow-private"))
	hook := decode[webhookJSON](t, d.doJSON("POST", "/v1/webhooks", map[string]any{
		"url": rcv.srv.URL + "/hook?k=v", "events": []string{"sandbox.created", "sandbox.deleted"}, "secret": secret,
	}), 201)
	if hook.Delivery.Pending != 0 || len(hook.Events) != 2 {
		t.Fatalf("a new webhook: %+v", hook)
	}

	// The events the stream shows are those the receiver must get.
	want := map[int64]string{}
	collect := func(s *sse, n int) {
		for range n {
			e := s.nextOf2("sandbox.created", "sandbox.deleted")
			want[e.Event.Seq] = e.Type
		}
	}
	s := d.subscribe("", false)
	d.create("hook-a", false)
	d.create("hook-b", false)
	if r := d.doJSON("DELETE", "/v1/sandboxes/hook-a", nil); r.Status != 204 {
		t.Fatalf("DELETE hook-a: %d %s", r.Status, r.Body)
	}
	collect(s, 3)

	// The receiver fails its first three deliveries; the third comes after backoffs of 1 s and
	// 2 s, and the next waits 4 s more: bothyd is killed in that wait, with events pending.
	waitFor(t, 30*time.Second, "three failed deliveries", func() bool {
		n, _ := rcv.state()
		return n >= 3
	})
	got := decode[webhookJSON](t, d.doJSON("GET", "/v1/webhooks/"+hook.ID, nil), 200)
	if got.Delivery.Pending == 0 || got.Delivery.LastStatus != 503 || got.Delivery.NextAttemptAt == nil {
		t.Fatalf("the delivery state after three failures: %+v", got.Delivery)
	}
	d.Restart(true)

	s = d.subscribe("", false)
	d.create("hook-c", false)
	for _, id := range []string{"hook-b", "hook-c"} {
		if r := d.doJSON("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("DELETE %s: %d %s", id, r.Status, r.Body)
		}
	}
	collect(s, 3)

	waitFor(t, 60*time.Second, "every event at the receiver", func() bool {
		_, took := rcv.state()
		for id := range want {
			if took[id] == 0 {
				return false
			}
		}
		return true
	})
	_, took := rcv.state()
	rcv.mu.Lock()
	for id, typ := range want {
		if rcv.types[id] != typ {
			t.Errorf("event %d arrived as %q, the stream had %q", id, rcv.types[id], typ)
		}
	}
	rcv.mu.Unlock()
	for id := range took {
		if _, ok := want[id]; !ok {
			t.Errorf("the receiver got event %d, which the stream did not show as one it asked for", id)
		}
	}

	waitFor(t, 30*time.Second, "an empty outbox", func() bool {
		got = decode[webhookJSON](t, d.doJSON("GET", "/v1/webhooks/"+hook.ID, nil), 200)
		return got.Delivery.Pending == 0
	})
	if got.Delivery.Delivered < int64(len(want)) || got.Delivery.LastError != "" {
		t.Fatalf("the delivery state at the end: %+v", got.Delivery)
	}
	list := d.doJSON("GET", "/v1/webhooks", nil)
	if list.Status != 200 || !strings.Contains(string(list.Body), hook.ID) || strings.Contains(string(list.Body), secret) {
		t.Fatalf("the list: %d %s", list.Status, list.Body)
	}
	if r := d.doJSON("DELETE", "/v1/webhooks/"+hook.ID, nil); r.Status != 204 {
		t.Fatalf("DELETE the webhook: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.doJSON("GET", "/v1/webhooks/"+hook.ID, nil), 404, "webhook-not-found")
}

// TestWebhookRefusesPrivateReceivers: without --webhook-allow-private a loopback URL is refused
// at create, and a name that resolves to loopback is refused when connected to, so the
// receiver never hears of it.
func TestWebhookRefusesPrivateReceivers(t *testing.T) {
	requireRoot(t)
	const secret = "a-receiver-secret-0123456789"
	rcv := newHookReceiver(t, secret, 0)
	d := startDaemon(t)
	p := wantProblem(t, d.doJSON("POST", "/v1/webhooks", map[string]any{
		"url": rcv.srv.URL, "events": []string{"sandbox.created"}, "secret": secret,
	}), 400, "invalid-request")
	if p.Field != "url" {
		t.Fatalf("refused for %q", p.Field)
	}
	byName := strings.Replace(rcv.srv.URL, "127.0.0.1", "localhost", 1)
	hook := decode[webhookJSON](t, d.doJSON("POST", "/v1/webhooks", map[string]any{
		"url": byName, "events": []string{"sandbox.created"}, "secret": secret,
	}), 201)
	d.create("hook-private", false)
	var got webhookJSON
	waitFor(t, 30*time.Second, "a refused attempt", func() bool {
		got = decode[webhookJSON](t, d.doJSON("GET", "/v1/webhooks/"+hook.ID, nil), 200)
		return got.Delivery.LastError != ""
	})
	if !strings.Contains(got.Delivery.LastError, "private") || got.Delivery.Pending != 1 {
		t.Fatalf("the delivery state: %+v", got.Delivery)
	}
	if n, _ := rcv.state(); n != 0 {
		t.Fatalf("the loopback receiver was reached %d times", n)
	}

	// The CLI: create with the secret on stdin, list, inspect, delete; the secret is in none
	// of its output.
	id := strings.TrimSpace(d.ctlOK(secret+"\n", "webhook", "create", "https://hooks.example.com/bothy",
		"--event", "sandbox.created", "--event", "sandbox.deleted", "--secret-file", "-"))
	var listed []webhookJSON
	d.ctlJSON(&listed, "webhook", "ls", "-o", "json")
	var inspected webhookJSON
	d.ctlJSON(&inspected, "webhook", "inspect", id)
	if len(listed) != 2 || inspected.ID != id || inspected.URL != "https://hooks.example.com/bothy" || len(inspected.Events) != 2 {
		t.Fatalf("bothy webhook ls: %+v; inspect: %+v", listed, inspected)
	}
	if out := d.ctlOK("", "webhook", "ls"); strings.Contains(out, secret) || !strings.Contains(out, id) {
		t.Fatalf("bothy webhook ls:\n%s", out)
	}
	d.ctlOK("", "webhook", "rm", id)
	d.wantFail(1, "webhook-not-found", "webhook", "inspect", id)
}

// nextOf2 returns the next event of either type.
func (s *sse) nextOf2(types ...string) sseEvent {
	s.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case e, ok := <-s.events:
			if !ok {
				s.t.Fatal("the event stream ended")
			}
			if slices.Contains(types, e.Type) {
				return e
			}
		case <-deadline:
			s.t.Fatalf("no %v event within 30s", types)
		}
	}
}

// TestCheckWebhooksAndIdempotency: `bothyd check` knows the webhooks' and the idempotent
// creates' records: clean beside a server that uses them; offline, it reports what an
// interrupted write or delete leaves, --repair removes it, and a record that does not read is
// reported and left alone.
func TestCheckWebhooksAndIdempotency(t *testing.T) {
	requireRoot(t)
	d := startDaemon(t)
	hook := decode[webhookJSON](t, d.doJSON("POST", "/v1/webhooks", map[string]any{
		"url": "https://hooks.example.com/bothy", "events": []string{"sandbox.created"}, "secret": "a-receiver-secret-0123456789",
	}), 201)
	if r := d.do("POST", "/v1/templates", strings.NewReader(`{"name":"idem-check"}`), http.Header{"Idempotency-Key": {"k"}}); r.Status != 201 {
		t.Fatalf("an idempotent create: %d %s", r.Status, r.Body)
	}
	r := mustCheckClean(t, d.Root, "beside the server")
	if len(r.Notes) == 0 || !slices.ContainsFunc(r.Notes, func(p checkProblem) bool { return p.Kind == "webhooks-in-use" }) {
		t.Fatalf("beside the server, no webhooks-in-use note: %+v", r.Notes)
	}
	d.Stop()

	hooks, idem := filepath.Join(d.Root, "webhooks"), filepath.Join(d.Root, "idempotency")
	old := time.Now().Add(-time.Hour)
	plant := func(path, data string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, old, old); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(hooks, "wh-00000000000000aa"), 0o700); err != nil {
		t.Fatal(err)
	}
	plant(filepath.Join(hooks, "."+hook.ID+".json.0123456789abcdef.tmp"), "{")
	plant(filepath.Join(idem, ".x.json.0123456789abcdef.tmp"), "{")
	bad := filepath.Join(hooks, hook.ID, "00000000000000000042.json")
	plant(bad, "{")

	r, code, stderr := runCheck(t, d.Root)
	k := r.kinds()
	if code != 1 || len(k["webhook-leftover"]) != 2 || len(k["idempotency-leftover"]) != 1 || len(k["webhook-bad-record"]) != 1 {
		t.Fatalf("offline: exit %d, %+v %s", code, r.Problems, stderr)
	}
	r, code, _ = runCheck(t, d.Root, "--repair")
	for _, p := range r.Problems {
		if p.Repaired != (p.Kind != "webhook-bad-record") {
			t.Errorf("after --repair: %+v", p)
		}
	}
	if code != 1 || r.Remaining != 1 {
		t.Fatalf("after --repair: exit %d, %+v", code, r)
	}
	if _, err := os.Lstat(bad); err != nil {
		t.Fatalf("the unreadable outbox entry after --repair: %v", err)
	}
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	mustCheckClean(t, d.Root, "after the operator removed the unreadable entry")
	d.start() // for the harness's clean-up
}
