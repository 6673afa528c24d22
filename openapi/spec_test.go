package openapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// problemRef is the one schema every error response must carry.
const problemRef = "#/components/schemas/Problem"

// maxDeadlineMS is the longest deadline the contract accepts: every deadline is finite.
const maxDeadlineMS = 3600000

// statusOfCode is docs/design.md's error table plus the codes the HTTP layer itself produces. It
// checks that an operation's x-error-codes lists each code under the status it is sent with.
var statusOfCode = map[string]int{
	"invalid-request":      400,
	"unauthorized":         401,
	"forbidden":            403,
	"not-found":            404,
	"method-not-allowed":   405,
	"payload-too-large":    413,
	"not-implemented":      501,
	"internal":             500,
	"unavailable":          503,
	"storage-full":         507,
	"storage-unavailable":  503,
	"node-full":            503,
	"node-draining":        503,
	"node-not-found":       404,
	"not-a-cluster":        501,
	"registry-unavailable": 503,
	"registry-refused":     503,
	// A cluster router's own (docs/cluster.md).
	"node-lost":         503,
	"no-node-available": 503,
	"volumes-apart":     409,

	"sandbox-not-found":    404,
	"template-not-found":   404,
	"generation-not-found": 404,
	"file-not-found":       404,
	"image-not-found":      404,

	"already-provisioned": 409,
	"provisioned-again":   409,
	"already-running":     409,
	"not-running":         409,
	"sandbox-launched":    409,
	"foreign-files":       409,
	"runtime-mismatch":    409,
	"template-exists":     409,
	"template-tombstoned": 409,
	"template-ineligible": 409,
	"sandbox-paused":      409,
	"sandbox-waking":      503,
	"pids-limit":          409,

	"sandbox-busy":           423,
	"transition-in-progress": 423,
	"sandbox-leased":         423,
	"generation-leased":      423,
	"image-in-use":           423,
	"volume-not-found":       404,
	"volume-exists":          409,
	"volume-in-use":          423,
	"volume-full":            507,

	"wait-timeout": 408,

	"stop-timeout":  504,
	"start-timeout": 504,

	"port-unreachable": 502,
	"limit-reached":    429,
	"link-not-found":   404,

	"webhook-not-found":         404,
	"idempotency-key-reused":    422,
	"idempotency-key-in-flight": 409,

	"permission-denied":      403,
	"not-a-directory":        409,
	"is-a-directory":         409,
	"not-a-regular-file":     409,
	"directory-not-empty":    409,
	"file-exists":            409,
	"symlink-loop":           409,
	"mount-inside":           409,
	"file-changed":           409,
	"name-too-long":          422,
	"checkpoint-not-found":   404,
	"checkpoint-exists":      409,
	"checkpoint-limit":       409,
	"checkpoint-unsupported": 501,
	"secret-not-found":       404,
	"secret-exists":          409,
	"webhook-exists":         409,
	"secret-in-use":          409,
}

// genericStatuses are answered by the middleware or the error mapper for any operation, so
// operations list them without naming codes in x-error-codes.
var genericStatuses = map[int]bool{401: true, 403: true, 500: true, 501: true}

// loadSpec parses and validates Spec, failing the test on any error.
func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := loadAndValidate(Spec)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func loadAndValidate(spec []byte) (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(spec)
	if err != nil {
		return nil, fmt.Errorf("loading openapi.yaml: %w", err)
	}
	// Validation includes the examples, so an example that drifts from its schema fails too.
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("validating openapi.yaml: %w", err)
	}
	return doc, nil
}

// operation is one method on one path, in a stable order for error messages.
type operation struct {
	path, method string
	item         *openapi3.PathItem
	op           *openapi3.Operation
}

func (o operation) String() string { return o.method + " " + o.path }

func operations(doc *openapi3.T) []operation {
	var ops []operation
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			ops = append(ops, operation{path: path, method: method, item: item, op: op})
		}
	}
	sort.Slice(ops, func(i, j int) bool {
		if ops[i].path != ops[j].path {
			return ops[i].path < ops[j].path
		}
		return ops[i].method < ops[j].method
	})
	return ops
}

// parameters returns the operation's parameters and those of its path item.
func (o operation) parameters() openapi3.Parameters {
	return append(slices.Clone(o.item.Parameters), o.op.Parameters...)
}

func TestSpecIsValid(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi = %q, want 3.0.3", doc.OpenAPI)
	}
}

