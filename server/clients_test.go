package server

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/internal/forwarded"
)

// TestLimitListener: a client past its connections is answered 429 limit-reached and
// closed, another client is not, and a closed connection gives its place back.
func TestLimitListener(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := LimitListener(ln, 3, 2)
	t.Cleanup(func() { lim.Close() })
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := lim.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(local string) net.Conn {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}).Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	refused := func(c net.Conn) bool {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusTooManyRequests && strings.Contains(string(b), `"code":"limit-reached"`)
	}
	take := func(what string) net.Conn {
		select {
		case c := <-accepted:
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("%s was not accepted", what)
			return nil
		}
	}
	dial("127.0.0.2")
	dial("127.0.0.2")
	first := take("the first connection")
	take("the second connection")
	if !refused(dial("127.0.0.2")) {
		t.Fatal("a client's third connection, past its 2, was not answered 429 limit-reached")
	}
	dial("127.0.0.3")
	take("another client's connection")
	if !refused(dial("127.0.0.4")) {
		t.Fatal("a connection past the listener's 3 was not answered 429 limit-reached")
	}
	first.Close()
	dial("127.0.0.2")
	take("a connection in the place of a closed one")
}

// TestStreamsPerClient: one client's long-lived requests past MaxStreamsPerClient are
// refused 429, another client's are not.
func TestStreamsPerClient(t *testing.T) {
	t.Parallel()
	s, _ := newTestServer(t, Config{})
	release := make(chan struct{})
	entered := make(chan struct{}, MaxStreamsPerClient+1)
	h := s.boundStreams(nil)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		entered <- struct{}{}
		<-release
	}))
	done := make(chan struct{})
	for range MaxStreamsPerClient {
		go func() {
			h.ServeHTTP(httptest.NewRecorder(), &http.Request{RemoteAddr: "192.0.2.1:1", Header: http.Header{}})
			done <- struct{}{}
		}()
	}
	for range MaxStreamsPerClient {
		<-entered
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/events", nil).WithContext(t.Context()))
	// httptest's RemoteAddr is 192.0.2.1:1234: the same client.
	if rec.Code != http.StatusTooManyRequests || decodeProblem(t, rec).Code != "limit-reached" {
		t.Fatalf("a stream past the client's %d: %d %s", MaxStreamsPerClient, rec.Code, rec.Body)
	}
	other := httptest.NewRequest("GET", "/v1/events", nil)
	other.RemoteAddr = "192.0.2.2:1"
	go h.ServeHTTP(httptest.NewRecorder(), other)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("another client's stream was not served")
	}
	close(release)
	for range MaxStreamsPerClient {
		<-done
	}
}

// TestStreamsForwardedClient: behind the cluster router, which names each request's client
// with proof that it holds the token, the stream bounds are each client's: one client of the
// router holding its share leaves another client's streams served, while a name without a
// valid proof counts as the router's own.
func TestStreamsForwardedClient(t *testing.T) {
	t.Parallel()
	s, _ := newTestServer(t, Config{Token: "node-token-0123456789"})
	release := make(chan struct{})
	entered := make(chan struct{}, MaxStreamsPerClient+1)
	h := s.boundStreams(nil)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		entered <- struct{}{}
		<-release
	}))
	viaRouter := func(client, token string) *http.Request {
		r := httptest.NewRequest("GET", "/v1/events", nil) // from 192.0.2.1, the router
		forwarded.Set(r.Header, token, client)
		return r
	}
	done := make(chan struct{})
	for range MaxStreamsPerClient {
		go func() {
			h.ServeHTTP(httptest.NewRecorder(), viaRouter("198.51.100.1", "node-token-0123456789"))
			done <- struct{}{}
		}()
	}
	for range MaxStreamsPerClient {
		<-entered
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, viaRouter("198.51.100.1", "node-token-0123456789"))
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("the router's client past its %d streams: %d %s", MaxStreamsPerClient, rec.Code, rec.Body)
	}
	go func() {
		h.ServeHTTP(httptest.NewRecorder(), viaRouter("198.51.100.2", "node-token-0123456789"))
		done <- struct{}{}
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("another client of the router was refused with the first's streams")
	}
	// The router's own address holds nothing yet, so a forged name is served as the router,
	// and counts there: MaxStreamsPerClient of them, and the next is refused.
	for range MaxStreamsPerClient {
		go func() {
			h.ServeHTTP(httptest.NewRecorder(), viaRouter("198.51.100.3", "another-token"))
			done <- struct{}{}
		}()
	}
	for range MaxStreamsPerClient {
		<-entered
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, viaRouter("198.51.100.4", "another-token"))
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("forged names escaped the router's bound: %d %s", rec.Code, rec.Body)
	}
	close(release)
	for range 2*MaxStreamsPerClient + 1 {
		<-done
	}
}

// TestForeignBehindTheGuards: the foreign API (E2B's) is answered only after the Host and
// Origin checks, and its error answers do not wait for an unread body.
func TestForeignBehindTheGuards(t *testing.T) {
	t.Parallel()
	reached := make(chan string, 10)
	foreignAPI := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached <- r.URL.Path
		http.Error(w, `{"code":401}`, http.StatusUnauthorized)
	})
	s, _ := newTestServer(t, Config{Foreign: foreignAPI, ForeignClaims: func(r *http.Request) bool {
		return strings.HasPrefix(r.URL.Path, "/sandboxes")
	}})
	for name, header := range map[string]http.Header{
		"a rebound Host":   {"Host": {"rebind.example"}},
		"a foreign Origin": {"Origin": {"http://evil.example"}},
	} {
		req := httptest.NewRequest("POST", "/sandboxes", strings.NewReader("{}"))
		for k, v := range header {
			req.Header[k] = v
		}
		if h := header.Get("Host"); h != "" {
			req.Host = h
		} else {
			req.Host = "127.0.0.1:7780"
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden {
			t.Errorf("the foreign API with %s: %d %s, want 403", name, rec.Code, rec.Body)
		}
	}
	select {
	case p := <-reached:
		t.Fatalf("the foreign API was reached (%s) past the browser checks", p)
	default:
	}

	addr := serve(t, s)
	conn, br := rawRequest(t, addr, "POST /sandboxes HTTP/1.1\r\nHost: "+addr+"\r\nContent-Length: 200000", "{")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the foreign API's refusal with its body unsent: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the foreign API's answer: %d", resp.StatusCode)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("the connection was not closed after the refusal: %v", err)
	}
}
