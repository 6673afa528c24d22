package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/bothy/bothy/supervisor"
	"github.com/bothy/bothy/usage"
	"github.com/bothy/bothy/volume"
)

// Supervisor is what this package needs of the supervisor ([supervisor.Supervisor]).
type Supervisor interface {
	Create(ctx context.Context, req supervisor.CreateRequest) (*supervisor.Status, error)
	Status(id string) (*supervisor.Status, error)
	List() ([]*supervisor.Status, error)
	Start(ctx context.Context, id string) (*supervisor.Status, error)
	Delete(ctx context.Context, id string, force bool) error
	Pause(ctx context.Context, id string) (*supervisor.Status, error)
	Stop(ctx context.Context, id string, force bool) (*supervisor.Status, error)
	Resume(ctx context.Context, id string) (*supervisor.Status, error)
	SetTimeout(ctx context.Context, id string, lt *supervisor.Lifetime) (*supervisor.Status, error)
	Template(name string) (*supervisor.Template, error)

	StartProcess(ctx context.Context, id string, req supervisor.ExecRequest) (*supervisor.Session, error)
	StartTracked(ctx context.Context, id string, req supervisor.ExecRequest, stdin bool, tag string, client []byte) (*supervisor.Attachment, error)
	AttachTracked(ctx context.Context, id string, pid int, tag string, replay bool) (*supervisor.Attachment, error)
	ListTracked(ctx context.Context, id string) ([]supervisor.TrackedInfo, error)
	InputTracked(ctx context.Context, id string, pid int, tag string, in supervisor.TrackedInput) error
	WatchDir(ctx context.Context, id, path, user string, opts supervisor.WatchOptions) (*supervisor.DirWatch, error)

	ListFileDetails(ctx context.Context, id, path, user string, limit int) ([]supervisor.FileInfo, error)
	StatFile(ctx context.Context, id, path, user string) (supervisor.FileInfo, error)
	ReadFile(ctx context.Context, id, path, user string) (io.ReadCloser, int64, error)
	WriteFile(ctx context.Context, id string, req supervisor.WriteRequest, r io.Reader) (int64, error)
	RemoveFile(ctx context.Context, id, path, user string, recursive bool) error
	MakeDir(ctx context.Context, id, path, user string, mode fs.FileMode, parents bool) error
}

var _ Supervisor = (*supervisor.Supervisor)(nil)

// EnvdVersion is the envd version that bothyd reports to the SDKs, which turn features on
// by it: recursive watching (0.1.4), the choice of stdin (0.3.0), the default user (0.4.0),
// closeStdin (0.5.2), the octet-stream upload (0.5.7), file metadata (0.6.2), entries in
// watch events (0.6.3) and allowNetworkMounts (0.6.4), the newest of the SDKs' gates. Each
// is served; see docs/e2b.md.
const EnvdVersion = "0.6.4"

// Defaults of E2B's API.
const (
	// defaultTimeout is a sandbox's lifetime when a create names none, as E2B's.
	defaultTimeout = 300 * time.Second
	// transitionTimeout bounds a lifecycle call made for the control plane.
	transitionTimeout = 60 * time.Second
	// defaultUser is who files and processes act as when the caller names nobody: E2B's
	// and bothyd's unprivileged user.
	defaultUser = "user"
	// maxJSONBytes bounds a control-plane request body.
	maxJSONBytes = 1 << 20
)

// Config is what the handler needs.
type Config struct {
	Supervisor Supervisor
	// Token is bothyd's API token; "" serves without authentication, as bothyd does.
	Token string
	// Resources and DiskMB are what a created sandbox gets (E2B's create names neither).
	Resources supervisor.Resources
	DiskMB    int
	// MaxFileBytes bounds an upload through POST /files.
	MaxFileBytes int64
	Logger       *slog.Logger
	// Usage, if set, answers getMetrics and GET /sandboxes/metrics; nil answers them 501.
	Usage *usage.Sampler
	// Volumes, if set, serves E2B's volumes (volumes.go); nil answers them 501.
	Volumes *volume.Store
	// Secrets, if set, answers E2B's /secrets; nil answers them 501.
	Secrets Secrets
}