// TestSpecRejectsBrokenEdits is the drift guard's own test: it breaks the spec in the ways a
// sloppy edit would and checks that loading or the project's rules catch each one.
func TestSpecRejectsBrokenEdits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, old, new string
		want           string // in the error or the rule violations, to show why it was caught
	}{
		{"dangling reference", "$ref: '#/components/schemas/ExecResult'", "$ref: '#/components/schemas/NoSuchThing'",
			"NoSuchThing"},
		{"example that contradicts its schema", "exit_code: 3", "exit_code: three",
			"invalid example"},
		{"unbounded deadline", "maximum: 3600000\n      default: 60000", "default: 60000",
			"timeout_ms: a deadline must be between"},
		{"request default inline", "        start:\n          $ref: '#/components/schemas/StartOnCreate'\n", "        start:\n          type: boolean\n          default: false\n",
			"start: a request property with a default"},
		{"error response without Problem", "\"400\": {$ref: '#/components/responses/BadRequest'}\n        \"401\": {$ref: '#/components/responses/Unauthorized'}\n        \"403\": {$ref: '#/components/responses/Forbidden'}\n        \"404\": {$ref: '#/components/responses/NotFound'}\n        \"500\"",
			"\"400\": {description: plain, content: {text/plain: {schema: {type: string}}}}\n        \"401\": {$ref: '#/components/responses/Unauthorized'}\n        \"403\": {$ref: '#/components/responses/Forbidden'}\n        \"404\": {$ref: '#/components/responses/NotFound'}\n        \"500\"",
			"the 400 response is not application/problem+json"},
		{"code missing from the enum", "        - foreign-files\n", "",
			`ErrorCode enum lacks errcode's "foreign-files"`},
		{"code not in errcode", "        - stop-timeout\n", "        - stop-timeout\n        - stopped-too-late\n",
			`"stopped-too-late", which errcode does not define`},
		{"operation without an id", "      operationId: getInfo\n", "",
			"GET /v1/info: no operationId"},
		{"string without maxLength", "          maxLength: 1048576\n", "",
			"stdin: a string without maxLength"},
		{"array without maxItems", "            minItems: 1\n            maxItems: 1024\n", "            minItems: 1\n",
			"parameter command: an array without maxItems"},
		{"open request object", "    CaptureRequest:\n      type: object\n      additionalProperties: false\n", "    CaptureRequest:\n      type: object\n",
			"an object without additionalProperties: false"},
		{"missing 401", "        \"401\": {$ref: '#/components/responses/Unauthorized'}\n        \"403\": {$ref: '#/components/responses/Forbidden'}\n        \"500\": {$ref: '#/components/responses/InternalError'}\n        \"501\": {$ref: '#/components/responses/NotImplemented'}\n\n  /v1/events:",
			"        \"403\": {$ref: '#/components/responses/Forbidden'}\n        \"500\": {$ref: '#/components/responses/InternalError'}\n        \"501\": {$ref: '#/components/responses/NotImplemented'}\n\n  /v1/events:",
			"GET /v1/info: no 401 response"},
		{"code under the wrong status", "\"423\": [sandbox-busy, transition-in-progress]", "\"423\": [sandbox-busy, transition-in-progress, stop-timeout]",
			`lists "stop-timeout" under 423`},
		{"error status without codes", "        \"404\": [sandbox-not-found, file-not-found]\n        \"409\": [not-running, sandbox-paused, runtime-mismatch, pids-limit, not-a-directory, symlink-loop]\n        \"413\": [payload-too-large]\n        \"422\": [name-too-long]",
			"        \"409\": [not-running, sandbox-paused, runtime-mismatch, pids-limit, not-a-directory, symlink-loop]\n        \"413\": [payload-too-large]\n        \"422\": [name-too-long]",
			"the 404 response names no codes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if !bytes.Contains(Spec, []byte(tc.old)) {
				t.Fatalf("the spec no longer contains %q; update this test", tc.old)
			}
			broken := bytes.Replace(Spec, []byte(tc.old), []byte(tc.new), 1)
			var why string
			if doc, err := loadAndValidate(broken); err != nil {
				why = err.Error()
			} else {
				why = strings.Join(ruleViolations(t, doc), "\n")
			}
			if why == "" {
				t.Fatalf("breaking the spec went unnoticed")
			}
			if !strings.Contains(why, tc.want) {
				t.Fatalf("breaking the spec was caught, but not for the expected reason %q:\n%s", tc.want, why)
			}
		})
	}
}

