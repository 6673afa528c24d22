package server

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
)

type ctxKey int

const requestIDKey ctxKey = iota

// requestIDOf returns the request id that the requestID middleware attached, or "".
func requestIDOf(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey).(string)
	return id
}

// validRequestID reports whether a client-supplied X-Request-Id is safe to echo and log.
func validRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// requestID takes the client's X-Request-Id when it is well-formed, or makes one, and returns
// it in the response so that a client can quote it.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if !validRequestID(id) {
			id = naming.RandomHex(12)
		}
		w.Header().Set("X-Request-Id", id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey, id)))
	})
}

// statusRecorder remembers the status and size of a response for the access log. It keeps
// Flush, Hijack and Unwrap working, so that streaming responses and websockets pass through.
type statusRecorder struct {
	http.ResponseWriter
	status   int
	bytes    int64
	hijacked bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(p)
	s.bytes += int64(n)
	return n, err
}

func (s *statusRecorder) Flush() {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	_ = http.NewResponseController(s.ResponseWriter).Flush()
}

func (s *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil {
		// A body deadline (guardBody) must not outlive the upgrade: a websocket paces its
		// reads itself.
		_ = conn.SetReadDeadline(time.Time{})
		s.hijacked = true
		if s.status == 0 {
			s.status = http.StatusSwitchingProtocols
		}
	}
	return conn, rw, err
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// accessLog logs one line per request, after it ends. The query is logged with the values of
// its secrets removed (see [redactedQuery]): tokens and sandbox environments never reach a
// log.
func (s *Server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		status := rec.status
		if status == 0 {
			status = http.StatusOK
		}
		s.log.Info("http",
			"method", r.Method,
			"path", r.URL.Path,
			"query", redactedQuery(r.URL),
			"status", status,
			"bytes", rec.bytes,
			"duration_ms", float64(time.Since(start).Microseconds())/1000,
			"request_id", requestIDOf(r),
			"remote", r.RemoteAddr,
		)
	})
}

// redactedQuery is the query with the value of every access_token replaced, and of every env
// entry (K=V, the exec websocket's environment, where callers pass API keys) the value after
// the name: the name is kept, since it helps to read the log and is not the secret.
func redactedQuery(u *url.URL) string {
	if u.RawQuery == "" {
		return ""
	}
	q := u.Query()
	for i := range q["access_token"] {
		q["access_token"][i] = "REDACTED"
	}
	for i, kv := range q["env"] {
		name, _, _ := strings.Cut(kv, "=")
		q["env"][i] = name + "=REDACTED"
	}
	return q.Encode()
}

// recoverer turns a panic in a handler into a 500 problem with no internals, and logs the
// stack. http.ErrAbortHandler keeps its meaning: abort the response silently.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("handler panicked", "request_id", requestIDOf(r), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if rec, ok := w.(*statusRecorder); ok && (rec.status != 0 || rec.hijacked) {
				// The response has begun: all we can do is cut it short.
				panic(http.ErrAbortHandler)
			}
			s.writeProblem(w, r, errors.New("panic"))
		}()
		next.ServeHTTP(w, r)
	})
}

// checkBrowser keeps web pages of other origins out (see the package doc).
func (s *Server) checkBrowser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.token == "" && !isLoopbackHost(r.Host) {
			s.writeProblem(w, r, errcode.New(errcode.Forbidden,
				"This server has no token and answers only requests addressed to a loopback host; use 127.0.0.1 or localhost, or configure a token."))
			return
		}
		// A port proxy's requests are its service's: its pages run in an opaque origin
		// (their answers are sandboxed), so their own requests carry Origin: null. A
		// foreign API's requests are never a port proxy's, whatever their path.
		if origin := r.Header.Get("Origin"); origin != "" && !(isPortProxyRequest(r) && !s.isForeign(r)) && !s.originAllowed(origin, r.Host) {
			s.writeProblem(w, r, errcode.New(errcode.Forbidden,
				"Requests from the origin %q are not allowed; open the dashboard from this server, or allow the origin with --allowed-origin.", origin))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) originAllowed(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, host) {
		return true
	}
	for _, allowed := range s.allowedOrigins {
		if strings.EqualFold(strings.TrimSuffix(allowed, "/"), origin) {
			return true
		}
	}
	return false
}

// isLoopbackHost reports whether a Host header (host or host:port) names this machine's
// loopback interface.
func isLoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// authenticate requires the bearer token on every route that needs one. Websocket routes
// (which browsers cannot give headers) also accept it as the access_token query parameter.
func (s *Server) authenticate(queryTokenOK bool) func(http.Handler) http.Handler {
	return s.authenticateSaying(queryTokenOK, "This server needs its API token: send it as 'Authorization: Bearer <token>'.")
}

// authenticateSaying is authenticate with its own refusal.
func (s *Server) authenticateSaying(queryTokenOK bool, refusal string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if s.token == "" {
			return next
		}
		want := []byte(s.token)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got := ""
			if h := r.Header.Get("Authorization"); len(h) > len("Bearer ") && strings.EqualFold(h[:len("Bearer ")], "Bearer ") {
				got = h[len("Bearer "):]
			} else if queryTokenOK {
				got = r.URL.Query().Get("access_token")
			}
			if got == "" || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
				s.writeProblem(w, r, errcode.New(errcode.Unauthorized, "%s", refusal))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// limitBody bounds a request body. A declared length over the limit is refused before any of
// the body is read; an undeclared one is cut at the limit by http.MaxBytesReader, whose error
// the problem mapper turns into 413.
func (s *Server) limitBody(limit int64) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ContentLength > limit {
				s.writeProblem(w, r, errcode.New(errcode.PayloadTooLarge,
					"The request body is larger than the %d bytes this operation accepts; send less.", limit))
				return
			}
			if r.Body != nil && r.Body != http.NoBody {
				r.Body = http.MaxBytesReader(w, r.Body, limit)
			}
			next.ServeHTTP(w, r)
		})
	}
}
