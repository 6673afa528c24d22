package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
)

func TestHealthAndSpec(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)

	r := d.do(http.MethodGet, "/healthz", nil, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("/healthz: status %d: %s", r.Status, r.Body)
	}
	var health map[string]any
	if err := json.Unmarshal(r.Body, &health); err != nil || health["status"] != "ok" {
		t.Fatalf("/healthz body %s: want {\"status\":\"ok\",...} (%v)", r.Body, err)
	}

	r = d.do(http.MethodGet, "/openapi.yaml", nil, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("/openapi.yaml: status %d", r.Status)
	}
	doc, err := openapi3.NewLoader().LoadFromData(r.Body)
	if err != nil {
		t.Fatalf("the served spec does not parse: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the served spec is invalid: %v", err)
	}
	if doc.Paths.Find("/v1/sandboxes") == nil {
		t.Fatalf("the served spec has no /v1/sandboxes")
	}
}

// TestEveryErrorIsAProblem sends the kinds of bad input a new user sends and checks that each
// answer is problem+json with the right status and code, never plain text.
func TestEveryErrorIsAProblem(t *testing.T) {
	t.Parallel()
	// Without a token, for the foreign Host header: only a tokenless server refuses it.
	d := startDaemon(t, withoutAuth())
	json := http.Header{"Content-Type": {"application/json"}}
	cases := []struct {
		name   string
		method string
		path   string
		body   string
		header http.Header
		status int
		code   string
		field  string
	}{
		{name: "unknown route", method: "GET", path: "/nope", status: 404, code: "not-found"},
		{name: "unknown v1 route", method: "GET", path: "/v1/nope", status: 404, code: "not-found"},
		{name: "method not allowed", method: "DELETE", path: "/healthz", status: 405, code: "method-not-allowed"},
		{name: "malformed JSON", method: "POST", path: "/v1/sandboxes", body: `{"id":`, header: json, status: 400, code: "invalid-request"},
		{name: "JSON of the wrong type", method: "POST", path: "/v1/sandboxes", body: `[1,2]`, header: json, status: 400, code: "invalid-request"},
		{name: "bad sandbox id in body", method: "POST", path: "/v1/sandboxes", body: `{"id":"Not An Id"}`, header: json, status: 400, code: "invalid-request", field: "id"},
		{name: "unknown body field", method: "POST", path: "/v1/sandboxes", body: `{"idd":"x"}`, header: json, status: 400, code: "invalid-request"},
		{name: "absurd resources", method: "POST", path: "/v1/sandboxes", body: `{"resources":{"memory_mb":99999999}}`, header: json, status: 400, code: "invalid-request", field: "resources.memory_mb"},
		{name: "bad id in path", method: "GET", path: "/v1/sandboxes/UPPER", status: 400, code: "invalid-request", field: "id"},
		{name: "overlong id in path", method: "GET", path: "/v1/sandboxes/" + strings.Repeat("a", 64), status: 400, code: "invalid-request", field: "id"},
		{name: "query parameter not a number", method: "GET", path: "/v1/sandboxes?limit=abc", status: 400, code: "invalid-request", field: "limit"},
		{name: "query parameter out of range", method: "GET", path: "/v1/sandboxes?limit=100000", status: 400, code: "invalid-request", field: "limit"},
		{name: "zero timeout", method: "POST", path: "/v1/sandboxes/a1/start?timeout=0", status: 400, code: "invalid-request", field: "timeout"},
		{name: "foreign Host header", method: "GET", path: "/v1/sandboxes", header: http.Header{"Host": {"evil.example"}}, status: 403, code: "forbidden"},
		{name: "foreign Origin", method: "POST", path: "/v1/sandboxes", body: `{}`, header: http.Header{"Origin": {"http://evil.example"}, "Content-Type": {"application/json"}}, status: 403, code: "forbidden"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := d.in(t)
			t.Parallel()
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			r := d.doHost(tc.method, tc.path, body, tc.header)
			p := wantProblem(t, r, tc.status, tc.code)
			if tc.field != "" && p.Field != tc.field {
				t.Fatalf("field = %q, want %q: %s", p.Field, tc.field, r.Body)
			}
		})
	}
}

