package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/miekg/dns"
)

// The conformance run (issue 38) holds the server to its contract on the request side, with
// requests made from openapi/openapi.yaml itself rather than from a hand list: for every
// operation, a seeded generator builds requests the spec marks valid and mutations of them
// that it marks invalid (each judged by kin-openapi against the spec on the client side, so
// that a generator's mistake is never the server's), sends them to a real bothyd, and fails
//   - on a 400 (or 405) for a request the spec marks valid: a rule the server enforces that
//     the schema does not say;
//   - on an answer other than 400 invalid-request for a request the spec marks invalid: a
//     request that escapes the validator;
//   - on a method the spec does not list on a path that is not 405 with the spec's Allow;
//   - on any error answer that is not application/problem+json with a code.
//
// A `format: binary` body is bytes whose form the schema cannot describe (an image archive, a
// file's content): the server may refuse its content with 400 on field body, and only then.

// conformanceSeed makes a run reproducible; CONFORMANCE_SEED picks another.
const conformanceSeed = 38

// casesPerOperation bound the run: valid requests and mutations for each operation.
const (
	validPerOperation   = 3
	mutatedPerOperation = 6
	// validPerFileOperation is the valid requests of a files or exec operation when the run
	// has a sandbox: half of them name it, and half of those one of its paths, so that each
	// kind of refusal its files make is met.
	validPerFileOperation = 24
)

func TestConformanceGenerated(t *testing.T) {
	t.Parallel()
	doc := conformanceSpec(t)
	seed := uint64(conformanceSeed)
	if s := os.Getenv("CONFORMANCE_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CONFORMANCE_SEED: %v", err)
		}
		seed = n
	}
	t.Logf("seed %d (CONFORMANCE_SEED=%d reproduces this run)", seed, seed)
	// The generated webhooks name random hosts: their deliveries resolve through a DNS
	// server of the test's that knows none, so that no query leaves loopback.
	d := startDaemon(t, withoutAuth(), withArgs("--webhook-resolver", nowhereDNS(t)))
	c := &conformance{t: t, doc: doc, d: d, rng: rand.New(rand.NewPCG(seed, 38)), validStatus: map[int]int{}}
	if os.Getenv("CONFORMANCE_SANDBOX") != "" {
		requireRoot(t)
		// A running sandbox that half the requests name, so that they reach the handlers'
		// own checks rather than stop at sandbox-not-found, and half their paths and cwds
		// name its files (sandboxPaths): the refusals those make (a path the user may not
		// access, a directory read as a file, a name too long) have codes of their own and
		// are no 400. scripts/test runs it so (CONFORMANCE_SANDBOX=1).
		d.create(conformanceSandbox, true)
		c.sandbox = conformanceSandbox
	}
	paths := doc.Paths.InMatchingOrder()
	slices.Sort(paths)
	ops := 0
	for _, path := range paths {
		item := doc.Paths.Value(path)
		methodsOf := item.Operations()
		names := make([]string, 0, len(methodsOf))
		for m := range methodsOf {
			names = append(names, m)
		}
		slices.Sort(names)
		for _, method := range names {
			ops++
			c.operation(path, method, item, methodsOf[method])
		}
		c.unlistedMethods(path, item)
	}
	if ops < 40 {
		t.Fatalf("only %d operations in the spec; the run covers too little", ops)
	}
	t.Logf("%d operations, %d requests (%d valid, %d mutated, %d unlisted methods); valid requests answered %v", ops, c.sent, c.valid, c.mutated, c.unlisted, c.validStatus)
}

// conformanceSpec loads the contract as the server's validator sees it: no servers (any host)
// and no security requirements (the daemon runs without a token).
func conformanceSpec(t *testing.T) *openapi3.T {
	t.Helper()
	spec, err := os.ReadFile(filepath.Join("..", "openapi", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	doc.Servers = nil
	doc.Security = nil
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			op.Security = nil
		}
	}
	return doc
}

type conformance struct {
	t   *testing.T
	doc *openapi3.T
	d   *daemon
	rng *rand.Rand

	sent, valid, mutated, unlisted int
	// validStatus counts the answers to valid requests by status, for the log: a run whose
	// valid requests all end in 404 tests less than one where some succeed.
	validStatus map[int]int
	// sandbox, when set, is a running sandbox's id, given to half the requests' {id}.
	sandbox string
}