// Handler serves both of E2B's planes; mount it where [Claims] says.
type Handler struct {
	cfg  Config
	sup  Supervisor
	log  *slog.Logger
	envd http.Handler
	// watchers are the polled watchers of the envd plane (watch.go).
	watchers watcherTable
	// volumeOps holds a slot per volume content call in flight (volumes.go).
	volumeOps chan struct{}
}

// New returns the handler.
func New(cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = 8 << 30
	}
	h := &Handler{cfg: cfg, sup: cfg.Supervisor, log: cfg.Logger, volumeOps: make(chan struct{}, maxVolumeOps)}
	h.envd = h.envdRoutes()
	return h
}

// SandboxHeader names the sandbox of an envd call.
const SandboxHeader = "E2b-Sandbox-Id"

// Claims reports whether r belongs to E2B's API rather than to bothyd's own: an envd call
// (it names its sandbox in [SandboxHeader]) or a control-plane path. None of these paths is
// one of bothyd's, which all live below /v1/ or are its few open routes.
func Claims(r *http.Request) bool {
	if r.Header.Get(SandboxHeader) != "" {
		return true
	}
	p := r.URL.Path
	return p == "/sandboxes" || strings.HasPrefix(p, "/sandboxes/") ||
		p == "/v2/sandboxes" || strings.HasPrefix(p, "/v2/sandboxes/") ||
		p == "/volumes" || strings.HasPrefix(p, "/volumes/") || strings.HasPrefix(p, "/volumecontent/") ||
		p == "/snapshots" || (r.Method == http.MethodDelete && strings.HasPrefix(p, "/templates/")) ||
		p == "/secrets" || strings.HasPrefix(p, "/secrets/")
}

// IsUpload reports whether r, which [Claims] claims, is a file upload (envd's POST
// /files), whose body may be large and slow: bothyd's server bounds its pauses rather than
// its whole time.
func IsUpload(r *http.Request) bool {
	if r.Method == http.MethodPut && isVolumeContent(r) {
		return true // a volume's file, streamed
	}
	return r.Header.Get(SandboxHeader) != "" && r.Method == http.MethodPost && r.URL.Path == "/files"
}

// streamProcedures are the envd plane's calls that last as long as their client (or their
// process) likes: bothyd's server counts them against the client's streams.
var streamProcedures = map[string]bool{
	"/process.Process/Start":          true,
	"/process.Process/Connect":        true,
	"/process.Process/StreamInput":    true,
	"/filesystem.Filesystem/WatchDir": true,
}

// IsStream reports whether r, which [Claims] claims, is one of the long-lived calls.
func IsStream(r *http.Request) bool {
	return r.Header.Get(SandboxHeader) != "" && streamProcedures[r.URL.Path]
}

// ServeHTTP dispatches to the envd plane or the control plane.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(SandboxHeader) != "" {
		h.serveEnvd(w, r)
		return
	}
	if isVolumeContent(r) {
		h.serveVolumeContent(w, r)
		return
	}
	h.serveControl(w, r)
}

// apiKeyOK reports whether key is bothyd's token, bare or behind E2B's e2b_ prefix.
func (h *Handler) apiKeyOK(key string) bool {
	if h.cfg.Token == "" {
		return true
	}
	want := []byte(h.cfg.Token)
	if subtle.ConstantTimeCompare([]byte(key), want) == 1 {
		return true
	}
	suffix, ok := strings.CutPrefix(key, "e2b_")
	return ok && subtle.ConstantTimeCompare([]byte(suffix), want) == 1
}

// accessToken is sandbox id's envd access token: "" without a server token.
func (h *Handler) accessToken(id string) string {
	return AccessToken(h.cfg.Token, id)
}

// AccessToken is the envd access token of sandbox id on a server whose token is
// serverToken ("" without one): exported for the cluster's router, which checks a token
// before it routes an envd call to the sandbox's node (docs/cluster.md).
func AccessToken(serverToken, id string) string {
	if serverToken == "" {
		return ""
	}
	m := hmac.New(sha256.New, []byte(serverToken))
	m.Write([]byte("bothyd e2b envd access token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// accessTokenOK reports whether got is sandbox id's envd access token.
func (h *Handler) accessTokenOK(id, got string) bool {
	want := h.accessToken(id)
	return want == "" || hmac.Equal([]byte(got), []byte(want))
}
