package supervisor

import (
	"context"
	"errors"
	"github.com/bothy/bothy/checkpoint"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/idle"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/image"
	"github.com/bothy/bothy/store/template"
	"github.com/bothy/bothy/volume"
)

// Names the supervisor keeps in a state directory besides the runtime's.
const (
	// ExecLockName is the exec admission lock.
	ExecLockName = "exec.lock"
	// CapabilityName holds the launch's control capability, so that a restarted bothyd can
	// dial the agent again. It is outside the part of the state directory the sandbox sees.
	CapabilityName = "control.capability"
	// LogName is the runtime's log, read by Logs.
	LogName = "sandbox.log"
)

// State is a sandbox's lifecycle state, as [Supervisor.Status] reads it. A sandbox that
// another runtime identity runs is StateRunning with [Status.RuntimeMismatch] set: the
// mismatch says who may drive it, not where it is in its life.
type State string

// The states a sandbox reads as.
const (
	StateProvisioned State = "provisioned"
	StateStarting    State = "starting"
	StateRunning     State = "running"
	StateStopping    State = "stopping"
	StateStopped     State = "stopped"
)

// HostImage is the built-in image: the host's /usr, read-only.
const HostImage = "host"

var imageName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// Options configure a Supervisor.
type Options struct {
	Store *store.Store
	// Runtime is the default runtime: the one of sandboxes whose configuration names none.
	Runtime runtime.Runtime
	// Runtimes are the other runtimes, one of each kind, that sandboxes may name (see
	// runtimes.go).
	Runtimes []runtime.Runtime
	// Unavailable are runtime kinds refused on create, with why (turned off, or not working
	// on this host); one of them may still be among Runtimes, to drive its existing sandboxes.
	Unavailable map[string]error
	// Templates is the template store; nil disables capture and clone.
	Templates *template.Store
	// Generations, if set, moves template generations between nodes: each capture is pushed
	// to it, and a clone of a generation this node lacks pulls it first.
	Generations GenerationRegistry
	// Images is the image store of OCI images; nil leaves the host image and the
	// directories under images/ alone.
	Images *image.Store
	// ImagePlatform is the platform the image store pulls for ("" for the host's).
	ImagePlatform string
	Logger        *slog.Logger
	// StopGrace is how long the agent waits after TERM before it KILLs what is left.
	StopGrace time.Duration
	// OnEvent, if set, is told of every state change this supervisor makes or notices. It
	// must not block.
	OnEvent func(Event)
	// OnTransition, if set, is told of every transition's duration and result (op is
	// provision, start, stop, deprovision or exec-admission). It must not block.
	OnTransition func(op string, d time.Duration, err error)
	// Storage, if set, is told of the storage faults the supervisor meets where no store
	// classified them (the runtime's start, a sandbox's disk) and classifies them.
	Storage *StorageHealth
	// Ports bound the port connections open at once (see [Supervisor.DialPort]).
	Ports PortLimits
	// Network, if set, gives sandboxes the network their policies ask for (a network.Manager).
	Network Networker
	// Secrets, if set, lets policies bind secrets (secrets.go); nil refuses a policy that does.
	Secrets Secrets
	// Spares, if set, are the spares to keep once [Supervisor.StartSpares] is called (with a
	// Count of 0: none, and those an earlier run left are deleted). Nil leaves spares alone,
	// as bothyd check and tests do.
	Spares *SpareOptions
	// Volumes is the volume store; nil refuses a create that names volumes.
	Volumes *volume.Store
	// Checkpoints bound each sandbox's checkpoints (zero: the defaults of package checkpoint).
	Checkpoints checkpoint.Limits
	// CrashPoint, for tests only (bothyd built with the crashpoints tag), is called at the
	// named steps of launches, captures, checkpoints, rollbacks and forks, where the test's
	// process kills itself to leave what a crash there leaves.
	CrashPoint func(step string)
	// Admission, if set, admits every create against limits the supervisor does not keep
	// (a cluster node's published capacity, docs/cluster.md); nil admits all.
	CreateAdmission CreateAdmission
}