// TestSpecFollowsProjectRules applies the rules that kin-openapi does not know about.
func TestSpecFollowsProjectRules(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	for _, p := range ruleViolations(t, doc) {
		t.Error(p)
	}
}

// ruleViolations returns every breach of the project's own rules for the contract.
func ruleViolations(t *testing.T, doc *openapi3.T) []string {
	t.Helper()
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	out = append(out, errorCodeEnumViolations(t, doc)...)

	ids := map[string]string{}
	for _, o := range operations(doc) {
		if o.op.OperationID == "" {
			add("%s: no operationId", o)
		} else if prev, dup := ids[o.op.OperationID]; dup {
			add("%s: operationId %q is also used by %s", o, o.op.OperationID, prev)
		}
		ids[o.op.OperationID] = o.String()

		statuses := responseStatuses(o.op)
		if strings.HasPrefix(o.path, "/v1/") {
			need := []int{401, 403, 500, 501}
			if len(o.parameters()) > 0 || o.op.RequestBody != nil {
				need = append(need, 400)
			}
			if o.op.RequestBody != nil {
				need = append(need, 413)
			}
			for _, s := range need {
				if !statuses[s] {
					add("%s: no %d response", o, s)
				}
			}
		}

		for code, ref := range o.op.Responses.Map() {
			status, err := strconv.Atoi(code)
			if err != nil {
				add("%s: response %q is not a status code", o, code)
				continue
			}
			if status < 400 {
				continue
			}
			if !strings.HasPrefix(ref.Ref, "#/components/responses/") {
				add("%s: the %d response is not a shared component of components/responses", o, status)
			}
			content := ref.Value.Content
			mt := content.Get("application/problem+json")
			if len(content) != 1 || mt == nil || mt.Schema == nil || mt.Schema.Ref != problemRef {
				add("%s: the %d response is not application/problem+json with %s", o, status, problemRef)
			}
		}

		out = append(out, errorCodeListViolations(o, statuses)...)

		for _, p := range o.parameters() {
			checkBounded(p.Value.Schema, fmt.Sprintf("%s parameter %s", o, p.Value.Name), p.Value.Name, map[*openapi3.Schema]bool{}, add)
		}
		if rb := o.op.RequestBody; rb != nil {
			for ct, mt := range rb.Value.Content {
				if ct == "application/octet-stream" {
					continue // A raw, streamed body: the server's body limit bounds it.
				}
				checkBounded(mt.Schema, fmt.Sprintf("%s body (%s)", o, ct), "", map[*openapi3.Schema]bool{}, add)
			}
		}
	}
	sort.Strings(out)
	return out
}

func responseStatuses(op *openapi3.Operation) map[int]bool {
	m := map[int]bool{}
	for code := range op.Responses.Map() {
		if n, err := strconv.Atoi(code); err == nil {
			m[n] = true
		}
	}
	return m
}

// errorCodeListViolations checks an operation's x-error-codes against its responses: every
// listed code is a known code under the status it is sent with, every listed status has a
// response, and every error response that is not generic names its codes.
func errorCodeListViolations(o operation, statuses map[int]bool) []string {
	var out []string
	raw, ok := o.op.Extensions["x-error-codes"]
	if !ok {
		return []string{fmt.Sprintf("%s: no x-error-codes (use {} when it has none)", o)}
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return []string{fmt.Sprintf("%s: x-error-codes: %v", o, err)}
	}
	var lists map[string][]string
	if err := json.Unmarshal(b, &lists); err != nil {
		return []string{fmt.Sprintf("%s: x-error-codes is not a map of status to codes: %v", o, err)}
	}
	listed := map[int]bool{}
	for key, codes := range lists {
		status, err := strconv.Atoi(key)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: x-error-codes key %q is not a status", o, key))
			continue
		}
		listed[status] = true
		if !statuses[status] {
			out = append(out, fmt.Sprintf("%s: x-error-codes lists %d, which is not among its responses", o, status))
		}
		if len(codes) == 0 {
			out = append(out, fmt.Sprintf("%s: x-error-codes lists no code for %d", o, status))
		}
		for _, c := range codes {
			want, known := statusOfCode[c]
			switch {
			case !known:
				out = append(out, fmt.Sprintf("%s: x-error-codes names unknown code %q", o, c))
			case want != status:
				out = append(out, fmt.Sprintf("%s: x-error-codes lists %q under %d; it is sent with %d", o, c, status, want))
			}
		}
	}
	for status := range statuses {
		if status >= 400 && !genericStatuses[status] && !listed[status] {
			out = append(out, fmt.Sprintf("%s: the %d response names no codes in x-error-codes", o, status))
		}
	}
	return out
}