// answerWait bounds the wait for an answer. A valid request may wait as long as it asks
// (GET …/wait with timeout_ms up to an hour): one not answered by then is not judged, only
// logged. An invalid one must be refused at once.
const answerWait = 5 * time.Second

// conformanceSandbox is the id of the run's sandbox.
const conformanceSandbox = "conformance"

// genRequest is a request built from the spec, before it is sent.
type genRequest struct {
	path     string // the template
	params   map[string]string
	query    url.Values
	header   http.Header
	body     []byte
	hasBody  bool
	bodyType string
	jsonBody any // the body as a value, for mutations; nil when not JSON
}

func (g *genRequest) clone() *genRequest {
	c := *g
	c.params = copyParams(g.params)
	c.query = url.Values{}
	for k, v := range g.query {
		c.query[k] = slices.Clone(v)
	}
	c.header = g.header.Clone()
	c.body = slices.Clone(g.body)
	if g.jsonBody != nil {
		b, _ := json.Marshal(g.jsonBody)
		_ = json.Unmarshal(b, &c.jsonBody)
	}
	return &c
}

func copyParams(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// target is the request's path and query, its path parameters escaped.
func (g *genRequest) target() string {
	p := g.path
	for name, value := range g.params {
		esc := url.PathEscape(value)
		if name == "path" {
			// The proxies' {path} is the rest of the path: slashes stay slashes.
			esc = strings.ReplaceAll(esc, "%2F", "/")
		}
		p = strings.ReplaceAll(p, "{"+name+"}", esc)
	}
	if len(g.query) > 0 {
		p += "?" + g.query.Encode()
	}
	return p
}

func (c *conformance) operation(path, method string, item *openapi3.PathItem, op *openapi3.Operation) {
	name := op.OperationID
	route := &routers.Route{Spec: c.doc, Path: path, PathItem: item, Method: method, Operation: op}
	want := validPerOperation
	if c.sandbox != "" && (slices.Contains(op.Tags, "files") || slices.Contains(op.Tags, "exec")) {
		want = validPerFileOperation
	}
	valid, lastWhy := 0, ""
	for try := 0; valid < want && try < 4*want; try++ {
		g := c.generate(path, item, op)
		if why := c.judge(route, g); why != "" {
			// The generator missed a rule the schema states; try again, not the server's fault.
			lastWhy = why
			continue
		}
		valid++
		c.valid++
		c.send(name, method, g, true)
	}
	if valid == 0 {
		// Either the generator cannot follow the schema, or the schema takes no request at
		// all (kin-openapi cannot decode a parameter whose schema has a not): both leave the
		// operation untested, which the run must not pass over in silence.
		c.t.Errorf("%s: no request the spec takes could be made from it: %s", name, lastWhy)
	}
	if _, proxied := op.Extensions["x-proxy"]; !proxied {
		// A query that does not decode is no request of the contract, whatever the
		// operation; its pairs must not be dropped silently.
		if g := c.generate(path, item, op); c.judge(route, g) == "" {
			c.mutated++
			c.sendRaw(name+" (an undecodable query)", method, g, "%zz=1")
		}
	}
	for i := 0; i < mutatedPerOperation; i++ {
		base := c.generate(path, item, op)
		if c.judge(route, base) != "" {
			continue
		}
		m, what := c.mutate(base, item, op)
		if m == nil {
			continue
		}
		if c.judge(route, m) == "" {
			// A mutation the spec still allows is not an invalid request.
			continue
		}
		c.mutated++
		c.send(name+" ("+what+")", method, m, false)
	}
}

// judge returns why the spec refuses g, or "" when it takes it.
func (c *conformance) judge(route *routers.Route, g *genRequest) string {
	req, err := http.NewRequest(route.Method, "http://127.0.0.1"+g.target(), bytes.NewReader(g.body))
	if err != nil {
		return err.Error()
	}
	req.Header = g.header.Clone()
	if g.hasBody {
		req.Header.Set("Content-Type", g.bodyType)
	}
	params := copyParams(g.params)
	if _, proxied := route.Operation.Extensions["x-proxy"]; proxied && params["path"] == "" {
		params["path"] = "x" // as the server reads an empty rest (server/route.go)
	}
	jsonBody := g.bodyType == "" || g.bodyType == "application/json"
	err = openapi3filter.ValidateRequest(context.Background(), &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      route,
		Options: &openapi3filter.Options{
			AuthenticationFunc:  openapi3filter.NoopAuthenticationFunc,
			SkipSettingDefaults: true,
			ExcludeRequestBody:  !jsonBody,
		},
	})
	if err != nil {
		return err.Error()
	}
	if !jsonBody && route.Operation.RequestBody != nil && route.Operation.RequestBody.Value.Required && !g.hasBody {
		return "the required body is missing"
	}
	return ""
}

