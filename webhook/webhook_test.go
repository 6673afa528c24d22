package webhook

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/platform"

	"github.com/miekg/dns"
)

const testSecret = "0123456789abcdef-secret"

// receiver is an httptest server that verifies every delivery's signature and answers with
// what answer says.
type receiver struct {
	t   *testing.T
	srv *httptest.Server

	mu     sync.Mutex
	got    []int64 // event ids of the deliveries it took
	tries  int
	answer func(try int) int
}

func newReceiver(t *testing.T, answer func(try int) int) *receiver {
	r := &receiver{t: t, answer: answer}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	ts, err := strconv.ParseInt(req.Header.Get(HeaderTimestamp), 10, 64)
	if err != nil || !Verify([]byte(testSecret), ts, body, req.Header.Get(HeaderSignature)) {
		r.t.Errorf("a delivery whose signature does not verify: %q", req.Header.Get(HeaderSignature))
	}
	var e openapi.Event
	if err := json.Unmarshal(body, &e); err != nil {
		r.t.Errorf("a delivery's body is not an event: %v", err)
	}
	if id := req.Header.Get(HeaderEventID); id != strconv.FormatInt(e.Seq, 10) {
		r.t.Errorf("%s %q for event %d", HeaderEventID, id, e.Seq)
	}
	r.mu.Lock()
	r.tries++
	status := r.answer(r.tries)
	if status/100 == 2 {
		r.got = append(r.got, e.Seq)
	}
	r.mu.Unlock()
	w.WriteHeader(status)
}

func (r *receiver) attempts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tries
}

func (r *receiver) received() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.got...)
}