// doHost is do with the Host header taken from header, which net/http otherwise ignores.
func (d *daemon) doHost(method, path string, body io.Reader, header http.Header) response {
	d.t.Helper()
	if h := header.Get("Host"); h != "" {
		req, err := http.NewRequest(method, d.URL+path, body)
		if err != nil {
			d.t.Fatal(err)
		}
		req.Host = h
		resp, err := d.checkedClient(nil).Do(req)
		if err != nil {
			d.t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return response{Status: resp.StatusCode, Header: resp.Header, Body: b}
	}
	return d.do(method, path, body, header)
}

// TestOversizedBodyIs413: a JSON body past its 1 MiB is refused with 413, whether its length
// is declared or it comes chunked. Raw connections on purpose: each sends its headers and 64
// KiB past the limit, and then only reads. An http.Client would go on writing the rest of the
// body while the server, having answered, closes the connection; the reset that the unread
// data then causes can reach the client's write before the client has read the answer, and
// Go's transport reports the write's error, not the 413 (a race of the client, which a CI run
// met).
func TestOversizedBodyIs413(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	big := `{"labels":{"a":"` + strings.Repeat("x", 2<<20) + `"}}`
	sent := big[:1<<20+64<<10]
	post := func(t *testing.T, header, body string) response {
		t.Helper()
		addr := strings.TrimPrefix(d.URL, "http://")
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		head := "POST /v1/sandboxes HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" + header
		if d.Token != "" {
			head += "Authorization: Bearer " + d.Token + "\r\n"
		}
		if _, err := io.WriteString(c, head+"\r\n"+body); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("a body past the limit got no answer: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return response{Status: resp.StatusCode, Header: resp.Header, Body: b}
	}
	t.Run("declared length", func(t *testing.T) {
		r := post(t, fmt.Sprintf("Content-Length: %d\r\n", len(big)), sent)
		wantProblem(t, r, http.StatusRequestEntityTooLarge, "payload-too-large")
	})
	t.Run("chunked", func(t *testing.T) {
		r := post(t, "Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\n", len(sent), sent))
		wantProblem(t, r, http.StatusRequestEntityTooLarge, "payload-too-large")
	})
}

func TestTokenIsRequired(t *testing.T) {
	t.Parallel()
	const token = "test-token-0123456789abcdef"
	d := startDaemon(t, withToken(token))

	none := d.do("GET", "/v1/sandboxes", nil, http.Header{"Authorization": {""}})
	// An empty header value counts as absent; do() would add the token otherwise.
	wantProblem(t, none, http.StatusUnauthorized, "unauthorized")
	if !strings.HasPrefix(none.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("401 without WWW-Authenticate: Bearer: %v", none.Header)
	}
	wrong := d.do("GET", "/v1/sandboxes", nil, http.Header{"Authorization": {"Bearer " + token + "x"}})
	wantProblem(t, wrong, http.StatusUnauthorized, "unauthorized")
	query := d.do("GET", "/v1/sandboxes?access_token="+token, nil, http.Header{"Authorization": {""}})
	wantProblem(t, query, http.StatusUnauthorized, "unauthorized") // only websockets take it in the query

	if r := d.do("GET", "/healthz", nil, http.Header{"Authorization": {""}}); r.Status != http.StatusOK {
		t.Fatalf("/healthz needs no token, got %d", r.Status)
	}
	if r := d.do("GET", "/v1/sandboxes", nil, nil); r.Status == http.StatusUnauthorized {
		t.Fatalf("the right token was refused: %s", r.Body)
	}
	if r := d.do("GET", "/v1/sandboxes", nil, http.Header{"Authorization": {"bearer " + token}}); r.Status == http.StatusUnauthorized {
		t.Fatalf("the scheme name is case-insensitive, but 'bearer' was refused: %s", r.Body)
	}
}

func TestRefusesNonLoopbackWithoutToken(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(bothydBin, "--listen", "0.0.0.0:0", "--root", t.TempDir(), "--log-format", "json", "--insecure-no-auth")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd = exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("bothyd served 0.0.0.0 without a token; output:\n%s", out)
	}
	if !strings.Contains(string(out), "without an API token") {
		t.Fatalf("the refusal does not say why:\n%s", out)
	}
}

// TestWithoutRoot: a bothyd that is not root serves its API, and refuses only to start
// sandboxes, with 503 unavailable saying why; the refused create leaves nothing behind.
func TestWithoutRoot(t *testing.T) {
	requireRoot(t) // to switch to another user
	t.Parallel()
	const nobody = 65534
	d := startDaemon(t, asUser(nobody))
	if r := d.do("GET", "/v1/info", nil, nil); r.Status != 200 {
		t.Fatalf("/v1/info: %d %s", r.Status, r.Body)
	}
	p := wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "plain", "start": true}), 503, "unavailable")
	if !strings.Contains(p.Detail, "root") {
		t.Fatalf("the refusal does not say why: %s", p.Detail)
	}
	// A create whose start fails is all or nothing: the id is free again.
	wantProblem(t, d.doJSON("GET", "/v1/sandboxes/plain", nil), 404, "sandbox-not-found")
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "plain"}); r.Status != 201 {
		t.Fatalf("a create without start after the refused one: %d %s", r.Status, r.Body)
	}
	if r := d.doJSON("DELETE", "/v1/sandboxes/plain", nil); r.Status != 204 {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
}
