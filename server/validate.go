package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/sandboxd/sandboxd/errcode"
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
		route, pathParams, err := s.validator.router.FindRoute(r)
		if err != nil {
			// Not a route of the contract: the router answers 404 or 405 for it.
			next.ServeHTTP(w, r)
			return
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
				ExcludeRequestBody: !takesJSON(route.Operation),
			},
		}
		if err := openapi3filter.ValidateRequest(r.Context(), input); err != nil {
			s.writeProblem(w, r, requestProblem(err))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// takesJSON reports whether an operation's request body, if it has one, is JSON.
func takesJSON(op *openapi3.Operation) bool {
	if op == nil || op.RequestBody == nil || op.RequestBody.Value == nil {
		return true
	}
	return op.RequestBody.Value.Content.Get("application/json") != nil
}

// requestProblem explains a validation failure in terms of the request, never the schema.
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
	reason := reqErr.Reason
	var schemaErr *openapi3.SchemaError
	switch {
	case errors.As(reqErr.Err, &schemaErr):
		reason = schemaErr.Reason
	case strings.Contains(reason, "Content-Type"):
		reason = "this operation takes a JSON body; send it with 'Content-Type: application/json'"
	case reqErr.Err != nil && reason != "":
		reason += ": " + reqErr.Err.Error()
	case reqErr.Err != nil:
		reason = reqErr.Err.Error()
	}
	switch {
	case reqErr.Parameter != nil:
		p := reqErr.Parameter
		e := errcode.Invalid(p.Name, "The %s parameter %q is invalid: %s.", p.In, p.Name, strings.TrimSuffix(reason, "."))
		e.Err = err
		return e
	case reqErr.RequestBody != nil:
		field := "body"
		if schemaErr != nil {
			if ptr := schemaErr.JSONPointer(); len(ptr) > 0 {
				field = strings.Join(ptr, ".")
			}
		}
		e := errcode.Invalid(field, "The request body is invalid at %q: %s.", field, strings.TrimSuffix(reason, "."))
		e.Err = err
		return e
	default:
		return errcode.Wrap(errcode.InvalidRequest, err, "The request is invalid: %s.", strings.TrimSuffix(reason, "."))
	}
}
