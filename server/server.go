package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
)

// Defaults for Config's limits.
const (
	DefaultMaxJSONBytes = 1 << 20 // request bodies of the JSON operations
	DefaultMaxFileBytes = 8 << 30 // a file upload, streamed to the sandbox
	// DefaultBodyTimeout bounds the time from a request's headers to the end of its body, for
	// every body but a file upload's: 1 MiB in a minute is 17 KiB/s.
	DefaultBodyTimeout = time.Minute
	// DefaultBodyIdleTimeout bounds a pause in a file upload. An upload of up to 8 GiB takes
	// as long as the link needs; only a client that stops sending is cut off.
	DefaultBodyIdleTimeout = time.Minute
	// readHeaderTimeout bounds the time a client may take to send a request's headers,
	// authenticated or not.
	readHeaderTimeout = 10 * time.Second
	// shutdownGrace bounds how long a graceful shutdown waits for requests to finish.
	shutdownGrace = 30 * time.Second
)

// HandlerFunc is a route outside the strict interface. An error it returns before it has
// written anything becomes a problem response; after a websocket upgrade it must report
// failures itself, as close frames.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Config says what the server serves and how it guards it.
type Config struct {
	// Handlers implements the operations of the contract.
	Handlers openapi.StrictServerInterface
	// Token, when set, is required on every route but /healthz, /openapi.yaml and the
	// dashboard's static files.
	Token string
	// AllowedOrigins are extra browser origins (scheme://host:port) allowed to call the API.
	AllowedOrigins []string
	Logger         *slog.Logger
	MaxJSONBytes   int64
	MaxFileBytes   int64
	// BodyTimeout bounds the time a request body, but a file upload's, takes to arrive after
	// the headers; BodyIdleTimeout bounds a pause in a file upload. Zero: the defaults.
	BodyTimeout     time.Duration
	BodyIdleTimeout time.Duration
	// MaxConns and MaxConnsPerClient bound the listener's open connections (Serve); zero:
	// DefaultMaxConns and DefaultMaxConnsPerClient.
	MaxConns, MaxConnsPerClient int

	// Routes outside the strict interface; nil ones answer 501 not-implemented.
	ExecStream HandlerFunc
	Events     HandlerFunc
	Metrics    http.Handler
	Dashboard  http.Handler
	Ports      PortRoutes

	// Foreign, if set, serves every request that ForeignClaims claims, ahead of bothyd's
	// own routes and outside their authentication (it brings its own), but behind the same
	// guards: the Host and Origin checks, the body deadline, the per-client bounds, and an
	// error answer that does not wait for an unread body. It is E2B's API (package e2b,
	// docs/e2b.md), whose paths none of bothyd's routes use. ForeignUpload says which of its
	// requests are file uploads, whose bodies are bounded by pauses rather than in total;
	// ForeignStream which hold their connection as long as the client likes (streams,
	// watches), and count against the client's streams.
	Foreign       http.Handler
	ForeignClaims func(*http.Request) bool
	ForeignUpload func(*http.Request) bool
	ForeignStream func(*http.Request) bool

	// OnProblem, if set, is told of every problem response (for the errors-by-code metric).
	// It must not block.
	OnProblem func(code errcode.Code, status int)
	// ClassifyError, if set, may give an error its code before it is answered: the storage
	// and resource faults (storage-full, storage-unavailable, unavailable), which need the
	// state root to be told apart. It must not block.
	ClassifyError func(error) error
	// Idempotency, if set, keeps the answers of creates that carry an Idempotency-Key
	// (idempotent, package idempotency), on bothyd's routes and the foreign ones.
	Idempotency Idempotency
}

// Server is bothyd's HTTP handler together with the state it needs to shut down cleanly.
type Server struct {
	handler        http.Handler
	log            *slog.Logger
	token          string
	allowedOrigins []string
	validator      *validator
	onProblem      func(errcode.Code, int)
	classifyError  func(error) error
	// The foreign API's classifiers (see Config.Foreign); nil without one.
	foreignClaims, foreignUpload, foreignStream func(*http.Request) bool

	// streams counts the long-lived requests per client (boundStreams).
	streams               *counter
	maxConns, maxConnsPer int

	// now is the clock of login codes' expiry; tests replace it.
	now func() time.Time

	mu           sync.Mutex
	onShutdown   []func()
	loginCode    string // the outstanding one-time login code, or ""
	loginExpires time.Time
}

