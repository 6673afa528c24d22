package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/bothy/bothy/errcode"
)

// validator checks each request against the contract before any handler runs, so that the
// bounds the spec declares (lengths, patterns, ranges, unknown fields) are enforced in one
// place and reported as invalid-request with the field at fault. The generated strict server
// only decodes; it does not validate.
type validator struct {
	router routers.Router
}

func newValidator(spec []byte) (*validator, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(spec)
	if err != nil {
		return nil, fmt.Errorf("loading the OpenAPI spec: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("the OpenAPI spec is invalid: %w", err)
	}
	// Match requests on any host and port: the servers list documents defaults only.
	doc.Servers = nil
	// The auth middleware checks tokens. kin-openapi's security check would read every
	// request body whole (io.ReadAll, for auth callbacks that inspect it), file uploads
	// included: this copy of the spec has no security requirements.
	doc.Security = nil
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			op.Security = nil
		}
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("routing the OpenAPI spec: %w", err)
	}
	return &validator{router: router}, nil
}

func (s *Server) validate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cr := routeOf(r)
		if cr == nil {
			// Not a route of the contract (matchContract answered 405 for a method it
			// does not list): the route table answers it, 404 or the dashboard's assets.
			next.ServeHTTP(w, r)
			return
		}
		route, pathParams := cr.route, cr.params
		_, proxied := route.Operation.Extensions["x-proxy"]
		// A proxied request's query is the sandboxed service's, whatever it takes; its path
		// parameters (the sandbox, the port, the link's token) are the contract's.
		if !proxied {
			// A query that does not decode (a bad %-escape, a ';') would lose its pairs
			// silently in r.URL.Query(): `?state=%zz` would list every sandbox.
			if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
				s.writeProblem(w, r, errcode.Wrap(errcode.InvalidRequest, err,
					"The query string could not be read (%s); percent-encode its names and values, and separate the pairs with '&'.", queryFault(err)))
				return
			}
		}
		if name := unknownQuery(r, route); name != "" && !proxied {
			s.writeProblem(w, r, errcode.Invalid(name,
				"The query parameter %q is not one this operation takes; remove it (see /openapi.yaml for the parameters of %s %s).",
				truncateName(name), r.Method, route.Path))
			return
		}
		// A proxied body is the service's and is streamed to it, never read here.
		jsonBody := takesJSON(route.Operation) && !proxied
		var body []byte
		if jsonBody && r.Body != nil && r.Body != http.NoBody {
			var err error
			if body, err = wholeJSONBody(r); err != nil {
				s.writeProblem(w, r, err)
				return
			}
		}
		input := &openapi3filter.RequestValidationInput{
			Request:    r,
			PathParams: pathParams,
			Route:      route,
			Options: &openapi3filter.Options{
				AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
				// Handlers apply the defaults; written into the request here, numbers would
				// come out in float notation ("3.6e+06") that no parameter parser accepts.
				SkipSettingDefaults: true,
				// Raw bodies (file uploads) are streamed to the sandbox; reading them here
				// would hold them in memory. The operation decides, not the client's
				// Content-Type, so that no client can skip validation by mislabelling.
				ExcludeRequestBody: !jsonBody,
			},
		}
		if err := openapi3filter.ValidateRequest(r.Context(), input); err != nil {
			s.writeProblem(w, r, requestProblem(err))
			return
		}
		if err := extensionRules(r, route, body); err != nil {
			s.writeProblem(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// unknownQuery returns a query parameter of r that its operation does not declare (the first
// in sorted order, so that the answer does not vary), or "". Unknown body fields are refused by
// the schemas' additionalProperties; without this, an unknown or misspelt parameter
// (`?forse=true`) would be ignored silently, and the caller would believe it took effect.
func unknownQuery(r *http.Request, route *routers.Route) string {
	if r.URL.RawQuery == "" {
		return ""
	}
	declared := map[string]bool{}
	for _, params := range []openapi3.Parameters{route.PathItem.Parameters, route.Operation.Parameters} {
		for _, p := range params {
			if p.Value != nil && p.Value.In == openapi3.ParameterInQuery {
				declared[p.Value.Name] = true
			}
		}
	}
	var unknown []string
	for name := range r.URL.Query() {
		if !declared[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return ""
	}
	slices.Sort(unknown)
	return unknown[0]
}

// fieldName writes a JSON pointer to a body field as the server's own refusals name fields:
// objects' keys joined by dots, array indexes in brackets (network.allow[1]).
func fieldName(ptr []string) string {
	var b strings.Builder
	for _, seg := range ptr {
		if _, err := strconv.Atoi(seg); err == nil && b.Len() > 0 {
			b.WriteString("[" + seg + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(seg)
	}
	return b.String()
}

// queryFault says what is wrong with a query string, without quoting it (it may hold a
// secret, such as an access token).
func queryFault(err error) string {
	if strings.Contains(err.Error(), "semicolon") {
		return "it holds a ';'"
	}
	return "it holds a '%' that is not followed by two hexadecimal digits"
}

// truncateName bounds a client-chosen name quoted back in a message.
func truncateName(name string) string {
	const max = 64
	if len(name) <= max {
		return name
	}
	return name[:max] + "..."
}

// wholeJSONBody reads r's body (already bounded by limitBody and guardBody) and refuses
// anything after its first JSON value but white space: `{"id":"a"} {"start":true}` would
// otherwise be taken for its first half by both the validator and the generated decoder,
// which stop at the end of one value. The body is put back for them to read.
func wholeJSONBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var tooLarge *http.MaxBytesError
		var coded *errcode.Error
		if errors.As(err, &tooLarge) || errors.As(err, &coded) {
			return nil, err
		}
		// A malformed chunked encoding or a body cut short: the client's fault, not ours.
		return nil, errcode.Wrap(errcode.InvalidRequest, err, "The request body could not be read (%v); send it again, whole.", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	dec := json.NewDecoder(bytes.NewReader(body))
	var first json.RawMessage
	if err := dec.Decode(&first); err != nil {
		// Malformed or empty: the validator says so in its own terms.
		return body, nil
	}
	if rest := bytes.TrimSpace(body[dec.InputOffset():]); len(rest) > 0 {
		return nil, errcode.Invalid("body",
			"The request body holds more than one JSON value (%d bytes follow the first); send exactly one JSON object.", len(rest))
	}
	return body, nil
}

// takesJSON reports whether an operation's request body, if it has one, is JSON.
func takesJSON(op *openapi3.Operation) bool {
	if op == nil || op.RequestBody == nil || op.RequestBody.Value == nil {
		return true
	}
	return op.RequestBody.Value.Content.Get("application/json") != nil
}

// requestProblem explains a validation failure in terms of the request, never the schema:
// each detail is a sentence that names the field or parameter at fault and says what it must
// be, without quoting the value (which may be a secret, such as an environment variable).
func requestProblem(err error) error {
	var tooLarge *http.MaxBytesError
	var coded *errcode.Error
	if errors.As(err, &tooLarge) || errors.As(err, &coded) {
		// The body's own failure (too large, too slow) says more than the schema would.
		return err
	}
	var reqErr *openapi3filter.RequestError
	if !errors.As(err, &reqErr) {
		return errcode.Wrap(errcode.InvalidRequest, err, "The request does not match the API contract; see /openapi.yaml.")
	}
	switch {
	case reqErr.Parameter != nil:
		p := reqErr.Parameter
		e := errcode.Invalid(p.Name, "The %s parameter %q %s.", p.In, p.Name, parameterReason(reqErr))
		e.Err = err
		return e
	case reqErr.RequestBody != nil:
		field, reason := bodyReason(reqErr)
		if prefix, ok := reqErr.RequestBody.Extensions["x-field-prefix"].(string); ok && field != "body" {
			// The body is a part of a larger request elsewhere (a sandbox's network policy):
			// its fields are named as they are there.
			field = prefix + "." + field
		}
		var e *errcode.Error
		if field == "body" {
			e = errcode.Invalid(field, "The request body %s.", reason)
		} else {
			e = errcode.Invalid(field, "The request body field %q %s.", field, reason)
		}
		e.Err = err
		return e
	default:
		reason := reqErr.Reason
		if reqErr.Err != nil && reason == "" {
			reason = reqErr.Err.Error()
		}
		return errcode.Wrap(errcode.InvalidRequest, err, "The request is invalid: %s.", strings.TrimSuffix(reason, "."))
	}
}

// parameterReason says what is wrong with a parameter, as the end of a sentence that begins
// with its name.
func parameterReason(reqErr *openapi3filter.RequestError) string {
	var schemaErr *openapi3.SchemaError
	var parseErr *openapi3filter.ParseError
	switch {
	case errors.Is(reqErr.Err, openapi3filter.ErrInvalidRequired):
		return "is required; add it"
	case errors.Is(reqErr.Err, openapi3filter.ErrInvalidEmptyValue):
		return "is empty; give it a value, or leave it out"
	case errors.As(reqErr.Err, &schemaErr):
		return schemaReason(schemaErr)
	case errors.As(reqErr.Err, &parseErr):
		if reqErr.Parameter.Schema != nil && reqErr.Parameter.Schema.Value != nil {
			return "is not " + typeName(reqErr.Parameter.Schema.Value)
		}
		return "could not be read; see /openapi.yaml for its form"
	default:
		return "is not valid; see /openapi.yaml for its form"
	}
}

// bodyReason names the body field at fault (dotted, "body" for the body itself) and says
// what is wrong with it.
func bodyReason(reqErr *openapi3filter.RequestError) (field, reason string) {
	var schemaErr *openapi3.SchemaError
	switch {
	case errors.Is(reqErr.Err, openapi3filter.ErrInvalidRequired):
		return "body", "is required; send a JSON object (see /openapi.yaml)"
	case strings.Contains(reqErr.Reason, "Content-Type"):
		return "body", "must be JSON; send it with 'Content-Type: application/json'"
	case errors.As(reqErr.Err, &schemaErr):
		field = "body"
		if ptr := schemaErr.JSONPointer(); len(ptr) > 0 {
			field = fieldName(ptr)
		}
		if schemaErr.SchemaField == "not" && schemaErr.Schema != nil {
			// A rule between fields (a generation needs its template): the schema names
			// the field it is about and the rule, for the refusal to say.
			name, _ := schemaErr.Schema.Extensions["x-not-field"].(string)
			rule, _ := schemaErr.Schema.Extensions["x-not-rule"].(string)
			if name != "" && rule != "" {
				if field == "body" {
					field = name
				} else {
					field += "." + name
				}
				return field, "must be " + strings.TrimSuffix(rule, ".")
			}
		}
		if schemaErr.SchemaField == "properties" && strings.HasSuffix(schemaErr.Reason, " is unsupported") {
			// The field at fault is the unknown one, not the object that holds it.
			if name, ok := quoted(schemaErr.Reason); ok {
				if field == "body" {
					field = name
				} else {
					field += "." + name
				}
				return field, "is not a field of this request; remove it (see /openapi.yaml)"
			}
		}
		return field, schemaReason(schemaErr)
	default:
		return "body", "is not valid JSON; send one JSON object (see /openapi.yaml)"
	}
}

// schemaReason says what a value must be to satisfy the schema that refused it, as the end
// of a sentence that begins with the value's name. A failed allOf (the form a documented
// field takes when it refers to a shared schema) is explained by the schema within it.
func schemaReason(se *openapi3.SchemaError) string {
	for se.SchemaField == "allOf" || se.SchemaField == "anyOf" || se.SchemaField == "oneOf" {
		var inner *openapi3.SchemaError
		if se.Origin == nil || !errors.As(se.Origin, &inner) || inner == se {
			break
		}
		se = inner
	}
	sch := se.Schema
	if sch == nil {
		return "is not valid: " + strings.TrimSuffix(se.Reason, ".")
	}
	switch se.SchemaField {
	case "pattern", "minLength", "maxLength", "format", "not":
		if rule, ok := sch.Extensions["x-rule"].(string); ok {
			return "is not valid: it must be " + strings.TrimSuffix(rule, ".")
		}
	case "minItems":
		return fmt.Sprintf("must hold at least %d items", sch.MinItems)
	case "maxItems":
		if sch.MaxItems != nil {
			return fmt.Sprintf("must hold at most %d items", *sch.MaxItems)
		}
	case "maxProperties":
		if sch.MaxProps != nil {
			return fmt.Sprintf("must hold at most %d entries", *sch.MaxProps)
		}
	case "minimum":
		if sch.Min != nil {
			return "must be at least " + number(*sch.Min)
		}
	case "maximum":
		if sch.Max != nil {
			return "must be at most " + number(*sch.Max)
		}
	case "type":
		if se.Origin != nil {
			// A number too large for any float: kin-openapi's json.Number conversion.
			return "is not " + typeName(sch) + " within its bounds (see /openapi.yaml)"
		}
		return "must be " + typeName(sch)
	case "nullable":
		return "must not be null; leave the field out instead"
	case "required":
		// The pointer already ends at the missing field.
		return "is required; add it"
	case "enum":
		return "must be one of " + enumList(sch.Enum)
	}
	return "is not valid: " + strings.TrimSuffix(se.Reason, ".")
}

// typeName is the kind of value a schema takes, with its article, for a message.
func typeName(sch *openapi3.Schema) string {
	switch {
	case sch.Type.Is(openapi3.TypeInteger):
		return "a whole number in decimal digits"
	case sch.Type.Is(openapi3.TypeNumber):
		return "a number"
	case sch.Type.Is(openapi3.TypeBoolean):
		return "true or false"
	case sch.Type.Is(openapi3.TypeString):
		return "a string"
	case sch.Type.Is(openapi3.TypeArray):
		return "an array"
	case sch.Type.Is(openapi3.TypeObject):
		return "a JSON object"
	default:
		return "of the type the contract gives it (see /openapi.yaml)"
	}
}

// number writes a bound as people write it: 3600000, not 3.6e+06.
func number(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func enumList(values []any) string {
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ", ")
}

// quoted returns the first double-quoted string in s (kin-openapi's reasons quote the
// property they are about).
func quoted(s string) (string, bool) {
	i := strings.IndexByte(s, '"')
	if i < 0 {
		return "", false
	}
	name, err := strconv.QuotedPrefix(s[i:])
	if err != nil {
		return "", false
	}
	name, err = strconv.Unquote(name)
	return name, err == nil
}
