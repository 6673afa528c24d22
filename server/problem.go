package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/bothy/bothy/errcode"
)

// wakeRetryAfter is the Retry-After, in seconds, of a sandbox-waking answer.
const wakeRetryAfter = "2"

// nodeRetryAfter is the Retry-After, in seconds, of a cluster node's refusal of a create
// (node-full, node-draining): about the time its sandboxes' lifetimes or a router's placement
// elsewhere take to change the answer.
const nodeRetryAfter = "5"

// problem is the application/problem+json body (RFC 9457) with bothyd's extensions.
type problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Code      string `json:"code"`
	Field     string `json:"field,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// statusOf is the one table from error codes to HTTP statuses.
var statusOf = map[errcode.Code]int{
	errcode.InvalidRequest:   http.StatusBadRequest,
	errcode.Unauthorized:     http.StatusUnauthorized,
	errcode.Forbidden:        http.StatusForbidden,
	errcode.NotFound:         http.StatusNotFound,
	errcode.MethodNotAllowed: http.StatusMethodNotAllowed,
	errcode.PayloadTooLarge:  http.StatusRequestEntityTooLarge,
	errcode.NotImplemented:   http.StatusNotImplemented,
	errcode.Internal:         http.StatusInternalServerError,
	errcode.Unavailable:      http.StatusServiceUnavailable,
	// A full state root is 507 (RFC 4918's Insufficient Storage); a read-only or failing one
	// is 503, since the server cannot serve writes until an operator acts.
	errcode.StorageFull:        http.StatusInsufficientStorage,
	errcode.StorageUnavailable: http.StatusServiceUnavailable,
	// A template registry that cannot be reached, or serves what its checks refuse, is a
	// dependency that fails: the same request may succeed once it is back or repaired.
	errcode.RegistryUnavailable: http.StatusServiceUnavailable,
	errcode.RegistryRefused:     http.StatusServiceUnavailable,

	errcode.SandboxNotFound:    http.StatusNotFound,
	errcode.TemplateNotFound:   http.StatusNotFound,
	errcode.GenerationNotFound: http.StatusNotFound,
	errcode.FileNotFound:       http.StatusNotFound,
	errcode.ImageNotFound:      http.StatusNotFound,

	errcode.AlreadyProvisioned: http.StatusConflict,
	errcode.ProvisionedAgain:   http.StatusConflict,
	errcode.AlreadyRunning:     http.StatusConflict,
	errcode.NotRunning:         http.StatusConflict,
	errcode.PidsLimit:          http.StatusConflict,
	errcode.SandboxLaunched:    http.StatusConflict,
	errcode.ForeignFiles:       http.StatusConflict,
	errcode.RuntimeMismatch:    http.StatusConflict,
	errcode.TemplateExists:     http.StatusConflict,
	errcode.TemplateTombstoned: http.StatusConflict,
	errcode.TemplateIneligible: http.StatusConflict,
	errcode.SandboxPaused:      http.StatusConflict,

	errcode.SandboxBusy:          http.StatusLocked,
	errcode.TransitionInProgress: http.StatusLocked,
	errcode.SandboxLeased:        http.StatusLocked,
	errcode.GenerationLeased:     http.StatusLocked,
	errcode.ImageInUse:           http.StatusLocked,
	errcode.VolumeInUse:          http.StatusLocked,
	errcode.VolumeNotFound:       http.StatusNotFound,
	errcode.VolumeExists:         http.StatusConflict,
	errcode.VolumeFull:           http.StatusInsufficientStorage,

	errcode.WaitTimeout: http.StatusRequestTimeout,

	errcode.StopTimeout:  http.StatusGatewayTimeout,
	errcode.StartTimeout: http.StatusGatewayTimeout,

	errcode.PortUnreachable:        http.StatusBadGateway,
	errcode.LimitReached:           http.StatusTooManyRequests,
	errcode.LinkNotFound:           http.StatusNotFound,
	errcode.WebhookNotFound:        http.StatusNotFound,
	errcode.IdempotencyKeyReused:   http.StatusUnprocessableEntity,
	errcode.IdempotencyKeyInFlight: http.StatusConflict,
	errcode.SandboxWaking:          http.StatusServiceUnavailable,
	errcode.NodeFull:               http.StatusServiceUnavailable,
	errcode.NodeDraining:           http.StatusServiceUnavailable,
	errcode.NodeNotFound:           http.StatusNotFound,
	errcode.NotACluster:            http.StatusNotImplemented,

	// The sandbox's files refused a request the contract takes (errcode's block of them):
	// never 400, which says the request itself is wrong. What the user may not do is 403;
	// a path whose files are in the way is 409, as a state of the sandbox that may change;
	// a name the sandbox's file system cannot hold is 422.
	errcode.PermissionDenied:      http.StatusForbidden,
	errcode.NotADirectory:         http.StatusConflict,
	errcode.IsADirectory:          http.StatusConflict,
	errcode.NotARegularFile:       http.StatusConflict,
	errcode.DirectoryNotEmpty:     http.StatusConflict,
	errcode.FileExists:            http.StatusConflict,
	errcode.SymlinkLoop:           http.StatusConflict,
	errcode.MountInside:           http.StatusConflict,
	errcode.FileChanged:           http.StatusConflict,
	errcode.NameTooLong:           http.StatusUnprocessableEntity,
	errcode.CheckpointNotFound:    http.StatusNotFound,
	errcode.CheckpointExists:      http.StatusConflict,
	errcode.CheckpointLimit:       http.StatusConflict,
	errcode.CheckpointUnsupported: http.StatusNotImplemented,
	errcode.SecretNotFound:        http.StatusNotFound,
	errcode.SecretExists:          http.StatusConflict,
	errcode.WebhookExists:         http.StatusConflict,
	errcode.SecretInUse:           http.StatusConflict,
}

// classify turns any error into the *errcode.Error that the client will see. Errors without a
// code become a bare internal error: their text may name host paths or internals.
func classify(err error) *errcode.Error {
	var coded *errcode.Error
	if errors.As(err, &coded) {
		if _, known := statusOf[coded.Code]; known {
			return coded
		}
	}
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return errcode.New(errcode.PayloadTooLarge,
			"The request body is larger than the %d bytes this operation accepts; send less.", tooLarge.Limit)
	}
	return errcode.New(errcode.Internal,
		"The server failed to handle the request; retry, and report the request id if it persists.")
}

// writeProblem is the single place where an error becomes an HTTP response.
func (s *Server) writeProblem(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client went away: nobody reads the answer and nothing failed on our side.
		s.log.Debug("request cancelled by the client", "request_id", requestIDOf(r), "err", err)
		return
	}
	if s.classifyError != nil {
		err = s.classifyError(err)
	}
	e := classify(err)
	status := statusOf[e.Code]
	if s.onProblem != nil {
		s.onProblem(e.Code, status)
	}
	if status >= 500 {
		s.log.Error("request failed", "request_id", requestIDOf(r), "code", e.Code, "err", err)
	}
	if e.Code == errcode.Unauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="bothyd"`)
	}
	if e.Code == errcode.SandboxWaking {
		// A wake takes a moment: the request waited out its share, and the wake goes on.
		w.Header().Set("Retry-After", wakeRetryAfter)
	}
	if e.Code == errcode.NodeFull || e.Code == errcode.NodeDraining {
		w.Header().Set("Retry-After", nodeRetryAfter)
	}
	if abandonBody(r) {
		// Answer now and close, rather than wait for a body that may never come.
		w.Header().Set("Connection", "close")
	}
	writeProblemBody(w, status, problem{
		Type:      "urn:bothyd:problem:" + string(e.Code),
		Title:     http.StatusText(status),
		Status:    status,
		Detail:    e.Msg,
		Code:      string(e.Code),
		Field:     e.Field,
		RequestID: requestIDOf(r),
	})
}

func writeProblemBody(w http.ResponseWriter, status int, p problem) {
	body, err := json.Marshal(p)
	if err != nil {
		// A problem holds only strings and an int; this cannot fail, but never answer nothing.
		slog.Error("encoding a problem", "err", err)
		body = []byte(`{"type":"urn:bothyd:problem:internal","title":"Internal Server Error","status":500,"code":"internal"}`)
		status = http.StatusInternalServerError
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// ProblemOf is the status, code and detail that err answers, by the same mapping as a
// response's, for a body that carries several outcomes of their own (a fork's items).
func ProblemOf(err error) (status int, code errcode.Code, detail string) {
	e := classify(err)
	return statusOf[e.Code], e.Code, e.Msg
}