// New builds the server's handler.
func New(cfg Config) (*Server, error) {
	if cfg.Handlers == nil {
		return nil, errors.New("server: Config.Handlers is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxJSONBytes <= 0 {
		cfg.MaxJSONBytes = DefaultMaxJSONBytes
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.BodyIdleTimeout <= 0 {
		cfg.BodyIdleTimeout = DefaultBodyIdleTimeout
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConnsPerClient <= 0 {
		cfg.MaxConnsPerClient = DefaultMaxConnsPerClient
	}
	v, err := newValidator(openapi.Spec)
	if err != nil {
		return nil, err
	}
	s := &Server{
		log:            cfg.Logger,
		token:          cfg.Token,
		allowedOrigins: cfg.AllowedOrigins,
		validator:      v,
		onProblem:      cfg.OnProblem,
		classifyError:  cfg.ClassifyError,
		now:            time.Now,
		streams:        &counter{per: MaxStreamsPerClient, total: MaxStreams},
		maxConns:       cfg.MaxConns,
		maxConnsPer:    cfg.MaxConnsPerClient,
	}
	if cfg.Foreign != nil && cfg.ForeignClaims != nil {
		s.foreignClaims = cfg.ForeignClaims
		s.foreignUpload = cfg.ForeignUpload
		s.foreignStream = cfg.ForeignStream
		if s.foreignUpload == nil {
			s.foreignUpload = func(*http.Request) bool { return false }
		}
		if s.foreignStream == nil {
			s.foreignStream = func(*http.Request) bool { return false }
		}
	}
	s.handler = s.routes(cfg)
	return s, nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// OnShutdown registers f to run when a graceful shutdown begins: connections that the HTTP
// server no longer tracks (websockets, event streams) use it to drain.
func (s *Server) OnShutdown(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onShutdown = append(s.onShutdown, f)
}

// foreign hands the requests that claims claims to h, and the rest on.
func foreign(h http.Handler, claims func(*http.Request) bool) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if claims(r) {
				h.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// routes is the route table: the generated operations and, in one place, those outside the
// strict interface.
func (s *Server) routes(cfg Config) http.Handler {
	r := chi.NewRouter()
	// The body guard comes before anything that could answer, so that every answer to a
	// request whose body is unread closes the connection (writeProblem).
	r.Use(requestID, s.accessLog, s.recoverer)
	// Every route the listener serves, the foreign ones included, passes the body guard and
	// the browser checks (issue 37): a foreign API is no way around them.
	r.Use(s.guardBody(cfg.BodyTimeout, cfg.BodyIdleTimeout), s.checkBrowser)
	if s.foreignClaims != nil {
		r.Use(foreign(s.boundStreams(s.foreignStream)(s.answerWithoutBody(s.idempotent(cfg.Idempotency, cfg.MaxJSONBytes)(cfg.Foreign))), s.foreignClaims))
	}
	// The contract decides which methods a path takes, on every route it describes
	// (route.go); the route table below only dispatches.
	r.Use(s.matchContract)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		s.writeProblem(w, r, errcode.New(errcode.NotFound, "There is no route %s; see /openapi.yaml for the API.", r.URL.Path))
	})
	// For the routes outside the contract (the dashboard's assets); matchContract answers
	// the contract's own.
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		allowed := allowedMethods(r, req.URL.Path)
		// RFC 9110 §15.5.6: a 405 says which methods the resource does take.
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		s.writeProblem(w, req, errcode.New(errcode.MethodNotAllowed,
			"%s is not allowed on %s; use %s (see /openapi.yaml for the API).", req.Method, req.URL.Path, strings.Join(allowed, " or ")))
	})

	// Open routes: no token. Each serves GET alone, so that any other method is a 405.
	r.With(s.validate).Get("/openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(openapi.Spec)
	})
	if cfg.Dashboard != nil {
		r.With(s.validate).Get("/", cfg.Dashboard.ServeHTTP)
		// The API reference, rendered in the browser from /openapi.yaml; open like the spec.
		r.With(s.validate).Get("/docs", cfg.Dashboard.ServeHTTP)
		r.Get("/assets/*", cfg.Dashboard.ServeHTTP)
	}

	strict := openapi.NewStrictHandlerWithOptions(cfg.Handlers, nil, openapi.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  s.requestError,
		ResponseErrorHandlerFunc: s.writeProblem,
	})

	r.Group(func(r chi.Router) {
		// Authentication comes before anything that reads a body: a refused client is
		// answered at once, whatever it declared it would send.
		r.Use(s.authenticateExcept("/healthz", "/login"), s.limitBodies(cfg.MaxJSONBytes, cfg.MaxFileBytes), s.validate,
			s.idempotent(cfg.Idempotency, cfg.MaxJSONBytes))
		openapi.HandlerWithOptions(strict, openapi.ChiServerOptions{
			BaseRouter:       r,
			ErrorHandlerFunc: s.requestError,
		})
		// The dashboard's one-time login: open, since its code is the credential.
		r.Post("/login", s.handle(s.login))
		if cfg.Metrics != nil {
			r.Get("/metrics", cfg.Metrics.ServeHTTP)
		} else {
			r.Get("/metrics", s.handle(nil))
		}
	})
	// Browsers cannot set headers on a websocket or an EventSource, so these routes also take
	// ?access_token=.
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate(true), s.validate, s.boundStreams(nil))
		r.Get("/v1/sandboxes/{id}/exec/stream", s.handle(cfg.ExecStream))
		r.Get("/v1/events", s.handle(cfg.Events))
	})
	s.portRoutes(r, cfg)
	return r
}