// checkBounded reports request input that the contract leaves unbounded: a string without
// maxLength (or enum), an array without maxItems, a map without maxProperties, an open
// object, a number without minimum and maximum, and a deadline that may be zero or endless.
func checkBounded(ref *openapi3.SchemaRef, where, name string, seen map[*openapi3.Schema]bool, add func(string, ...any)) {
	if ref == nil || ref.Value == nil {
		add("%s: no schema", where)
		return
	}
	s := ref.Value
	if seen[s] {
		return
	}
	seen[s] = true
	defer delete(seen, s) // The same schema may be reached under another name with other rules.
	for _, sub := range slices.Concat(s.AllOf, s.OneOf, s.AnyOf) {
		checkBounded(sub, where, name, seen, add)
	}
	if s.Type == nil {
		if len(s.AllOf)+len(s.OneOf)+len(s.AnyOf) == 0 {
			add("%s: no type", where)
		}
		return
	}
	isDeadline := name == "timeout" || strings.HasSuffix(name, "_ms")
	switch {
	case s.Type.Is("string"):
		if s.MaxLength == nil && len(s.Enum) == 0 {
			add("%s: a string without maxLength or enum", where)
		}
	case s.Type.Is("integer"), s.Type.Is("number"):
		if s.Min == nil || s.Max == nil {
			add("%s: a number without minimum and maximum", where)
		}
		if isDeadline && (s.Min == nil || *s.Min < 1 || s.Max == nil || *s.Max > maxDeadlineMS) {
			add("%s: a deadline must be between 1 and %d ms", where, maxDeadlineMS)
		}
	case s.Type.Is("array"):
		if s.MaxItems == nil {
			add("%s: an array without maxItems", where)
		}
		checkBounded(s.Items, where+"[]", name, seen, add)
	case s.Type.Is("object"):
		ap := s.AdditionalProperties
		if ap.Schema != nil {
			if s.MaxProps == nil {
				add("%s: a map without maxProperties", where)
			}
			checkBounded(ap.Schema, where+"{}", name, seen, add)
		} else if ap.Has == nil || *ap.Has {
			add("%s: an object without additionalProperties: false", where)
		}
		for prop, sub := range s.Properties {
			// openapi-typescript types a property whose own schema has a default as always
			// present, so a client would have to send it; a reference to a named schema that
			// holds the default keeps it optional, for every generator alike.
			if sub.Ref == "" && sub.Value != nil && sub.Value.Default != nil {
				add("%s.%s: a request property with a default must be a $ref to a named schema that holds it", where, prop)
			}
			checkBounded(sub, where+"."+prop, prop, seen, add)
		}
	case s.Type.Is("boolean"):
	default:
		add("%s: unexpected type %v", where, s.Type.Slice())
	}
}

// errorCodeEnumViolations compares the ErrorCode enum with the Code constants of package
// errcode, read from its source so that this package need not import it.
func errorCodeEnumViolations(t *testing.T, doc *openapi3.T) []string {
	t.Helper()
	want := errcodeCodes(t)
	ref := doc.Components.Schemas["ErrorCode"]
	if ref == nil {
		return []string{"components/schemas/ErrorCode is missing"}
	}
	// The list is open (x-extensible-enum), so that generated clients take a code they do
	// not know yet; a closed enum would make them raise on it.
	var out []string
	if len(ref.Value.Enum) > 0 {
		out = append(out, "ErrorCode is a closed enum; list the codes in x-extensible-enum")
	}
	var got []string
	if list, ok := ref.Value.Extensions["x-extensible-enum"].([]any); ok {
		for _, v := range list {
			got = append(got, fmt.Sprint(v))
		}
	}
	if p := doc.Components.Schemas["Problem"]; p == nil || p.Value.Properties["code"] == nil ||
		p.Value.Properties["code"].Ref != "#/components/schemas/ErrorCode" {
		out = append(out, "Problem.code does not refer to #/components/schemas/ErrorCode")
	}
	for _, c := range want {
		if !slices.Contains(got, c) {
			out = append(out, fmt.Sprintf("ErrorCode enum lacks errcode's %q", c))
		}
	}
	for _, c := range got {
		if !slices.Contains(want, c) {
			out = append(out, fmt.Sprintf("ErrorCode enum has %q, which errcode does not define", c))
		}
		if _, ok := statusOfCode[c]; !ok {
			out = append(out, fmt.Sprintf("code %q has no status in this test's statusOfCode table", c))
		}
	}
	return out
}