// generate builds a request the spec should take: every required parameter and about half of
// the optional ones, with values drawn from their schemas.
func (c *conformance) generate(path string, item *openapi3.PathItem, op *openapi3.Operation) *genRequest {
	g := &genRequest{path: path, params: map[string]string{}, query: url.Values{}, header: http.Header{}}
	for _, ref := range append(slices.Clone(item.Parameters), op.Parameters...) {
		p := ref.Value
		if p == nil || p.Schema == nil || (!p.Required && c.rng.IntN(2) == 0) {
			continue
		}
		v := c.value(p.Schema.Value, 0)
		if p.In == openapi3.ParameterInQuery && (p.Name == "path" || p.Name == "cwd") {
			v = c.maybeSandboxPath(v)
		}
		switch p.In {
		case openapi3.ParameterInPath:
			s := scalar(v)
			if p.Name == "id" && c.sandbox != "" && spares(op) && c.rng.IntN(2) == 0 {
				s = c.sandbox
			}
			if p.Name == "path" && c.rng.IntN(2) == 0 {
				s += "/" + scalar(c.value(p.Schema.Value, 0))
			}
			g.params[p.Name] = s
		case openapi3.ParameterInQuery:
			if arr, ok := v.([]any); ok {
				for _, e := range arr {
					g.query.Add(p.Name, scalar(e))
				}
				if len(arr) == 0 {
					// An empty array is no parameter at all in form style.
					delete(g.query, p.Name)
				}
			} else {
				g.query.Set(p.Name, scalar(v))
			}
		case openapi3.ParameterInHeader:
			g.header.Set(p.Name, scalar(v))
		}
	}
	if op.RequestBody != nil && op.RequestBody.Value != nil {
		rb := op.RequestBody.Value
		if rb.Required || c.rng.IntN(2) == 0 {
			if mt := rb.Content.Get("application/json"); mt != nil && mt.Schema != nil {
				g.jsonBody = c.value(mt.Schema.Value, 0)
				g.body, _ = json.Marshal(g.jsonBody)
				g.hasBody, g.bodyType = true, "application/json"
			} else {
				for ct := range rb.Content {
					g.bodyType = ct
				}
				g.body = make([]byte, c.rng.IntN(64))
				for i := range g.body {
					g.body[i] = byte(c.rng.IntN(256))
				}
				g.hasBody = true
			}
		}
	}
	return g
}