func open(t *testing.T, root string, o Options) *Manager {
	t.Helper()
	o.Root = root
	if o.RetryBase == 0 {
		o.RetryBase = 10 * time.Millisecond
		o.RetryMax = 40 * time.Millisecond
	}
	m, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func event(seq int64, typ string) openapi.Event {
	id := "box-1"
	return openapi.Event{Seq: seq, Type: typ, Sandbox: &id, At: time.Now().UTC()}
}

func TestSignAndVerify(t *testing.T) {
	t.Parallel()
	body := []byte(`{"seq":1}`)
	sig := Sign([]byte("k"), 1700000000, body)
	// The scheme, computed independently (docs/webhooks.md's openssl line):
	// printf '1700000000.{"seq":1}' | openssl dgst -sha256 -hmac k
	if sig != "v1=b1c0b1e31a0f3762b67e0f5bb68d063b7f40d43d0d8468b84c973099b751ef84" {
		t.Fatalf("signature %q", sig)
	}
	if !Verify([]byte("k"), 1700000000, body, sig) {
		t.Fatal("a signature does not verify")
	}
	for name, bad := range map[string]func() bool{
		"another body":      func() bool { return Verify([]byte("k"), 1700000000, []byte(`{"seq":2}`), sig) },
		"another timestamp": func() bool { return Verify([]byte("k"), 1700000001, body, sig) },
		"another secret":    func() bool { return Verify([]byte("K"), 1700000000, body, sig) },
	} {
		if bad() {
			t.Errorf("%s verifies", name)
		}
	}
}

func TestGuard(t *testing.T) {
	t.Parallel()
	g := guard{deny: []netip.Prefix{netip.MustParsePrefix("10.88.0.0/16")}}
	cases := []struct {
		addr    string
		private bool
	}{
		{"127.0.0.1", true},
		{"::1", true},
		{"10.1.2.3", true},
		{"172.16.0.1", true},
		{"192.168.1.1", true},
		{"169.254.169.254", true}, // cloud metadata
		{"fe80::1", true},
		{"fd00::1", true},
		{"100.64.0.1", true},
		{"0.0.0.0", true},
		{"::", true},
		{"::ffff:127.0.0.1", true},
		{"64:ff9b::a9fe:a9fe", true}, // NAT64 of 169.254.169.254
		{"2002:7f00:1::", true},      // 6to4 of 127.0.0.1
		{"224.0.0.1", true},
		{"255.255.255.255", true},
		{"93.184.215.14", false},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", false},
		{"64:ff9b::5db8:d70e", false}, // NAT64 of a public address
	}
	for _, tc := range cases {
		err := g.check(netip.MustParseAddr(tc.addr))
		if got := errors.Is(err, ErrPrivateAddress); got != tc.private {
			t.Errorf("%s: private %v (%v), want %v", tc.addr, got, err, tc.private)
		}
		if (guard{allowPrivate: true}).check(netip.MustParseAddr(tc.addr)) != nil {
			t.Errorf("%s refused though private addresses are allowed", tc.addr)
		}
	}
	// The sandbox subnet is refused though it is private anyway; another deny prefix that is
	// public shows the list is consulted.
	g.deny = append(g.deny, netip.MustParsePrefix("93.184.215.0/24"))
	if err := g.check(netip.MustParseAddr("93.184.215.14")); !errors.Is(err, ErrPrivateAddress) {
		t.Errorf("an address in a denied prefix: %v", err)
	}
}

// TestDeliveryRefusesPrivateAddress: without AllowPrivate, a loopback receiver is refused at
// create when the URL names its address, and at connect time when a name resolves to it.
func TestDeliveryRefusesPrivateAddress(t *testing.T) {
	t.Parallel()
	r := newReceiver(t, func(int) int { return 200 })
	m := open(t, t.TempDir(), Options{})
	_, err := m.Create(CreateRequest{URL: r.srv.URL, Events: []string{"sandbox.created"}, Secret: testSecret})
	if errcode.Of(err) != errcode.InvalidRequest {
		t.Fatalf("a webhook to %s: %v, want invalid-request", r.srv.URL, err)
	}
	// "localhost" passes the create (it is a name) and is refused when connected to.
	u := strings.Replace(r.srv.URL, "127.0.0.1", "localhost", 1)
	w, err := m.Create(CreateRequest{URL: u, Events: []string{"sandbox.created"}, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	m.Enqueue(event(1, "sandbox.created"))
	waitFor(t, "a refused attempt", func() bool {
		got, _ := m.Get(w.ID)
		return got.Delivery.LastAttemptAt != nil
	})
	got, _ := m.Get(w.ID)
	if got.Delivery.Pending != 1 || !strings.Contains(got.Delivery.LastError, "private") || len(r.received()) != 0 {
		t.Fatalf("delivery to localhost: %+v, received %v", got.Delivery, r.received())
	}
}

// TestOutboxSurvivesRestart: events enqueued while the receiver fails are delivered, in
// order, by a manager opened again on the same root, with every signature verified.
func TestOutboxSurvivesRestart(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var up sync.Mutex
	down := true
	r := newReceiver(t, func(int) int {
		up.Lock()
		defer up.Unlock()
		if down {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	})
	m := open(t, root, Options{AllowPrivate: true})
	w, err := m.Create(CreateRequest{URL: r.srv.URL, Events: []string{"sandbox.created", "sandbox.deleted"}, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	m.Enqueue(event(1, "sandbox.created"))
	m.Enqueue(event(2, "sandbox.started")) // not asked for
	m.Enqueue(event(3, "sandbox.deleted"))
	waitFor(t, "three failed attempts", func() bool {
		got, _ := m.Get(w.ID)
		return got.Delivery.LastStatus == 503 && got.Delivery.Pending == 2 && r.attempts() >= 3
	})
	m.Close()
	if n := len(r.received()); n != 0 {
		t.Fatalf("received %d before the receiver was up", n)
	}

	up.Lock()
	down = false
	up.Unlock()
	m2 := open(t, root, Options{AllowPrivate: true})
	got, err := m2.Get(w.ID)
	if err != nil || got.Delivery.Pending != 2 {
		t.Fatalf("after the restart: %+v, %v", got, err)
	}
	m2.Start()
	waitFor(t, "both events delivered", func() bool { return len(r.received()) == 2 })
	if rec := r.received(); rec[0] != 1 || rec[1] != 3 {
		t.Fatalf("received %v, want [1 3]", rec)
	}
	waitFor(t, "an empty outbox", func() bool {
		got, _ := m2.Get(w.ID)
		return got.Delivery.Pending == 0 && got.Delivery.Delivered == 2
	})
	names, _ := os.ReadDir(filepath.Join(root, Dir, w.ID))
	for _, n := range names {
		if n.Name() != StateName {
			t.Errorf("the outbox still holds %s", n.Name())
		}
	}
}

// TestRedirectIsNotFollowed: a 3xx is a failed attempt, and its target is never asked.
func TestRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	target := newReceiver(t, func(int) int { return 200 })
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.srv.URL, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirector.Close)
	m := open(t, t.TempDir(), Options{AllowPrivate: true})
	w, err := m.Create(CreateRequest{URL: redirector.URL, Events: []string{"sandbox.created"}, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	m.Enqueue(event(1, "sandbox.created"))
	waitFor(t, "an attempt", func() bool {
		got, _ := m.Get(w.ID)
		return got.Delivery.LastStatus == http.StatusTemporaryRedirect
	})
	if target.attempts() != 0 {
		t.Fatal("the redirect was followed")
	}
}

func TestCreateValidates(t *testing.T) {
	t.Parallel()
	m := open(t, t.TempDir(), Options{EventTypes: []string{"sandbox.created"}})
	ok := CreateRequest{URL: "https://hooks.example.com/x", Events: []string{"sandbox.created"}, Secret: testSecret}
	cases := map[string]func(r *CreateRequest){
		"ftp":           func(r *CreateRequest) { r.URL = "ftp://example.com/" },
		"relative":      func(r *CreateRequest) { r.URL = "/x" },
		"userinfo":      func(r *CreateRequest) { r.URL = "https://u:p@example.com/" },
		"metadata":      func(r *CreateRequest) { r.URL = "http://169.254.169.254/latest" },
		"no events":     func(r *CreateRequest) { r.Events = nil },
		"unknown event": func(r *CreateRequest) { r.Events = []string{"sandbox.exploded"} },
		"short secret":  func(r *CreateRequest) { r.Secret = "short" },
	}
	for name, mut := range cases {
		r := ok
		mut(&r)
		if _, err := m.Create(r); errcode.Of(err) != errcode.InvalidRequest {
			t.Errorf("%s: %v, want invalid-request", name, err)
		}
	}
	w, err := m.Create(ok)
	if err != nil {
		t.Fatal(err)
	}
	// The secret is in no answer.
	b, _ := json.Marshal(m.List())
	if strings.Contains(string(b), testSecret) {
		t.Fatalf("a list carries the secret: %s", b)
	}
	if err := m.Delete(w.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(w.ID); errcode.Of(err) != errcode.WebhookNotFound {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(m.dir, w.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the outbox of a deleted webhook: %v", err)
	}
}

// TestStartupCleansAndCheckReports: what interrupted writes and deletes leave is reported by
// Check, removed by its repair or by the next Open; an unreadable record is reported and kept.
func TestStartupCleansAndCheckReports(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	m := open(t, root, Options{})
	w, err := m.Create(CreateRequest{URL: "https://hooks.example.com/x", Events: []string{"sandbox.created"}, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	dir := filepath.Join(root, Dir)
	orphan := "wh-00000000000000aa"
	write := func(path, data string) {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, orphan), 0o700); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(dir, platform.TempName(w.ID+".json")), "{")
	write(filepath.Join(dir, w.ID, platform.TempName(entryName(7))), "{")
	write(filepath.Join(dir, w.ID, entryName(8)), "{")

	probs, busy, err := Check(root, false)
	if err != nil || busy {
		t.Fatalf("Check: %v, busy %v", err, busy)
	}
	kinds := map[string]int{}
	for _, p := range probs {
		kinds[p.Kind]++
	}
	if kinds[Leftover] != 3 || kinds[BadRecord] != 1 || len(probs) != 4 {
		t.Fatalf("problems %+v", probs)
	}

	// Beside a manager that holds the lock, Check only reads, and leaves temporary files
	// (that manager's writes in flight) out.
	m2 := open(t, root, Options{})
	probs, busy, _ = Check(root, true)
	if !busy {
		t.Fatal("Check did not see the lock held")
	}
	for _, p := range probs {
		if p.Repaired || isTemp(p.Entry) {
			t.Fatalf("beside a server: %+v", p)
		}
	}
	// The Open above cleaned the leftovers; the unreadable entry stays.
	m2.Close()
	probs, _, _ = Check(root, true)
	if len(probs) != 1 || probs[0].Kind != BadRecord || probs[0].Repaired {
		t.Fatalf("after a start-up: %+v", probs)
	}
	if _, err := os.Lstat(filepath.Join(dir, orphan)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the orphan outbox: %v", err)
	}
}

// TestDeliveryResolvesThroughTheNamedResolver: with Options.Resolver, a receiver's name is
// resolved by that DNS server alone: a name only it knows is delivered to the address it
// gives, and the server saw the query. It fails on a sender that ignores the option (the
// host's resolvers do not know the name).
func TestDeliveryResolvesThroughTheNamedResolver(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, func(int) int { return 200 })
	_, port, _ := net.SplitHostPort(rcv.srv.Listener.Addr().String())

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int32
	dnsSrv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 && q.Question[0].Name == "receiver.bothy-test." {
			asked.Add(1)
			if q.Question[0].Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
					A:   net.IPv4(127, 0, 0, 1),
				})
			}
		} else {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = dnsSrv.ActivateAndServe() }()
	t.Cleanup(func() { _ = dnsSrv.Shutdown() })

	m := open(t, t.TempDir(), Options{AllowPrivate: true, Resolver: pc.LocalAddr().String()})
	if _, err := m.Create(CreateRequest{URL: "http://receiver.bothy-test:" + port + "/hook", Events: []string{"sandbox.created"}, Secret: testSecret}); err != nil {
		t.Fatal(err)
	}
	m.Start()
	m.Enqueue(event(1, "sandbox.created"))
	waitFor(t, "the delivery to the name only the resolver knows", func() bool { return len(rcv.received()) == 1 })
	if asked.Load() == 0 {
		t.Fatal("the delivery arrived but the named resolver was never asked")
	}
}

// TestCreateWithID: a create may name the webhook's id (a cluster's router does, so that one
// webhook has one id on every node). Naming it again with the same URL, events and secret
// answers the same webhook (a retry is idempotent, and makes no second one); with another
// secret or URL it is refused, webhook-exists; an id that is not wh- and 16 hex digits (it
// names files in the state root) is refused, invalid-request.
func TestCreateWithID(t *testing.T) {
	t.Parallel()
	m := open(t, t.TempDir(), Options{EventTypes: []string{"sandbox.created", "sandbox.deleted"}})
	req := CreateRequest{ID: "wh-0123456789abcdef", URL: "https://hooks.example.com/x", Events: []string{"sandbox.deleted", "sandbox.created"}, Secret: testSecret}
	w, err := m.Create(req)
	if err != nil || w.ID != req.ID {
		t.Fatalf("create with an id: %+v, %v", w, err)
	}
	again := req
	again.Events = []string{"sandbox.created", "sandbox.deleted", "sandbox.created"} // the same set
	if w2, err := m.Create(again); err != nil || w2.ID != req.ID || len(m.List()) != 1 {
		t.Fatalf("the same create again: %+v, %v, %d webhooks; want the same one, alone", w2, err, len(m.List()))
	}
	for name, mut := range map[string]func(r *CreateRequest){
		"another secret": func(r *CreateRequest) { r.Secret = testSecret + "-other" },
		"another URL":    func(r *CreateRequest) { r.URL = "https://hooks.example.com/y" },
		"other events":   func(r *CreateRequest) { r.Events = []string{"sandbox.created"} },
	} {
		r := req
		mut(&r)
		if _, err := m.Create(r); errcode.Of(err) != errcode.WebhookExists {
			t.Errorf("%s under the same id: %v, want webhook-exists", name, err)
		}
	}
	for _, id := range []string{"wh-0123", "wh-0123456789ABCDEF", "../../etc/passwd", "wh-0123456789abcdeg"} {
		r := req
		r.ID = id
		if _, err := m.Create(r); errcode.Of(err) != errcode.InvalidRequest {
			t.Errorf("id %q: %v, want invalid-request", id, err)
		}
	}
}