// errcodeCodes returns the values of the constants of type Code in ../errcode/errcode.go.
func errcodeCodes(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../errcode/errcode.go", nil, 0)
	if err != nil {
		t.Fatalf("parsing errcode: %v", err)
	}
	var codes []string
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				lit, ok := v.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("errcode: a Code constant is not a string literal: %T", v)
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				codes = append(codes, s)
			}
		}
	}
	if len(codes) < 20 {
		t.Fatalf("found only %d codes in errcode; has its source changed shape?", len(codes))
	}
	return codes
}

// TestSpecBoundsRefuseAbsurdInput drives kin-openapi's request validation (what the server's
// validation middleware runs) with requests that the bounds must refuse, and with ordinary
// ones that they must let through.
func TestSpecBoundsRefuseAbsurdInput(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	many := func(n int, s string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	jsonBody := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	streamQuery := func(args ...string) string {
		q := make([]string, 0, len(args))
		for _, a := range args {
			q = append(q, "command="+a)
		}
		return strings.Join(q, "&")
	}
	tests := []struct {
		name, method, target, contentType, body string
		ok                                      bool
	}{
		{"create from image", "POST", "/v1/sandboxes", "application/json",
			`{"id":"build-42","image":"host","resources":{"vcpus":2,"memory_mb":1024,"pids":512},"env":["CI=true"],"labels":{"team":"grading"},"start":true}`, true},
		{"create with no fields", "POST", "/v1/sandboxes", "application/json", `{}`, true},
		{"create with a path as id", "POST", "/v1/sandboxes", "application/json", `{"id":"../etc"}`, false},
		{"create with an upper-case id", "POST", "/v1/sandboxes", "application/json", `{"id":"Build"}`, false},
		{"create with a 64-character id", "POST", "/v1/sandboxes", "application/json", `{"id":"` + strings.Repeat("a", 64) + `"}`, false},
		{"create with an unknown field", "POST", "/v1/sandboxes", "application/json", `{"id":"a","privileged":true}`, false},
		{"create with too many env vars", "POST", "/v1/sandboxes", "application/json", jsonBody(map[string]any{"env": many(257, "A=b")}), false},
		{"create with an env var without a key", "POST", "/v1/sandboxes", "application/json", `{"env":["=x"]}`, false},
		{"create with too much memory", "POST", "/v1/sandboxes", "application/json", `{"resources":{"memory_mb":1048576}}`, false},
		{"create with zero vcpus", "POST", "/v1/sandboxes", "application/json", `{"resources":{"vcpus":0}}`, false},
		{"create with a long label value", "POST", "/v1/sandboxes", "application/json", `{"labels":{"a":"` + strings.Repeat("v", 64) + `"}}`, false},
		{"exec", "POST", "/v1/sandboxes/build-42/exec", "application/json", `{"command":["sh","-c","echo hi"],"timeout_ms":1000,"wait_ms":10}`, true},
		{"exec without a command", "POST", "/v1/sandboxes/build-42/exec", "application/json", `{"command":[]}`, false},
		{"exec with too many arguments", "POST", "/v1/sandboxes/build-42/exec", "application/json", jsonBody(map[string]any{"command": many(1025, "x")}), false},
		{"exec with a zero deadline", "POST", "/v1/sandboxes/build-42/exec", "application/json", `{"command":["true"],"timeout_ms":0}`, false},
		{"exec with an endless deadline", "POST", "/v1/sandboxes/build-42/exec", "application/json", `{"command":["true"],"wait_ms":3600001}`, false},
		{"exec with a relative cwd", "POST", "/v1/sandboxes/build-42/exec", "application/json", `{"command":["true"],"cwd":"tmp"}`, false},
		{"exec with a NUL in an argument", "POST", "/v1/sandboxes/build-42/exec", "application/json", `{"command":["a\u0000b"]}`, false},
		{"exec in a sandbox named by a path", "POST", "/v1/sandboxes/..%2Fx/exec", "application/json", `{"command":["true"]}`, false},
		{"list", "GET", "/v1/sandboxes?state=running&label=team=grading&label=job=42&limit=10", "", "", true},
		{"list with a zero limit", "GET", "/v1/sandboxes?limit=0", "", "", false},
		{"list with an unknown state", "GET", "/v1/sandboxes?state=exploded", "", "", false},
		{"list with a malformed label", "GET", "/v1/sandboxes?label=Team", "", "", false},
		{"stop with a negative timeout", "POST", "/v1/sandboxes/build-42/stop?timeout=-1&force=true", "", "", false},
		{"stop", "POST", "/v1/sandboxes/build-42/stop?timeout=5000&force=true", "", "", true},
		{"exec stream", "GET", "/v1/sandboxes/build-42/exec/stream?" + streamQuery("sh", "-i") + "&tty=true&rows=40&cols=120&env=TERM=xterm", "", "", true},
		{"exec stream without a command", "GET", "/v1/sandboxes/build-42/exec/stream?tty=true", "", "", false},
		{"exec stream with zero rows", "GET", "/v1/sandboxes/build-42/exec/stream?" + streamQuery("sh") + "&rows=0", "", "", false},
		{"write a file", "PUT", "/v1/sandboxes/build-42/files?path=/home/user/a.txt", "application/octet-stream", "hello", true},
		{"read a relative path", "GET", "/v1/sandboxes/build-42/files?path=etc/passwd", "", "", false},
		{"read a very long path", "GET", "/v1/sandboxes/build-42/files?path=/" + strings.Repeat("a", 4096), "", "", false},
		{"capture", "POST", "/v1/templates/python-base/generations", "application/json", `{"sandbox":"build-42"}`, true},
		{"capture without a sandbox", "POST", "/v1/templates/python-base/generations", "application/json", `{}`, false},
		{"retire with drain", "DELETE", "/v1/templates/python-base/generations/g000003?drain=true", "", "", true},
		{"generation id with a slash", "GET", "/v1/templates/python-base/generations/g%2F1", "", "", false},
		{"logs with a huge tail", "GET", "/v1/sandboxes/build-42/logs?tail=100001", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			if strings.Contains(tc.target, "/exec/stream") {
				// What every websocket client sends.
				req.Header.Set("Upgrade", "websocket")
				req.Header.Set("Connection", "Upgrade")
				req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
				req.Header.Set("Sec-WebSocket-Version", "13")
			}
			err := validateRequest(router, req)
			switch {
			case tc.ok && err != nil:
				t.Fatalf("refused an ordinary request: %v", err)
			case !tc.ok && err == nil:
				t.Fatalf("accepted an absurd request")
			case err != nil:
				t.Logf("refused as it should be: %v", err)
			}
		})
	}
}