// scalar writes a generated value as a parameter's text.
func scalar(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case int64:
		return strconv.FormatInt(v, 10)
	case bool:
		return strconv.FormatBool(v)
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

// value draws a value that schema should take (it is checked against the schema afterwards).
func (c *conformance) value(s *openapi3.Schema, depth int) any {
	if s == nil {
		return "x"
	}
	if len(s.Enum) > 0 {
		return s.Enum[c.rng.IntN(len(s.Enum))]
	}
	if len(s.AllOf) > 0 {
		// Documented fields refer to a shared schema through allOf; draw from it and let
		// the check judge the rest.
		v := c.value(s.AllOf[0].Value, depth)
		for _, extra := range s.AllOf[1:] {
			if m, ok := v.(map[string]any); ok {
				if em, ok := c.value(extra.Value, depth).(map[string]any); ok {
					for k, x := range em {
						m[k] = x
					}
				}
			}
		}
		return v
	}
	if len(s.OneOf) > 0 {
		return c.value(s.OneOf[c.rng.IntN(len(s.OneOf))].Value, depth)
	}
	if len(s.AnyOf) > 0 {
		return c.value(s.AnyOf[c.rng.IntN(len(s.AnyOf))].Value, depth)
	}
	switch {
	case s.Type.Is(openapi3.TypeBoolean):
		return c.rng.IntN(2) == 0
	case s.Type.Is(openapi3.TypeInteger), s.Type.Is(openapi3.TypeNumber):
		lo, hi := float64(-1000), float64(100000)
		if s.Min != nil {
			lo = *s.Min
			if s.ExclusiveMin.IsSet() {
				lo++
			}
		}
		if s.Max != nil {
			hi = *s.Max
			if s.ExclusiveMax.IsSet() {
				hi--
			}
		}
		if hi < lo {
			hi = lo
		}
		// Bounds are likelier to find a disagreement than the middle.
		switch c.rng.IntN(4) {
		case 0:
			return lo
		case 1:
			return hi
		}
		span := hi - lo
		if span > 1<<40 {
			span = 1 << 40
		}
		return lo + float64(c.rng.Int64N(int64(span)+1))
	case s.Type.Is(openapi3.TypeArray):
		n := int(s.MinItems) + c.rng.IntN(3)
		if s.MaxItems != nil && uint64(n) > *s.MaxItems {
			n = int(*s.MaxItems)
		}
		arr := make([]any, 0, n)
		var item *openapi3.Schema
		if s.Items != nil {
			item = s.Items.Value
		}
		for i := 0; i < n; i++ {
			arr = append(arr, c.value(item, depth+1))
		}
		// x-first-item: the rule of the first item (a command's program), which OpenAPI
		// 3.0 cannot state.
		if first, ok := s.Extensions["x-first-item"].(map[string]any); ok && len(arr) > 0 && item != nil {
			if ml, ok := first["minLength"].(float64); ok {
				for try := 0; try < 20 && len([]rune(scalar(arr[0]))) < int(ml); try++ {
					arr[0] = c.value(item, depth+1)
				}
			}
		}
		return arr
	case s.Type.Is(openapi3.TypeObject) || len(s.Properties) > 0:
		obj := map[string]any{}
		names := make([]string, 0, len(s.Properties))
		for n := range s.Properties {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			if slices.Contains(s.Required, n) || (depth < 4 && c.rng.IntN(2) == 0) {
				obj[n] = c.value(s.Properties[n].Value, depth+1)
				if n == "cwd" {
					obj[n] = c.maybeSandboxPath(obj[n])
				}
			}
		}
		if ap := s.AdditionalProperties.Schema; ap != nil && ap.Value != nil && depth < 4 {
			for i := c.rng.IntN(3); i > 0; i-- {
				obj[c.keyFor(s)] = c.value(ap.Value, depth+1)
			}
		}
		return obj
	default:
		return c.text(s)
	}
}

// spares says whether op leaves a running sandbox running, so that the run may name its
// sandbox in it: a read, or a files, exec or ports operation. A stop, pause or forced delete
// of it would leave every operation after it only sandbox-not-found or not-running to answer.
func spares(op *openapi3.Operation) bool {
	if strings.HasPrefix(op.OperationID, "get") || strings.HasPrefix(op.OperationID, "list") || op.OperationID == "waitSandbox" {
		return true
	}
	return slices.Contains(op.Tags, "files") || slices.Contains(op.Tags, "exec") || slices.Contains(op.Tags, "ports")
}

// sandboxPaths are paths the run's sandbox has, each refused to its user in its own way or
// taken: a random path is missing, and would only ever reach file-not-found. They are the
// values of a `path` or a `cwd`, never the run's list of requests: each request is still
// made from the spec and judged by it (the root directory is no RemovablePath).
var sandboxPaths = []string{
	"/", "/tmp", "/home/user", "/etc", "/etc/passwd", // taken, or a directory read as a file
	"/root", "/etc/shadow", "/proc/self", "/proc/1/environ", // the user may not
	"/etc/passwd/x", "/dev/null", // a file as a directory, a device
	"/tmp/" + strings.Repeat("n", 300), // a name longer than the file system holds
}

// maybeSandboxPath is, for half the values when the run has a sandbox, one of its paths
// instead of v.
func (c *conformance) maybeSandboxPath(v any) any {
	if c.sandbox == "" || c.rng.IntN(2) == 0 {
		return v
	}
	return sandboxPaths[c.rng.IntN(len(sandboxPaths))]
}

// keyFor draws a key of a map: from its x-key-pattern (the rule of its keys, which OpenAPI
// 3.0 cannot state) when it has one.
func (c *conformance) keyFor(m *openapi3.Schema) string {
	if p, ok := m.Extensions["x-key-pattern"].(string); ok {
		return c.text(&openapi3.Schema{Pattern: p})
	}
	return "K" + strconv.Itoa(c.rng.IntN(1000))
}

// text draws a string for a string schema: from its pattern when it has one.
func (c *conformance) text(s *openapi3.Schema) string {
	minLen := int(s.MinLength)
	maxLen := minLen + 12
	if s.MaxLength != nil && int(*s.MaxLength) < maxLen {
		maxLen = int(*s.MaxLength)
	}
	for try := 0; try < 20; try++ {
		var out string
		if s.Pattern != "" {
			re, err := syntax.Parse(s.Pattern, syntax.Perl)
			if err != nil {
				return strings.Repeat("a", max(minLen, 1))
			}
			var b strings.Builder
			c.regex(&b, re.Simplify())
			out = b.String()
		} else {
			switch s.Format {
			case "date-time":
				return time.Unix(c.rng.Int64N(2e9), 0).UTC().Format(time.RFC3339)
			}
			n := minLen + c.rng.IntN(maxLen-minLen+1)
			const letters = "abcdefghijklmnopqrstuvwxyz0123456789-_."
			bs := make([]byte, n)
			for i := range bs {
				bs[i] = letters[c.rng.IntN(len(letters))]
			}
			out = string(bs)
		}
		if n := len([]rune(out)); n >= minLen && (s.MaxLength == nil || uint64(n) <= *s.MaxLength) {
			return out
		}
	}
	return strings.Repeat("a", max(minLen, 1))
}

// regex writes a string that re matches, preferring printable ASCII.
func (c *conformance) regex(b *strings.Builder, re *syntax.Regexp) {
	reps := func(lo, hi int) int {
		if hi < 0 || hi > lo+3 {
			hi = lo + 3
		}
		return lo + c.rng.IntN(hi-lo+1)
	}
	switch re.Op {
	case syntax.OpLiteral:
		b.WriteString(string(re.Rune))
	case syntax.OpCharClass:
		for try := 0; try < 50; try++ {
			r := rune(0x21 + c.rng.IntN(0x7e-0x21+1))
			for i := 0; i+1 < len(re.Rune); i += 2 {
				if r >= re.Rune[i] && r <= re.Rune[i+1] {
					b.WriteRune(r)
					return
				}
			}
		}
		if len(re.Rune) >= 2 {
			i := 2 * c.rng.IntN(len(re.Rune)/2)
			b.WriteRune(re.Rune[i])
		}
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		b.WriteByte(byte('a' + c.rng.IntN(26)))
	case syntax.OpCapture:
		c.regex(b, re.Sub[0])
	case syntax.OpStar:
		for i := reps(0, 3); i > 0; i-- {
			c.regex(b, re.Sub[0])
		}
	case syntax.OpPlus:
		for i := reps(1, 3); i > 0; i-- {
			c.regex(b, re.Sub[0])
		}
	case syntax.OpQuest:
		if c.rng.IntN(2) == 0 {
			c.regex(b, re.Sub[0])
		}
	case syntax.OpRepeat:
		for i := reps(re.Min, re.Max); i > 0; i-- {
			c.regex(b, re.Sub[0])
		}
	case syntax.OpConcat:
		for _, sub := range re.Sub {
			c.regex(b, sub)
		}
	case syntax.OpAlternate:
		c.regex(b, re.Sub[c.rng.IntN(len(re.Sub))])
	}
}

// invalidTexts are the values a mutation tries for a parameter or a field, in the order drawn.
var invalidTexts = []any{"", "A", "-", "a b", "0", "-1", "99999999999", "x" + strings.Repeat("y", 300), "true", "1.5", "Ü", "../x"}

// mutate changes one thing in g so that the spec refuses it (judged afterwards), and says what.
func (c *conformance) mutate(g *genRequest, item *openapi3.PathItem, op *openapi3.Operation) (*genRequest, string) {
	var params []*openapi3.Parameter
	for _, ref := range append(slices.Clone(item.Parameters), op.Parameters...) {
		if ref.Value != nil && ref.Value.In != openapi3.ParameterInCookie {
			params = append(params, ref.Value)
		}
	}
	kinds := []string{}
	if len(params) > 0 {
		kinds = append(kinds, "parameter", "parameter")
	}
	if g.jsonBody != nil {
		kinds = append(kinds, "body field", "body field", "body type")
	}
	if op.RequestBody != nil && op.RequestBody.Value != nil && op.RequestBody.Value.Required && g.jsonBody != nil {
		// A missing bytes body is an empty one (an empty file): only a JSON body can be
		// missing.
		kinds = append(kinds, "no body")
	}
	if len(kinds) == 0 {
		return nil, ""
	}
	m := g.clone()
	switch kind := kinds[c.rng.IntN(len(kinds))]; kind {
	case "parameter":
		p := params[c.rng.IntN(len(params))]
		bad := scalar(invalidTexts[c.rng.IntN(len(invalidTexts))])
		switch p.In {
		case openapi3.ParameterInPath:
			if bad == "" || strings.Contains(bad, "/") {
				// An empty or split segment is another route, not this one's parameter.
				return nil, ""
			}
			m.params[p.Name] = bad
		case openapi3.ParameterInQuery:
			if p.Required && c.rng.IntN(3) == 0 {
				m.query.Del(p.Name)
				return m, "without " + p.Name
			}
			m.query.Set(p.Name, bad)
		case openapi3.ParameterInHeader:
			if p.Required && c.rng.IntN(2) == 0 {
				m.header.Del(p.Name)
				return m, "without " + p.Name
			}
			m.header.Set(p.Name, bad)
		}
		return m, fmt.Sprintf("%s %s=%.20q", p.In, p.Name, bad)
	case "body field":
		obj, ok := m.jsonBody.(map[string]any)
		if !ok {
			return nil, ""
		}
		// A field of the body or of an object within it, set to a value its schema refuses,
		// or an unknown field.
		for depth := 0; depth < 3; depth++ {
			keys := make([]string, 0, len(obj))
			for k := range obj {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if len(keys) == 0 || c.rng.IntN(3) == 0 {
				obj["zz_unknown"] = 1
				break
			}
			k := keys[c.rng.IntN(len(keys))]
			if inner, ok := obj[k].(map[string]any); ok && c.rng.IntN(2) == 0 {
				obj = inner
				continue
			}
			if c.rng.IntN(4) == 0 {
				delete(obj, k)
			} else {
				obj[k] = invalidTexts[c.rng.IntN(len(invalidTexts))]
			}
			break
		}
		m.body, _ = json.Marshal(m.jsonBody)
		return m, "body " + string(truncate(m.body, 80))
	case "body type":
		alts := []string{`[]`, `"x"`, `1`, `null`, `{`, `{"a":1`}
		m.body = []byte(alts[c.rng.IntN(len(alts))])
		m.jsonBody = nil
		return m, "body " + string(m.body)
	default: // no body
		m.body, m.hasBody, m.jsonBody = nil, false, nil
		return m, "without its body"
	}
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// send sends g and judges the answer.
func (c *conformance) send(name, method string, g *genRequest, valid bool) {
	c.t.Helper()
	c.judgeAnswer(name, method, g, g.target(), valid)
}

// sendRaw sends g with extra appended to its query as it is, unescaped, and wants it refused.
func (c *conformance) sendRaw(name, method string, g *genRequest, extra string) {
	c.t.Helper()
	target := g.target()
	if strings.Contains(target, "?") {
		target += "&" + extra
	} else {
		target += "?" + extra
	}
	c.judgeAnswer(name, method, g, target, false)
}

func (c *conformance) judgeAnswer(name, method string, g *genRequest, target string, valid bool) {
	t := c.t
	t.Helper()
	c.sent++
	status, header, body := c.roundTrip(method, target, g.header, g.body, g.hasBody, g.bodyType, true, valid)
	if status == 0 {
		return
	}
	if valid {
		c.validStatus[status]++
	}
	what := fmt.Sprintf("%s: %s %.200s", name, method, target)
	p, ok := c.checkProblem(what, method == http.MethodHead, status, header, body)
	switch {
	case valid && (status == http.StatusBadRequest || status == http.StatusMethodNotAllowed):
		binaryBody := g.hasBody && g.jsonBody == nil
		if binaryBody && status == http.StatusBadRequest && ok && (p.Field == "body" || p.Field == "") {
			return // the content of bytes the schema cannot describe
		}
		t.Errorf("%s (headers %v, body %s): a request the spec takes was refused: %d %s", what, g.header, truncate(g.body, 300), status, truncate(body, 400))
	case valid && ok && p.Code == "not-found":
		t.Errorf("%s: a route the spec describes is not served: %s", what, truncate(body, 300))
	case !valid && (status != http.StatusBadRequest || !ok || p.Code != "invalid-request"):
		t.Errorf("%s: a request the spec refuses was answered %d, want 400 invalid-request: %s", what, status, truncate(body, 300))
	}
}

// unlistedMethods sends each method the spec does not list on path and wants 405 with the
// spec's methods in Allow.
func (c *conformance) unlistedMethods(path string, item *openapi3.PathItem) {
	var listed []string
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		if item.GetOperation(m) != nil {
			listed = append(listed, m)
		}
	}
	g := c.generate(path, item, item.Operations()[listed[0]])
	for name, v := range g.params {
		if v == "" || strings.Contains(v, "/") {
			g.params[name] = "a1"
		}
	}
	if _, ok := g.params["path"]; ok {
		g.params["path"] = "a/b"
	}
	g.query = url.Values{}
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PROPFIND"} {
		if slices.Contains(listed, m) {
			continue
		}
		c.unlisted++
		c.sent++
		status, header, body := c.roundTrip(m, g.target(), g.header, nil, false, "", false, false)
		what := fmt.Sprintf("%s %s (the spec lists %s)", m, g.target(), strings.Join(listed, ", "))
		if status == 0 {
			continue
		}
		if status != http.StatusMethodNotAllowed {
			c.t.Errorf("%s: %d, want 405: %s", what, status, truncate(body, 300))
			continue
		}
		c.checkProblem(what, m == http.MethodHead, status, header, body)
		if got := header.Get("Allow"); got != strings.Join(listed, ", ") {
			c.t.Errorf("%s: Allow %q, want %q", what, got, strings.Join(listed, ", "))
		}
	}
}

// checkProblem fails the test when an error answer is not problem+json with a code, and
// returns the problem.
func (c *conformance) checkProblem(what string, head bool, status int, header http.Header, body []byte) (problem, bool) {
	var p problem
	if status < 400 {
		return p, false
	}
	ct, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	if ct != "application/problem+json" {
		c.t.Errorf("%s: answered %d with Content-Type %q, want application/problem+json: %s", what, status, header.Get("Content-Type"), truncate(body, 200))
		return p, false
	}
	if head {
		// No body to judge: a HEAD answer's status stands for its problem.
		return problem{Status: status, Code: "invalid-request"}, status == http.StatusBadRequest
	}
	if err := json.Unmarshal(body, &p); err != nil || p.Code == "" || p.Status != status {
		c.t.Errorf("%s: answered %d with a problem without a code or status: %s", what, status, truncate(body, 200))
		return p, false
	}
	return p, true
}

// roundTrip sends one request with a bounded wait; a websocket the server upgraded is closed
// at once. It returns status 0 when the request could not be made (reported).
// An answer to an operation of the contract is also checked against the operation's responses
// (checkResponses), as every e2e request is.
func (c *conformance) roundTrip(method, target string, header http.Header, body []byte, hasBody bool, bodyType string, checkResponses, mayWait bool) (int, http.Header, []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), answerWait)
	defer cancel()
	var rd io.Reader
	if hasBody {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.d.URL+target, rd)
	if err != nil {
		c.t.Errorf("%s %s: %v", method, target, err)
		return 0, nil, nil
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if hasBody {
		req.Header.Set("Content-Type", bodyType)
	}
	began := time.Now()
	resp, err := c.d.httpClient().Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && mayWait {
			c.t.Logf("%s %.200s: no answer within %v; not judged", method, target, answerWait)
			return 0, nil, nil
		}
		c.t.Errorf("%s %s: %v", method, target, err)
		return 0, nil, nil
	}
	if d := time.Since(began); d > 2*time.Second {
		c.t.Logf("%s %.120s took %v (%d)", method, target, d.Round(time.Millisecond), resp.StatusCode)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// A websocket or an event stream: it goes on as long as the client likes.
		return resp.StatusCode, resp.Header, nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if checkResponses {
		c.d.reportContract(req, resp.StatusCode, resp.Header, b)
	}
	return resp.StatusCode, resp.Header, b
}

// nowhereDNS serves DNS on loopback, answering every query that no such name exists, and
// returns its address.
func nowhereDNS(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeNameError)
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String()
}
