package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/openapi"
)

// uploader is a handler whose file upload reads the whole body and reports how it ended.
type uploader struct {
	panicky
	done chan error
}

func (u uploader) WriteFile(_ context.Context, req openapi.WriteFileRequestObject) (openapi.WriteFileResponseObject, error) {
	_, err := io.Copy(io.Discard, req.Body)
	u.done <- err
	if err != nil {
		return nil, err
	}
	return openapi.WriteFile204Response{}, nil
}

// serve runs s on a loopback listener until the test ends and returns its address.
func serve(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// rawRequest opens a connection, sends head (the request line and headers, without the blank
// line) and then body, and returns the connection and a reader of the answer. The connection
// gives up after a minute, so that a test that fails hangs no longer than that.
func rawRequest(t *testing.T, addr, head, body string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(conn, head+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// readAnswer reads one response and then expects the server to close the connection.
func readAnswer(t *testing.T, br *bufio.Reader) (*http.Response, problem) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	var p problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatalf("the answer (%d) is not a problem: %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the %d the connection was not closed: %v", resp.StatusCode, err)
	}
	return resp, p
}

// TestRefusalDoesNotWaitForTheBody: a client without the token that declares a body and
// sends one byte of it is answered 401 while the rest is still unsent, and the connection is
// closed. net/http reads up to 256 KiB of an unread body before it answers, to reuse the
// connection; the body timeout is an hour here, so only an answer that does not wait passes.
func TestRefusalDoesNotWaitForTheBody(t *testing.T) {
	t.Parallel()
	s, _ := newTestServer(t, Config{Token: "a-token-of-some-length", BodyTimeout: time.Hour})
	addr := serve(t, s)
	for _, path := range []string{"/v1/sandboxes", "/v1/sandboxes/a1/files?path=/x"} {
		method := "POST"
		if strings.Contains(path, "files") {
			method = "PUT"
		}
		_, br := rawRequest(t, addr, method+" "+path+" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 200000", "{")
		resp, p := readAnswer(t, br)
		if resp.StatusCode != http.StatusUnauthorized || p.Code != "unauthorized" {
			t.Fatalf("%s %s: got %d %q, want 401 unauthorized", method, path, resp.StatusCode, p.Code)
		}
	}
}

// TestSlowBodyIsCut: an authenticated client that declares a body and stops sending is
// answered and cut off once the body timeout passes, instead of holding the connection.
func TestSlowBodyIsCut(t *testing.T) {
	t.Parallel()
	const token = "a-token-of-some-length"
	s, _ := newTestServer(t, Config{Token: token, BodyTimeout: 100 * time.Millisecond})
	addr := serve(t, s)
	_, br := rawRequest(t, addr, "POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "+token+
		"\r\nContent-Type: application/json\r\nContent-Length: 200000", "{")
	resp, p := readAnswer(t, br)
	if resp.StatusCode != http.StatusBadRequest || p.Code != "invalid-request" || !strings.Contains(p.Detail, "did not arrive") {
		t.Fatalf("got %d %q %q, want 400 invalid-request saying the body did not arrive", resp.StatusCode, p.Code, p.Detail)
	}
}

// TestUploadIsBoundedByPauses: a file upload may take longer in total than the idle timeout,
// as long as it never pauses for that long; a pause longer than it ends the upload.
func TestUploadIsBoundedByPauses(t *testing.T) {
	t.Parallel()
	const idle = 300 * time.Millisecond
	u := uploader{done: make(chan error, 1)}
	s, _ := newTestServer(t, Config{Handlers: u, BodyIdleTimeout: idle, BodyTimeout: idle})
	addr := serve(t, s)

	// Eight pieces, each sent well within the idle timeout of the one before: the upload
	// takes longer than the timeout in total, and completes.
	const pieces = 8
	conn, br := rawRequest(t, addr, fmt.Sprintf("PUT /v1/sandboxes/a1/files?path=/x HTTP/1.1\r\nHost: 127.0.0.1\r\n"+
		"Content-Type: application/octet-stream\r\nContent-Length: %d", pieces), "")
	start := time.Now()
	for range pieces {
		time.Sleep(idle / 4) // pacing the client, not waiting for a condition
		if _, err := conn.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-u.done; err != nil {
		t.Fatalf("a steady upload of %s was cut: %v", time.Since(start), err)
	}
	if time.Since(start) <= idle {
		t.Fatalf("the upload took %s, no longer than the idle timeout: it proves nothing", time.Since(start))
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("the steady upload: %v %v", resp, err)
	}

	// A client that stops sending is cut off.
	_, br = rawRequest(t, addr, "PUT /v1/sandboxes/a1/files?path=/x HTTP/1.1\r\nHost: 127.0.0.1\r\n"+
		"Content-Type: application/octet-stream\r\nContent-Length: 200000", "x")
	if err := <-u.done; err == nil {
		t.Fatal("a stalled upload was read to its end")
	}
	resp, p := readAnswer(t, br)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(p.Detail, "paused") {
		t.Fatalf("the stalled upload: %d %q %q, want 400 saying it paused", resp.StatusCode, p.Code, p.Detail)
	}
}