func validateRequest(router routers.Router, req *http.Request) error {
	route, pathParams, err := router.FindRoute(req)
	if err != nil {
		return fmt.Errorf("no route: %w", err)
	}
	return openapi3filter.ValidateRequest(req.Context(), &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: pathParams,
		Route:      route,
		Options:    &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
	})
}

// TestExitCodesAreTheShells: the contract gives a signal's death one meaning, the shells'
// 128+n with the signal named, as the agent reports it; every example that names a signal
// carries that code.
func TestExitCodesAreTheShells(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	number := map[string]int{"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGKILL": 9, "SIGTERM": 15}
	exec := doc.Paths.Find("/v1/sandboxes/{id}/exec").Post.Responses.Status(200).Value.Content.Get("application/json")
	if len(exec.Examples) == 0 {
		t.Fatal("the exec result has no examples")
	}
	for name, ex := range exec.Examples {
		v, ok := ex.Value.Value.(map[string]any)
		if !ok {
			t.Fatalf("example %s is not an object", name)
		}
		sig, signaled := v["signal"].(string)
		code, _ := v["exit_code"].(float64)
		if signaled && int(code) != 128+number[sig] {
			t.Errorf("example %s: exit_code %v with signal %s, want %d", name, v["exit_code"], sig, 128+number[sig])
		}
		if !signaled && code < 0 {
			t.Errorf("example %s: exit_code %v", name, code)
		}
	}
	desc := doc.Components.Schemas["ExecResult"].Value.Properties["exit_code"].Value.Description
	if !strings.Contains(desc, "128") || strings.Contains(desc, "-1") {
		t.Errorf("ExecResult.exit_code says %q; it must describe 128+n", desc)
	}
}
