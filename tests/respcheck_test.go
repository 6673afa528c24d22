package tests

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// The response check holds every answer that goes through [daemon.do] (and so
// [daemon.doJSON] and every helper built on them) to the contract in openapi/openapi.yaml: the
// status must be one the operation documents, the Content-Type one documented for that status,
// and the body must match its schema, as must the headers the response declares. The suite is
// then a contract test driven by the spec itself: every e2e test, whatever it asserts, also
// proves that each answer it got is one a generated client can decode.
//
// Bodies that are not the server's own JSON are not decoded, only their status and Content-Type
// checked:
//   - file reads (GET /v1/sandboxes/{id}/files answering 200 with application/octet-stream):
//     a stream of the sandbox's bytes, which the schema declares as binary and cannot judge;
//   - the event stream's text/event-stream: an endless sequence of events, each its own JSON,
//     which kin-openapi cannot decode as one body;
//   - the exec websocket's 101: past the upgrade the exchange is frames, not a response body;
//   - the ports proxy and signed links (/v1/sandboxes/{id}/ports/{port}/{path}, /p/{token}/...):
//     their answers are the sandboxed service's, any status and any body; only bothyd's own
//     refusals there (application/problem+json) are checked.
//
// Requests that match no operation of the contract (a deliberately bad path, a method the
// path does not take) have nothing to be checked against and are left to the tests' own
// assertions.

// contractRouter is the spec's router, loaded once for the whole suite.
var contractRouter = sync.OnceValues(func() (routers.Router, error) {
	spec, err := os.ReadFile(filepath.Join("..", "openapi", "openapi.yaml"))
	if err != nil {
		return nil, err
	}
	doc, err := openapi3.NewLoader().LoadFromData(spec)
	if err != nil {
		return nil, fmt.Errorf("loading the OpenAPI spec: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("the OpenAPI spec is invalid: %w", err)
	}
	// The reference page (/docs) is HTML, a string to its schema; kin-openapi has no decoder
	// of its own for it.
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
	// As in server/validate.go: match any host and port, and leave tokens to the tests.
	doc.Servers = nil
	doc.Security = nil
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			op.Security = nil
		}
	}
	return legacy.NewRouter(doc)
})

// proxiedOperations answer with the sandboxed service's own responses.
var proxiedOperations = map[string]bool{
	"/v1/sandboxes/{id}/ports/{port}/{path}": true,
	"/p/{token}/{path}":                      true,
}

// checkResponse returns why the answer to req (status, header, body) is not one the contract
// documents for req's operation, or "" when it is (or when req is no operation of the
// contract). The reason names the operation.
func checkResponse(req *http.Request, status int, header http.Header, body []byte) string {
	router, err := contractRouter()
	if err != nil {
		return "the contract cannot be loaded: " + err.Error()
	}
	route, pathParams, err := router.FindRoute(req)
	if err != nil {
		return ""
	}
	op := route.Operation.OperationID
	if op == "" {
		op = req.Method + " " + route.Path
	}
	name := fmt.Sprintf("%s (%s %s)", op, req.Method, route.Path)
	ct, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	if proxiedOperations[route.Path] && ct != "application/problem+json" {
		return ""
	}
	skipBody := status == http.StatusSwitchingProtocols || ct == "text/event-stream" ||
		(ct == "application/octet-stream" && route.Path == "/v1/sandboxes/{id}/files" && req.Method == http.MethodGet)
	input := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request:    req,
			PathParams: pathParams,
			Route:      route,
		},
		Status: status,
		Header: header,
		Body:   io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true,
			ExcludeResponseBody:   skipBody,
			MultiError:            true,
		},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), input); err != nil {
		return fmt.Sprintf("%s answered %d (%s) outside its contract: %v; body: %.300s", name, status, ct, err, body)
	}
	if skipBody {
		// ExcludeResponseBody skips the Content-Type check as well; make it here.
		resp := route.Operation.Responses.Status(status)
		if resp == nil {
			resp = route.Operation.Responses.Default()
		}
		if resp != nil && resp.Value != nil && len(resp.Value.Content) > 0 && resp.Value.Content.Get(ct) == nil {
			return fmt.Sprintf("%s answered %d with Content-Type %q, which the contract does not document for it", name, status, header.Get("Content-Type"))
		}
	}
	return ""
}

// reportContract fails d's test when the answer to req breaks the contract.
func (d *daemon) reportContract(req *http.Request, status int, header http.Header, body []byte) {
	d.t.Helper()
	if why := checkResponse(req, status, header, body); why != "" {
		d.t.Errorf("contract: %s", strings.TrimSpace(why))
	}
}

