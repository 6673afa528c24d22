package handlers

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/bothy/bothy/events"
	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/portlink"
	"github.com/bothy/bothy/supervisor"
	"github.com/bothy/bothy/usage"
	"github.com/bothy/bothy/volume"
)

// The handlers must implement every operation of the contract, and the supervisor must be
// one they can use.
var (
	_ openapi.StrictServerInterface = (*Handlers)(nil)
	_ Supervisor                    = (*supervisor.Supervisor)(nil)
)

// Supervisor is what the handlers need of the supervisor ([supervisor.Supervisor]): all they
// reach of sandboxes, workloads, files and templates goes through it.
type Supervisor interface {
	// Sandboxes.
	Create(ctx context.Context, req supervisor.CreateRequest) (*supervisor.Status, error)
	Status(id string) (*supervisor.Status, error)
	List() ([]*supervisor.Status, error)
	ListPage(after string, n int, keep func(*supervisor.Status) bool) ([]*supervisor.Status, bool, error)
	Start(ctx context.Context, id string) (*supervisor.Status, error)
	Stop(ctx context.Context, id string, force bool) (*supervisor.Status, error)
	Deprovision(ctx context.Context, id string) error
	Delete(ctx context.Context, id string, force bool) error
	Pause(ctx context.Context, id string) (*supervisor.Status, error)
	PauseReleasing(ctx context.Context, id string) (*supervisor.Status, error)
	Resume(ctx context.Context, id string) (*supervisor.Status, error)
	SetTimeout(ctx context.Context, id string, lt *supervisor.Lifetime) (*supervisor.Status, error)
	Logs(id string, tail int) ([]byte, error)
	Images() ([]string, error)
	RuntimeInfo() supervisor.RuntimeInfo

	// Workloads.
	AdmitExec(ctx context.Context, id string, wait time.Duration) (*supervisor.Admission, error)
	RunExec(ctx context.Context, a *supervisor.Admission, req supervisor.ExecRequest, stdin io.Reader) (*supervisor.ExecResult, error)
	StartExec(ctx context.Context, a *supervisor.Admission, req supervisor.ExecRequest) (*supervisor.Session, error)

	// Files.
	ListFiles(ctx context.Context, id, path, user string) ([]supervisor.FileInfo, error)
	ReadFile(ctx context.Context, id, path, user string) (io.ReadCloser, int64, error)
	WriteFile(ctx context.Context, id string, req supervisor.WriteRequest, r io.Reader) (int64, error)
	RemoveFile(ctx context.Context, id, path, user string, recursive bool) error

	// Templates.
	CreateTemplate(ctx context.Context, name string) (*supervisor.Template, error)
	ListTemplates() ([]supervisor.Template, error)
	Template(name string) (*supervisor.Template, error)
	DeleteTemplate(ctx context.Context, name string, drain bool) (supervisor.RetireOutcome, error)
	Capture(ctx context.Context, template, sandbox string) (*supervisor.Generation, error)
	ListGenerations(template string) ([]supervisor.Generation, error)
	// PushState is where the push of a generation captured by this process stands.
	PushState(template, gen string) (supervisor.PushState, bool)
	Generation(template, gen string) (*supervisor.Generation, error)
	Tombstone(ctx context.Context, template, gen string) (*supervisor.Generation, error)
	Retire(ctx context.Context, template, gen string, drain bool) (supervisor.RetireOutcome, error)
	Leases(template, gen string) ([]supervisor.Lease, error)
}

// Defaults of the contract's optional parameters.
const (
	defaultTimeout     = 30 * time.Second // lifecycle transitions
	defaultExecTimeout = 60 * time.Second // a buffered exec's workload
	defaultExecWait    = 60 * time.Second // exec admission
	defaultListLimit   = 100
)

// Config is what the handlers need.
type Config struct {
	Supervisor Supervisor
	// DefaultResources fill in what a create request leaves out.
	DefaultResources supervisor.Resources
	// DefaultTimeoutS is the lifetime in seconds of sandboxes whose create names none (0:
	// none).
	DefaultTimeoutS int
	// DefaultDiskMB is the disk of their own that sandboxes get when a create request names
	// none (0: none).
	DefaultDiskMB int
	Version       string // bothyd's version, reported by /v1/info
	// MaxGenerationAge is how long after capture a generation can be cloned.
	MaxGenerationAge time.Duration
	MaxJSONBytes     int64
	MaxFileBytes     int64
	Logger           *slog.Logger
	// Events, if set, is where handlers publish the events they cause (the supervisor's own
	// reach the bus through its OnEvent hook; see EventOf). A nil bus drops events.
	Events *events.Bus
	// Images, if set, serves the image operations (the supervisor); without it they answer
	// not-implemented, and the image list holds the host image and directories alone.
	Images Images
	// OnExec, if set, is told of every admitted exec when it ends: mode is "buffered" or
	// "stream", d how long it ran, timedOut whether its timeout killed it, err why it failed.
	// It must not block.
	OnExec func(mode string, d time.Duration, timedOut bool, err error)
	// Storage, if set, reports the state root's health for /v1/info.
	Storage func() supervisor.StorageStatus
	// HostFirewall, if set, reports what the host's own firewall does to the sandboxes'
	// traffic, for /v1/info's network; nil (no sandbox network) leaves network out.
	HostFirewall func() network.HostFirewall
	// NoFileLimit is bothyd's RLIMIT_NOFILE, for /v1/info (0: unknown).
	NoFileLimit uint64
	// Links, if set, keeps the port links; nil answers their routes not-implemented.
	Links *portlink.Store
	// Webhooks, if set, keeps the webhooks; nil answers their routes not-implemented.
	Webhooks Webhooks
	// Secrets, if set, keeps the secrets; nil answers their routes not-implemented.
	Secrets Secrets
	// Usage, if set, answers GET /v1/sandboxes/{id}/metrics; nil answers it not-implemented.
	Usage *usage.Sampler
	// Volumes, if set, keeps the volumes; nil answers their routes not-implemented.
	Volumes *volume.Store
}

