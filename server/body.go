package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bothy/bothy/errcode"
)

const bodyKey ctxKey = iota + 1

// guardedBody is a request body read under a deadline, so that a client cannot hold a
// connection (and the goroutine that serves it) by declaring a body and not sending it.
//
// With idle zero the whole body must arrive before the deadline that guardBody set when the
// request began; with idle set (a file upload, up to 8 GiB, which may take long in total on
// a slow link) each read must make progress within idle instead.
//
// Once the body has been read to its end the deadline is lifted: net/http then starts a
// background read on the connection to notice a client that goes away, and a deadline that
// expired under it would cancel the request's context while its handler still works. After a
// failed read the deadline is left as it is, so that what remains of the body is never waited
// for again (net/http reads what a handler left unread before it answers).
type guardedBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	// limit is the time the whole body was given, for the error that says it did not come.
	limit time.Duration
	eof   atomic.Bool
}

func (b *guardedBody) Read(p []byte) (int, error) {
	if b.eof.Load() {
		return 0, io.EOF
	}
	if b.idle > 0 {
		_ = b.rc.SetReadDeadline(time.Now().Add(b.idle))
	}
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		b.eof.Store(true)
		_ = b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		if b.idle > 0 {
			err = errcode.Wrap(errcode.InvalidRequest, err, "The upload paused for longer than %s; send the body without long pauses.", b.idle)
		} else {
			err = errcode.Wrap(errcode.InvalidRequest, err, "The request body did not arrive within %s of its headers; send it whole and without pauses.", b.limit)
		}
	}
	return n, err
}

// abandonBody gives up on the rest of r's body, if r declared one that has not been read to
// its end, and reports whether it did. The response must then close the connection.
//
// net/http reads what a handler left of a small body (up to 256 KiB) before it answers, and
// again when it closes the body after the answer, to reuse the connection: an answer to a
// client that declared a body and never sends it, a refusal included, would wait for the body
// deadline, and its connection would stay open as long. An expired deadline ends those reads
// at once; the answer, a write, is not affected.
func abandonBody(r *http.Request) bool {
	b, ok := r.Context().Value(bodyKey).(*guardedBody)
	if !ok || b.eof.Load() {
		return false
	}
	_ = b.rc.SetReadDeadline(time.Now())
	return true
}

// isFileUpload reports whether r is one of the operations whose body is streamed, not
// decoded: a file upload, or an image archive's import.
func isFileUpload(r *http.Request) bool {
	return r.Method == http.MethodPut && (strings.HasSuffix(r.URL.Path, "/files") || strings.HasPrefix(r.URL.Path, "/v1/images/"))
}

// guardBody bounds how long a request's body may take to arrive (see [guardedBody]). Requests
// without a body, websockets and event streams among them, are left alone: after their
// headers, which http.Server.ReadHeaderTimeout bounds, nothing more is read from them by
// net/http.
func (s *Server) guardBody(total, idle time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Body == nil || r.Body == http.NoBody {
				next.ServeHTTP(w, r)
				return
			}
			b := &guardedBody{ReadCloser: r.Body, rc: http.NewResponseController(w), limit: total}
			if s.isUpload(r) {
				b.idle = idle
			} else {
				// A server without a connection to set deadlines on (a test's recorder) has
				// nothing to hold either.
				_ = b.rc.SetReadDeadline(time.Now().Add(total))
			}
			r = r.WithContext(context.WithValue(r.Context(), bodyKey, b))
			r.Body = b
			next.ServeHTTP(w, r)
		})
	}
}

// isForeign reports whether the foreign API (Config.Foreign) serves r.
func (s *Server) isForeign(r *http.Request) bool { return s.foreignClaims != nil && s.foreignClaims(r) }

// isUpload reports whether r's body is bounded by its pauses rather than in total: a file
// upload, a port proxy's request (its service's body, of any size), or the foreign API's
// uploads.
func (s *Server) isUpload(r *http.Request) bool {
	if s.isForeign(r) {
		return s.foreignUpload(r)
	}
	return isFileUpload(r) || isPortProxyRequest(r)
}
