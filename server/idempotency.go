package server

import (
	"bytes"
	"errors"
	"io"
	"net/http"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/idempotency"
)

// IdempotencyHeader is the request header that makes a create idempotent, and ReplayedHeader
// the answer's header that says an answer is a replay.
const (
	IdempotencyHeader = "Idempotency-Key"
	ReplayedHeader    = "Idempotent-Replayed"
)

// Idempotency is what the middleware needs of the store of answers ([idempotency.Store]).
type Idempotency interface {
	Begin(scope, key, request string) (*idempotency.Answer, error)
	Finish(scope, key string, a *idempotency.Answer) error
}

var _ Idempotency = (*idempotency.Store)(nil)

// isCreate reports whether r is a create whose answer an Idempotency-Key keeps: an operation
// of the contract that declares the header (its creates: a sandbox, a template, a capture, an
// image pull, a webhook, a port link; matchContract put it in r's context), or E2B's sandbox
// create, which is outside the contract. The contract is the one list, so a create added to
// it with the header is kept without a change here.
func isCreate(r *http.Request) bool {
	if cr := routeOf(r); cr != nil {
		return declaresIdempotencyKey(cr.route.Operation)
	}
	return r.Method == http.MethodPost && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes")
}

// declaresIdempotencyKey reports whether op takes the Idempotency-Key header.
func declaresIdempotencyKey(op *openapi3.Operation) bool {
	for _, p := range op.Parameters {
		if p.Value != nil && p.Value.In == openapi3.ParameterInHeader && http.CanonicalHeaderKey(p.Value.Name) == IdempotencyHeader {
			return true
		}
	}
	return false
}

// credentialOf is what identifies the client of r: its bearer token, E2B API key or
// access_token, or nothing on a server without a token. Only its hash is kept
// (idempotency.Scope).
func credentialOf(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		return "authorization\x00" + h
	}
	if k := r.Header.Get("X-API-Key"); k != "" {
		return "api-key\x00" + k
	}
	if t := r.URL.Query().Get("access_token"); t != "" {
		return "authorization\x00Bearer " + t
	}
	return ""
}

// idempotent replays the kept answer of a create that repeats an Idempotency-Key, refuses a
// repeat with another request (idempotency-key-reused, 422) or one whose first is still running
// (idempotency-key-in-flight, 409), and keeps the answer of a first request, durably, before
// it is sent (package idempotency). A request without the header, or not a create, passes.
func (s *Server) idempotent(store Idempotency, maxBody int64) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if store == nil {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get(IdempotencyHeader)
			if key == "" || !isCreate(r) {
				next.ServeHTTP(w, r)
				return
			}
			if !idempotency.ValidKey(key) {
				s.writeProblem(w, r, errcode.Invalid(IdempotencyHeader,
					"The Idempotency-Key must be 1 to %d printable ASCII characters; a UUID is usual.", idempotency.MaxKeyLength))
				return
			}
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
			if err != nil {
				var tooLarge *http.MaxBytesError
				if errors.As(err, &tooLarge) {
					s.writeProblem(w, r, err)
					return
				}
				s.writeProblem(w, r, errcode.Wrap(errcode.InvalidRequest, err, "The request body could not be read; send it again."))
				return
			}
			scope := idempotency.Scope(credentialOf(r))
			replay, err := store.Begin(scope, key, idempotency.RequestHash(r.Method, r.URL.RequestURI(), body))
			if err != nil {
				if errcode.Of(err) == errcode.IdempotencyKeyInFlight {
					w.Header().Set("Retry-After", "1")
				}
				s.writeProblem(w, r, err)
				return
			}
			if replay != nil {
				h := w.Header()
				if replay.ContentType != "" {
					h.Set("Content-Type", replay.ContentType)
				}
				if replay.Location != "" {
					h.Set("Location", replay.Location)
				}
				h.Set(ReplayedHeader, "true")
				w.WriteHeader(replay.Status)
				_, _ = w.Write(replay.Body) //nolint:gosec // this server's own earlier answer, replayed as it was sent
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			rec := &answerRecorder{ResponseWriter: w}
			finished := false
			defer func() {
				if !finished {
					// A panic in the handler: nothing is kept, and the key is free again.
					_ = store.Finish(scope, key, nil)
				}
			}()
			next.ServeHTTP(rec, r)
			finished = true
			if rec.passedThrough {
				_ = store.Finish(scope, key, nil)
				return
			}
			status := rec.status
			if status == 0 {
				status = http.StatusOK
			}
			a := &idempotency.Answer{Status: status, ContentType: rec.Header().Get("Content-Type"),
				Location: rec.Header().Get("Location"), Body: rec.buf.Bytes()}
			if err := store.Finish(scope, key, a); err != nil && status/100 == 2 {
				// The create happened; its answer is sent, but a repeat would run it again.
				s.log.Warn("an idempotent create's answer could not be kept", "path", r.URL.Path, "err", err)
			}
			rec.flushOut(status)
		})
	}
}

// answerRecorder holds a create's answer until it is kept, so that an answer the client sees
// is one a repeat gets again. An answer larger than idempotency.MaxAnswerBytes, or one that is
// flushed or hijacked, passes through from then on and is not kept.
type answerRecorder struct {
	http.ResponseWriter
	status        int
	buf           bytes.Buffer
	passedThrough bool
}

func (a *answerRecorder) WriteHeader(code int) {
	if a.passedThrough {
		a.ResponseWriter.WriteHeader(code)
		return
	}
	if a.status == 0 {
		a.status = code
	}
}

func (a *answerRecorder) Write(p []byte) (int, error) {
	if a.passedThrough {
		return a.ResponseWriter.Write(p)
	}
	if a.status == 0 {
		a.status = http.StatusOK
	}
	if a.buf.Len()+len(p) > idempotency.MaxAnswerBytes {
		a.passThrough()
		return a.ResponseWriter.Write(p)
	}
	return a.buf.Write(p)
}

// passThrough sends what is held and lets the rest through.
func (a *answerRecorder) passThrough() {
	if a.passedThrough {
		return
	}
	a.passedThrough = true
	status := a.status
	if status == 0 {
		status = http.StatusOK
	}
	a.ResponseWriter.WriteHeader(status)
	_, _ = a.ResponseWriter.Write(a.buf.Bytes()) //nolint:gosec // the handler's answer, sent as it wrote it
	a.buf.Reset()
}

func (a *answerRecorder) flushOut(status int) {
	a.ResponseWriter.WriteHeader(status)
	_, _ = a.ResponseWriter.Write(a.buf.Bytes()) //nolint:gosec // the handler's answer, sent as it wrote it
}

func (a *answerRecorder) Flush() {
	a.passThrough()
	_ = http.NewResponseController(a.ResponseWriter).Flush()
}

func (a *answerRecorder) Unwrap() http.ResponseWriter { return a.ResponseWriter }