// CreateAdmission admits new sandboxes, and starts of sandboxes that hold no limits now
// (stopped or provisioned: Start). Admit is called once per create, after the request's
// checks and before the sandbox is recorded, with the limits the sandbox will hold (a clone's
// resolved from its generation; none, a slot alone, when the create does not start it); it refuses with a coded error, or reserves what the sandbox
// will hold until release is called, which the supervisor does once the create has returned
// (made, started or undone), so that an admission that counts the store and its reservations
// counts each create exactly once.
type CreateAdmission interface {
	Admit(id string, limits Resources) (release func(), err error)
}

// Supervisor drives the sandboxes of one state root. It is safe for concurrent use, and
// several supervisors (in several processes) may share a state root: the store's locks
// serialise them.
type Supervisor struct {
	secrets   Secrets
	store     *store.Store
	volumes   *volume.Store
	templates *template.Store
	images    *image.Store
	// imagePlatform is the one platform pulls accept.
	imagePlatform string
	rt            runtime.Runtime
	runtimes      *runtimeSet
	log           *slog.Logger
	grace         time.Duration

	onEvent      func(Event)
	onTransition func(string, time.Duration, error)
	health       *StorageHealth
	// crashPoint, set by tests, is called at the named steps of a launch, where a test
	// process kills itself to leave what a crash there leaves.
	crashPoint func(step string)
	admission  CreateAdmission
	// checkpointLimits bound each sandbox's checkpoints.
	checkpointLimits checkpoint.Limits

	// janitor starts the trash's janitor ([Supervisor.emptyTrash]) once, with the first
	// reattach pass: a supervisor that only checks (bothyd check) leaves the trash alone.
	janitor sync.Once
	// generations moves template generations between nodes; nil when none is configured.
	generations GenerationRegistry
	// pushes are the pushes of generations captured by this process.
	pushes pushStates
	// changing are the tombstones and retirements under way in this process, whose outbox
	// records a flush must leave alone (templateregistry.go).
	changing changesUnderWay
	// life ends when the supervisor closes; watchers stop with it.
	life     context.Context
	stopLife context.CancelFunc
	wg       sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	clients   map[string]*agentConn  // by sandbox id
	transient map[string]State       // sandbox id → starting or stopping, while this process drives it
	watched   map[string]string      // sandbox id → the launch a watcher follows
	pulls     map[string]*pull       // image name → its pull in progress, or failed
	timers    map[string]*time.Timer // sandbox id → the end of its lifetime
	// activity is the idle clock of sandboxes with a sleep policy; wakes the wakes under way
	// (sleep.go).
	activity *idle.Tracker
	wakes    map[string]*wake
	// sleepers are the sandboxes with a sleep policy: the idle watch looks at them alone, and
	// a use of any other sandbox reads no record to learn that it does not sleep (sleep.go).
	sleepers map[string]bool
	// wakeWait is how long a request waits for a wake (defaultWakeWait; shorter in tests).
	wakeWait time.Duration
	// unreconciled are the sandboxes that the start-up reattach pass listed and nobody has
	// reconciled since (see [Supervisor.StartReattach]); reconciled is closed when the pass
	// ended (at once if there was none).
	unreconciled map[string]bool
	reconciled   chan struct{}

	ports  portConns
	net    *netState
	spares *spareSet
}

// agentConn is a control session with one launch's agent.
type agentConn struct {
	launchID string
	client   *control.Client
}