// TestResponseCheck proves that the check wrapped around every request can fail: answers
// that break the contract in each way it checks are reported, naming their operation, and a
// conforming one is not.
func TestResponseCheck(t *testing.T) {
	get := func(path string) *http.Request {
		req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:1"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	js := http.Header{"Content-Type": {"application/json"}}
	cases := []struct {
		name   string
		req    *http.Request
		status int
		header http.Header
		body   string
		want   string // "" when the answer conforms
	}{
		{"conforming", get("/healthz"), 200, js, `{"status":"ok"}`, ""},
		{"undocumented status", get("/healthz"), 418, js, `{}`, "getHealth (GET /healthz) answered 418"},
		{"body off its schema", get("/v1/sandboxes/demo"), 200, js, `{"id":"demo"}`, "getSandbox"},
		{"undocumented content type", get("/v1/sandboxes/demo"), 200, http.Header{"Content-Type": {"text/plain"}}, `x`, "getSandbox"},
		{"file read's type", get("/v1/sandboxes/demo/files?path=/x"), 200, http.Header{"Content-Type": {"text/csv"}}, `a,b`, "readFile"},
		{"no operation", get("/no/such/route"), 404, js, `{}`, ""},
	}
	for _, c := range cases {
		got := checkResponse(c.req, c.status, c.header, []byte(c.body))
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: checkResponse = %q, want one containing %q", c.name, got, c.want)
		}
	}
}

// contractTransport holds every answer that passes through it to the contract, as
// [daemon.do] does, for the requests that do cannot make: a stream read as it comes (the
// event stream, a large file), a client with options of its own (a timeout, no redirects),
// the generated Go client, the concurrent clients of the chaos and hostile tests. A streamed
// answer (a file's bytes, server-sent events, a websocket's 101, a proxied service's own
// answer) is checked without its body, as checkResponse does for those; any other body is read
// whole, checked, and handed on unread.
type contractTransport struct {
	base http.RoundTripper
	t    testing.TB
}

func (c contractTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode == http.StatusSwitchingProtocols || ct == "text/event-stream" || ct == "application/octet-stream" ||
		(ct != "application/problem+json" && (strings.Contains(req.URL.Path, "/ports/") || strings.HasPrefix(req.URL.Path, "/p/"))) {
		if why := checkResponse(req, resp.StatusCode, resp.Header, nil); why != "" {
			c.t.Errorf("contract: %s", strings.TrimSpace(why))
		}
		return resp, nil
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	if why := checkResponse(req, resp.StatusCode, resp.Header, b); why != "" {
		c.t.Errorf("contract: %s", strings.TrimSpace(why))
	}
	return resp, nil
}

// checkedClient is base (nil: d's own client, in d's network namespace if it has one) with
// every answer checked against the contract.
func (d *daemon) checkedClient(base *http.Client) *http.Client {
	if base == nil {
		base = d.httpClient()
	}
	tr := base.Transport
	if tr == nil {
		tr = http.DefaultTransport
	}
	return &http.Client{Transport: contractTransport{base: tr, t: d.t}, Timeout: base.Timeout, CheckRedirect: base.CheckRedirect, Jar: base.Jar}
}

// reportDial checks the answer to a websocket dial of d (wsURL, as given to the dialer):
// its 101, or the refusal before the upgrade, whose body the dialer kept (the first KiB).
func (d *daemon) reportDial(wsURL string, resp *http.Response) {
	d.t.Helper()
	if resp == nil {
		return
	}
	req, err := http.NewRequest(http.MethodGet, "http"+strings.TrimPrefix(wsURL, "ws"), nil)
	if err != nil {
		d.t.Fatal(err)
	}
	var body []byte
	if resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
		body, _ = io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(body))
	}
	d.reportContract(req, resp.StatusCode, resp.Header, body)
}

// errorRecorder is a testing.TB whose Errorf is recorded rather than failing the test.
type errorRecorder struct {
	testing.TB
	errs []string
}

func (r *errorRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// roundTripFunc answers requests with a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestContractTransportCanFail: the transport that checks the requests d.do cannot make
// reports an answer off its contract, hands the body on whole, and leaves a streamed body
// unread.
func TestContractTransportCanFail(t *testing.T) {
	answer := func(status int, ct, body string) roundTripFunc {
		return func(req *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {ct}}, Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
		}
	}
	cases := []struct {
		name, path string
		rt         roundTripFunc
		want       string // "" when the answer conforms
	}{
		{"conforming", "/healthz", answer(200, "application/json", `{"status":"ok"}`), ""},
		{"body off its schema", "/v1/sandboxes/demo", answer(200, "application/json", `{"id":"demo"}`), "getSandbox"},
		{"streamed file", "/v1/sandboxes/demo/files?path=/x", answer(200, "application/octet-stream", "bytes"), ""},
		{"file read of an undocumented type", "/v1/sandboxes/demo/files?path=/x", answer(200, "text/csv", "a,b"), "readFile"},
	}
	for _, c := range cases {
		rec := &errorRecorder{TB: t}
		client := &http.Client{Transport: contractTransport{base: c.rt, t: rec}}
		resp, err := client.Get("http://127.0.0.1:1" + c.path)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got := strings.Join(rec.errs, "\n")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: reported %q, want one containing %q", c.name, got, c.want)
		}
		if len(body) == 0 {
			t.Errorf("%s: the body did not reach the caller", c.name)
		}
	}
}