// Handlers implements openapi.StrictServerInterface.
type Handlers struct {
	cfg     Config
	sup     Supervisor
	log     *slog.Logger
	streams streamSet
	bounds  bounds
	ports   portProxy
}

// New returns the handlers.
func New(cfg Config) (*Handlers, error) {
	if cfg.Supervisor == nil {
		return nil, errors.New("handlers: a supervisor is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Handlers{cfg: cfg, sup: cfg.Supervisor, log: cfg.Logger}, nil
}

// deadline turns an optional timeout in milliseconds (validated by the contract: 1..3600000)
// into a context.
func deadline(ctx context.Context, ms *int, def time.Duration) (context.Context, context.CancelFunc) {
	d := def
	if ms != nil {
		d = time.Duration(*ms) * time.Millisecond
	}
	return context.WithTimeout(ctx, d)
}

func (h *Handlers) GetHealth(context.Context, openapi.GetHealthRequestObject) (openapi.GetHealthResponseObject, error) {
	return openapi.GetHealth200JSONResponse{Status: "ok"}, nil
}

// EventTypes are the types of the events the supervisor reports (the contract's EventType):
// those a webhook may ask for.
var EventTypes = []string{
	supervisor.EventCreated, supervisor.EventStarted, supervisor.EventStopped, supervisor.EventExited,
	supervisor.EventDeleted, supervisor.EventPaused, supervisor.EventResumed, supervisor.EventExpired,
	supervisor.EventAsleep, supervisor.EventAwake,
	supervisor.EventCaptured, supervisor.EventTombstoned, supervisor.EventRetired,
	supervisor.EventAcquired, supervisor.EventReleased, supervisor.EventProgress,
	supervisor.EventImagePullProgress, supervisor.EventImagePulled, supervisor.EventImageImported,
	supervisor.EventImageFailed, supervisor.EventImageDeleted,
	supervisor.EventCheckpointCreated, supervisor.EventCheckpointDeleted,
	supervisor.EventRolledBack, supervisor.EventForked,
	supervisor.EventVolumeCreated, supervisor.EventVolumeDeleted,
}

// EventOf is the contract's view of a supervisor event, ready for events.Bus.Publish (which
// numbers and stamps it). The exit is converted exactly as a sandbox's last_exit is.
func EventOf(e supervisor.Event) openapi.Event {
	ev := openapi.Event{Type: openapi.EventType(e.Type)}
	if e.Sandbox != "" {
		id := e.Sandbox
		ev.Sandbox = &id
	}
	if e.State != "" {
		state := openapi.SandboxState(e.State)
		ev.State = &state
	}
	if e.Exit != nil {
		ev.Exit = apiSandbox(&supervisor.Status{LastExit: e.Exit}).LastExit
	}
	if e.Template != "" {
		t := e.Template
		ev.Template = &t
	}
	if e.Generation != "" {
		g := e.Generation
		ev.Generation = &g
	}
	if e.Lease != "" {
		l := e.Lease
		ev.Lease = &l
	}
	if e.Image != "" {
		img := e.Image
		ev.Image = &img
	}
	if e.Error != "" {
		msg := e.Error
		ev.Error = &msg
	}
	if e.Checkpoint != "" {
		c := e.Checkpoint
		ev.Checkpoint = &c
	}
	if len(e.Forks) > 0 {
		forks := slices.Clone(e.Forks)
		ev.Forks = &forks
	}
	if e.Volume != "" {
		v := e.Volume
		ev.Volume = &v
	}
	if p := e.ImageProgress; p != nil {
		ev.ImageProgress = &struct {
			BytesDone  int64  `json:"bytes_done"`
			BytesTotal int64  `json:"bytes_total"`
			DiffID     string `json:"diff_id"`
			Layer      int    `json:"layer"`
		}{BytesDone: p.Done, BytesTotal: p.Total, DiffID: p.DiffID, Layer: p.Layer}
	}
	if p := e.Progress; p != nil {
		ev.Progress = &struct {
			BytesDone  int64                      `json:"bytes_done"`
			BytesTotal *int64                     `json:"bytes_total,omitempty"`
			Phase      openapi.EventProgressPhase `json:"phase"`
		}{BytesDone: p.Done, Phase: openapi.EventProgressPhase(p.Phase)}
		if p.Total > 0 {
			total := p.Total
			ev.Progress.BytesTotal = &total
		}
	}
	return ev
}

// execDone reports an admitted exec's end to the OnExec hook.
func (h *Handlers) execDone(mode string, start time.Time, timedOut bool, err error) {
	if h.cfg.OnExec != nil {
		h.cfg.OnExec(mode, time.Since(start), timedOut, err)
	}
}