// New returns a supervisor and declares the names it and its runtime keep in state
// directories.
func New(opts Options) (*Supervisor, error) {
	if opts.Store == nil || opts.Runtime == nil {
		return nil, errors.New("supervisor: a store and a runtime are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = 5 * time.Second
	}
	if opts.ImagePlatform == "" {
		opts.ImagePlatform = image.HostPlatform()
	}
	runtimes, err := newRuntimeSet(opts.Runtime, opts.Runtimes, opts.Unavailable)
	if err != nil {
		return nil, err
	}
	life, stopLife := context.WithCancel(context.Background())
	s := &Supervisor{
		runtimes:      runtimes,
		store:         opts.Store,
		templates:     opts.Templates,
		generations:   opts.Generations,
		images:        opts.Images,
		imagePlatform: opts.ImagePlatform,
		pulls:         map[string]*pull{},
		rt:            opts.Runtime,
		log:           opts.Logger,
		grace:         opts.StopGrace,
		onEvent:       opts.OnEvent,
		onTransition:  opts.OnTransition,
		health:        opts.Storage,
		life:          life,
		stopLife:      stopLife,
		clients:       map[string]*agentConn{},
		transient:     map[string]State{},
		watched:       map[string]string{},
		ports:         portConns{limits: opts.Ports.withDefaults()},
		timers:        map[string]*time.Timer{},
		activity:      idle.NewTracker(),
		wakes:         map[string]*wake{},
		sleepers:      map[string]bool{},
		wakeWait:      defaultWakeWait,
		reconciled:    closedChan(),
		net:           newNetState(opts.Network),
		secrets:       opts.Secrets,
		spares:        newSpareSet(opts.Spares),
		volumes:       opts.Volumes,

		checkpointLimits: opts.Checkpoints,
		crashPoint:       opts.CrashPoint,
		admission:        opts.CreateAdmission,
	}
	if s.volumes != nil {
		s.volumes.SetHeldBy(VolumeHeldBy(s.store))
		s.volumes.SetOnChange(func(change, name string) { s.emit(Event{Type: change, Volume: name}) })
	}
	for _, d := range DeclaredEntries(s.runtimes.all()...) {
		if err := s.store.Declare(d.Name, d.Kind); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Store returns the sandbox store.
func (s *Supervisor) Store() *store.Store { return s.store }

// RuntimeInfo names the runtime sandboxes run under.
type RuntimeInfo struct {
	// Kind is the runtime's kind ("namespace").
	Kind string
	// Identity is the runtime identity: its kind, bothyd's build and the runtime's
	// configuration. Template generations are captured under it and clone only under it.
	Identity string
	// Runtimes are every runtime kind of the server, this one first ([Supervisor.Runtimes]).
	Runtimes []RuntimeStatus
}

// RuntimeInfo names the default runtime, and lists them all.
func (s *Supervisor) RuntimeInfo() RuntimeInfo {
	return RuntimeInfo{Kind: s.rt.Kind(), Identity: s.rt.Identity(), Runtimes: s.Runtimes()}
}

// Status is what a caller may know of a sandbox.
type Status struct {
	Config Config
	State  State
	// Runtime is the kind of the sandbox's runtime (its configuration's, or the default's).
	Runtime string
	// StartedAt is when the current (or last committed) launch started.
	StartedAt *time.Time
	// LastExit is how the last run ended, if one did.
	LastExit *Exit
	// RuntimeMismatch says a live process of another runtime identity holds the sandbox.
	RuntimeMismatch bool
	// Binding is a clone's template binding (its lease), nil for other sandboxes.
	Binding *Binding
	// ExpiresAt is when the sandbox's lifetime ends, and OnTimeout what that does; nil and
	// "" without a lifetime.
	ExpiresAt *time.Time
	OnTimeout OnTimeout
	// Network is the sandbox's egress policy and address, nil for a sandbox without a policy.
	Network *NetworkStatus
	// Asleep says a paused sandbox was put to sleep because it was idle (sleep.go).
	Asleep bool
}

func (s *Supervisor) setTransient(id string, state State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if state == "" {
		delete(s.transient, id)
	} else {
		s.transient[id] = state
	}
}

// Status reads a sandbox's state without taking its lock: records are replaced atomically,
// so each read is consistent, and a transition in progress shows as starting or stopping. A
// spare (spares.go) is no sandbox of a client's: sandbox-not-found.
func (s *Supervisor) Status(id string) (*Status, error) { return s.status(id, false) }

// status is [Supervisor.Status], which reads a spare too with spare set.
func (s *Supervisor) status(id string, spare bool) (*Status, error) {
	if err := store.ValidateID(id); err != nil {
		return nil, err
	}
	s.settleAtStartup(id)
	cfg, err := s.store.ReadConfigUnlocked(id) // sandbox-not-found when there is none
	if err != nil {
		return nil, err
	}
	if cfg.Spare && !spare {
		return nil, errNoSandbox(id)
	}
	st := &Status{Config: *cfg, State: StateProvisioned, Runtime: s.kindOf(cfg)}
	if cfg.Template != nil {
		dir, err := s.store.Dir(id)
		if err != nil {
			return nil, err
		}
		if b, err := template.ReadBinding(dir); err == nil {
			st.Binding = b
		}
	}
	outcome, err := s.store.ReadOutcomeUnlocked(id)
	if err != nil {
		return nil, err
	}
	if outcome != nil {
		st.LastExit = outcome
		st.State = StateStopped
	}
	journal, err := s.store.ReadLaunchJournalUnlocked(id)
	if err != nil {
		return nil, err
	}
	rec, err := s.store.ReadRuntimeRecordUnlocked(id)
	if err != nil {
		return nil, err
	}
	switch {
	case rec != nil:
		started := rec.StartedAt
		st.StartedAt = &started
		if processOf(rec).Alive() {
			st.State = StateRunning
			if dir, err := s.store.Dir(id); err == nil {
				if pr, err := readPause(dir); err == nil && pr != nil && pr.LaunchID == rec.LaunchID {
					st.State, st.Asleep = StatePaused, pr.Reason == PauseIdle
				}
			}
			st.RuntimeMismatch = s.mismatched(rec)
			if outcome != nil && outcome.LaunchID == rec.LaunchID {
				// The sandbox ended; its runtime process is finishing up.
				st.State = StateStopped
			}
		} else {
			st.State = StateStopped
		}
	case journal != nil:
		st.State = StateStarting
	}
	if dir, err := s.store.Dir(id); err == nil {
		st.ExpiresAt, st.OnTimeout = s.expiry(dir)
	}
	s.mu.Lock()
	if t, ok := s.transient[id]; ok {
		st.State = t
	}
	s.mu.Unlock()
	st.Network = s.networkStatus(cfg, st.State)
	return st, nil
}

// List returns the status of every sandbox, in id order.
func (s *Supervisor) List() ([]*Status, error) {
	ids, err := s.store.List()
	if err != nil {
		return nil, err
	}
	out := make([]*Status, 0, len(ids))
	for _, id := range ids {
		st, err := s.Status(id)
		if errcode.Of(err) == errcode.SandboxNotFound {
			continue // removed meanwhile, or a directory that is not (or no longer) provisioned
		}
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// ListPage returns, in id order, the first n sandboxes after the id after ("" for the first)
// that keep accepts, and whether one more follows them. Only the statuses up to that one are
// read, so a page costs its size, not the state root's: at 4000 sandboxes a listing read 4000
// statuses for a page of one (issue 17). A sandbox removed meanwhile is left out, as in List.
func (s *Supervisor) ListPage(after string, n int, keep func(*Status) bool) ([]*Status, bool, error) {
	ids, err := s.store.List() // sorted
	if err != nil {
		return nil, false, err
	}
	var page []*Status
	for _, id := range ids {
		if id <= after {
			continue
		}
		st, err := s.Status(id)
		if errcode.Of(err) == errcode.SandboxNotFound {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		if !keep(st) {
			continue
		}
		if len(page) == n {
			return page, true, nil
		}
		page = append(page, st)
	}
	return page, false, nil
}

// Provision creates a sandbox's state directory and configuration record.
func (s *Supervisor) Provision(ctx context.Context, cfg store.Config) (*Status, error) {
	return s.provision(ctx, cfg, provisioning{}, nil)
}

// provision is [Supervisor.Provision] with what p adds. With then, it calls then under the
// sandbox's lock once the sandbox exists; then releases the lock (or removes the sandbox) and
// its error is provision's.
func (s *Supervisor) provision(ctx context.Context, cfg store.Config, p provisioning, then func(*store.Lock) error) (_ *Status, err error) {
	defer s.observe("provision", time.Now(), &err)
	if err := store.ValidateID(cfg.ID); err != nil {
		return nil, err
	}
	if cfg.Image == "" {
		cfg.Image = HostImage
	}
	if err := s.checkRuntime(cfg.Runtime); err != nil {
		return nil, err
	}
	if err := s.checkDisk(cfg.Runtime, cfg.DiskMB); err != nil {
		return nil, err
	}
	// An OCI image's reference is durable before the sandbox exists (see images.go).
	use, err := s.referImage(ctx, cfg.Image, cfg.ID)
	if err != nil {
		return nil, err
	}
	// The image store's lock is held until the sandbox exists, not through a start (then):
	// a start that fails removes the sandbox, which takes that lock again.
	useDone := false
	finishUse := func(errp *error) {
		if !useDone {
			useDone = true
			use.done(errp)
		}
	}
	defer finishUse(&err)
	l, err := s.store.LockForProvision(ctx, cfg.ID)
	if err != nil {
		return nil, err
	}
	handedOver := false
	defer func() {
		if !handedOver {
			s.unlock(l)
		}
	}()
	if err := l.RequireUnprovisioned(); err != nil {
		return nil, err
	}
	if err := s.holdVolumes(l.ID(), cfg.Volumes); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && !handedOver {
			s.releaseVolumes(l.ID(), cfg.Volumes)
		}
	}()
	cfg.Format = store.ConfigFormat
	cfg.Spare = p.spare
	if cfg.CreatedAt.IsZero() {
		cfg.CreatedAt = time.Now().UTC()
	}
	if err := l.WriteConfig(&cfg); err != nil {
		return nil, err
	}
	if err := s.prepare(l, p); err != nil {
		s.undoProvision(ctx, l)
		return nil, err
	}
	s.emit(Event{Type: EventCreated, Sandbox: cfg.ID, State: StateProvisioned})
	if then != nil {
		handedOver = true
		var provisioned error
		finishUse(&provisioned)
		if err := then(l); err != nil {
			return nil, err
		}
		s.armLifetime(cfg.ID)
		return nil, nil
	}
	s.armLifetime(cfg.ID)
	return s.status(cfg.ID, true)
}

// minDiskMB is the smallest disk of its own a sandbox can have.
const minDiskMB = 32

// checkDisk refuses a disk of the sandbox's own (diskMB > 0) that the runtime of kind cannot
// give.
func (s *Supervisor) checkDisk(kind string, diskMB int) error {
	if diskMB == 0 {
		return nil
	}
	if diskMB < 0 {
		return errcode.Invalid("resources.disk_mb", "The disk size must be positive.")
	}
	if diskMB < minDiskMB {
		return errcode.Invalid("resources.disk_mb", "A disk of its own must have at least %d MiB, too little for a file system otherwise; use 0 for none.", minDiskMB)
	}
	rt, err := s.runtimeOf(kind)
	if err != nil {
		return err
	}
	dl, ok := rt.(runtime.DiskLimiter)
	if !ok {
		return errcode.New(errcode.Unavailable, "The %s runtime cannot give a sandbox a disk of its own; leave out resources.disk_mb.", rt.Kind())
	}
	if err := dl.DiskSupport(); err != nil {
		return errcode.Wrap(errcode.Unavailable, err, "This host cannot give a sandbox a disk of its own (%v); leave out resources.disk_mb.", err)
	}
	return nil
}

// HostBase is where the runtimes keep what their sandboxes share (Spec.HostBase: the host
// image's base layer, a microVM's initramfs and base disks): under images/, in a name no
// image can have (image names start with a letter or digit).
func (s *Supervisor) HostBase() string {
	return filepath.Join(s.store.Root(), "images", ".host")
}

// imageDir resolves an image name to its directory ("" for the host image).
func (s *Supervisor) imageDir(name string) (string, error) {
	if name == HostImage {
		return "", nil
	}
	if !imageName.MatchString(name) {
		return "", errcode.Invalid("image", "The image name %q is not valid: use 1-63 of a-z 0-9 . _ - starting with a letter or digit.", name)
	}
	dir := filepath.Join(s.store.Root(), "images", name)
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return "", errcode.New(errcode.ImageNotFound, "There is no image %q; use %q or put a root filesystem directory under the state root's images/.", name, HostImage)
	}
	return dir, nil
}

// lockProvisioned locks an existing, provisioned sandbox of a client's and returns its
// configuration: a spare (spares.go) is sandbox-not-found. A sandbox that the start-up
// reattach pass has not reached yet is reconciled first, as the pass would have (see
// [Supervisor.StartReattach]).
func (s *Supervisor) lockProvisioned(ctx context.Context, id string) (*store.Lock, *store.Config, error) {
	l, cfg, err := s.lockAnyProvisioned(ctx, id)
	if err == nil && cfg.Spare {
		s.unlock(l)
		return nil, nil, errNoSandbox(id)
	}
	return l, cfg, err
}

// lockAnyProvisioned is [Supervisor.lockProvisioned] for spares too.
func (s *Supervisor) lockAnyProvisioned(ctx context.Context, id string) (*store.Lock, *store.Config, error) {
	l, err := s.store.LockExisting(ctx, id) // validates the id; sandbox-not-found without config
	if err != nil {
		return nil, nil, err
	}
	if s.takeUnreconciled(id) {
		if l = s.reconcileAtStartup(ctx, l); l == nil {
			return nil, nil, errNoSandbox(id)
		}
	}
	cfg, err := l.Config()
	if err != nil {
		s.unlock(l)
		return nil, nil, err
	}
	return l, cfg, nil
}

// errNoSandbox is sandbox-not-found for id.
func errNoSandbox(id string) error {
	return errcode.New(errcode.SandboxNotFound, "There is no sandbox %s; create it first, or check the id.", id)
}

// settleAtStartup, while the start-up reattach pass runs, waits for sandbox id's
// reconciliation, doing it if the pass has not reached it: until then its records are as a
// crash left them, and an interrupted start would read as "starting" though nothing runs.
// Once the pass is done it costs nothing. A lock held past a short wait (another operation's
// long start) leaves the status to be read as it is.
func (s *Supervisor) settleAtStartup(id string) {
	s.mu.Lock()
	done := s.reconciled
	s.mu.Unlock()
	select {
	case <-done:
		return
	default:
	}
	ctx, cancel := context.WithTimeout(s.life, 2*time.Second)
	defer cancel()
	if l, _, err := s.lockProvisioned(ctx, id); err == nil {
		s.unlock(l)
	}
}

func (s *Supervisor) unlock(l *store.Lock) {
	if err := l.Unlock(); err != nil {
		s.log.Warn("releasing a sandbox lock", "sandbox", l.ID(), "err", err)
	}
}

func processOf(rec *store.RuntimeRecord) platform.ProcessID {
	return platform.ProcessID{Pid: rec.Pid, StartTime: rec.PidStartTime, BootID: rec.BootID}
}

// crash calls the test's crash point, if any.
func (s *Supervisor) crash(step string) {
	if s.crashPoint != nil {
		s.crashPoint(step)
	}
}

// cleanupContext is for the work that must finish even though the caller's deadline passed:
// undoing a failed launch, clearing records.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
}

// Images lists the images a sandbox can use: the host image, then the directories under the
// state root's images/ whose names are valid.
func (s *Supervisor) Images() ([]string, error) {
	images := []string{HostImage}
	entries, err := os.ReadDir(filepath.Join(s.store.Root(), "images"))
	if errors.Is(err, os.ErrNotExist) {
		return images, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != HostImage && imageName.MatchString(e.Name()) {
			images = append(images, e.Name())
		}
	}
	return images, nil
}