// methods are those a route may be registered for, in the order an Allow header lists them.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// allowedMethods lists the methods that router serves on path. chi knows them when it
// answers 405 but hands them only to its own default handler, not to a custom one.
func allowedMethods(router *chi.Mux, path string) []string {
	var allowed []string
	for _, m := range methods {
		if router.Match(chi.NewRouteContext(), m, path) {
			allowed = append(allowed, m)
		}
	}
	return allowed
}

// handle adapts a HandlerFunc, answering 501 for a route not built yet.
func (s *Server) handle(h HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h == nil {
			s.writeProblem(w, r, errcode.New(errcode.NotImplemented, "%s is not implemented in this version of bothyd.", r.URL.Path))
			return
		}
		if err := h(w, r); err != nil {
			s.writeProblem(w, r, err)
		}
	}
}

// requestError maps the generated code's decoding errors (a malformed body, a parameter that
// does not parse) to invalid-request; http.MaxBytesError keeps its 413, and a body that did not
// arrive in time its own explanation.
func (s *Server) requestError(w http.ResponseWriter, r *http.Request, err error) {
	var tooLarge *http.MaxBytesError
	var coded *errcode.Error
	if errors.As(err, &tooLarge) || errors.As(err, &coded) {
		s.writeProblem(w, r, err)
		return
	}
	s.writeProblem(w, r, decodingProblem(err))
}

// decodingProblem explains an error of the generated code's decoding, which the validator let
// through: a JSON number that is a whole number but written with a fraction or an exponent
// (`1e3`) for an integer field, or a parameter it could not bind. Go's own messages name Go
// types and struct fields, which mean nothing to a client; these say what to send.
func decodingProblem(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	var paramErr *openapi.InvalidParamFormatError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field != "":
		want := "a " + typeErr.Type.Kind().String()
		switch typeErr.Type.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			want = "a whole number in decimal digits, without a fraction or an exponent"
		case reflect.String:
			want = "a string"
		case reflect.Bool:
			want = "true or false"
		}
		return &errcode.Error{Code: errcode.InvalidRequest, Field: typeErr.Field, Err: err,
			Msg: fmt.Sprintf("The request body field %q must be %s.", typeErr.Field, want)}
	case errors.As(err, &syntaxErr):
		return &errcode.Error{Code: errcode.InvalidRequest, Field: "body", Err: err,
			Msg: fmt.Sprintf("The request body is not valid JSON (at byte %d); send one JSON object.", syntaxErr.Offset)}
	case errors.As(err, &paramErr):
		return &errcode.Error{Code: errcode.InvalidRequest, Field: paramErr.ParamName, Err: err,
			Msg: fmt.Sprintf("The parameter %q is not of its type; see /openapi.yaml.", paramErr.ParamName)}
	default:
		return errcode.Wrap(errcode.InvalidRequest, err, "The request could not be decoded; check it against /openapi.yaml.")
	}
}

func (s *Server) authenticateExcept(open ...string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		guarded := s.authenticate(false)(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for _, p := range open {
				if r.URL.Path == p {
					next.ServeHTTP(w, r)
					return
				}
			}
			guarded.ServeHTTP(w, r)
		})
	}
}

// limitBodies gives file uploads their own, larger limit.
func (s *Server) limitBodies(jsonLimit, fileLimit int64) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		jsonLimited := s.limitBody(jsonLimit)(next)
		fileLimited := s.limitBody(fileLimit)(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if isFileUpload(r) {
				fileLimited.ServeHTTP(w, r)
				return
			}
			jsonLimited.ServeHTTP(w, r)
		})
	}
}

// CheckListener refuses to serve a non-loopback address without a token.
func CheckListener(ln net.Listener, token string) error {
	addr, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return nil // a unix socket is guarded by its file mode
	}
	if addr.IP.IsLoopback() || token != "" {
		return nil
	}
	return fmt.Errorf("refusing to listen on %s without an API token: give one with --token-file, or listen on 127.0.0.1", addr)
}

// Serve serves on ln until ctx is cancelled, then shuts down gracefully: it stops accepting,
// tells long-lived connections to drain, and waits for requests to finish.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler: s,
		// Headers are bounded here; bodies per request, by guardBody, since an upload may
		// take long but a pause in it may not. There is no ReadTimeout: it would cut
		// websockets and event streams, which live as long as their clients.
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	hs.RegisterOnShutdown(func() {
		s.mu.Lock()
		hooks := append([]func(){}, s.onShutdown...)
		s.mu.Unlock()
		for _, f := range hooks {
			f()
		}
	})
	done := make(chan error, 1)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		done <- hs.Shutdown(sctx)
	}()
	if err := hs.Serve(LimitListener(ln, s.maxConns, s.maxConnsPer)); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return <-done
}
