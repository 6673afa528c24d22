package supervisor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// The types of the template events.
const (
	EventCaptured   = "generation.captured"
	EventTombstoned = "generation.tombstoned"
	EventRetired    = "generation.retired"
	EventAcquired   = "lease.acquired"
	EventReleased   = "lease.released"
	EventProgress   = "capture.progress"
)

// progressInterval is the least time between two progress events of one capture.
const progressInterval = 250 * time.Millisecond

func (s *Supervisor) requireTemplates() error {
	if s.templates == nil {
		return errcode.New(errcode.NotImplemented, "This server has no template store configured.")
	}
	return nil
}

// bindingExists tells the template store whether a lease's clone still names it, for the
// retirement's sweep.
func (s *Supervisor) bindingExists() func(sandboxID, leaseID string) bool {
	return template.BindingChecker(s.store.Dir)
}

// Capture copies a sandbox's writable layer into a new generation of a template, with the
// compatibility key the sandbox runs under. The sandbox stays locked, so that it cannot start,
// stop or be paused while its layer is copied, and stays as it was: a stopped sandbox stays
// stopped, a paused one paused, and a running one runs on. A running sandbox is frozen for as
// long as the copy reads its layer (see [Supervisor.holdForCapture]), so that the generation
// is a consistent picture of it, and the generation reports that freeze as its capture pause.
func (s *Supervisor) Capture(ctx context.Context, templateName, id string) (g *template.Generation, err error) {
	defer s.observe("capture", time.Now(), &err)
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	if err := template.ValidateName(templateName); err != nil {
		return nil, err
	}
	// A generation on an OCI image references it, written once the sandbox's lock is gone
	// (a provision takes the image store's lock before a sandbox's; see images.go). Until
	// then the sandbox's own reference keeps the image.
	var onImage string
	defer func() {
		if err == nil && onImage != "" {
			if rerr := s.referGeneration(ctx, onImage, templateName, g.ID); rerr != nil {
				s.log.Warn("recording the image reference of a generation; bothyd check repairs it", "template", templateName, "generation", g.ID, "err", rerr)
			}
		}
	}()
	l, cfg, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(l)
	r, err := s.reattach(ctx, l)
	if err != nil {
		return nil, err
	}
	hooks, layer, err := s.holdForCapture(ctx, l, cfg, r)
	if err != nil {
		return nil, err
	}
	if layer != nil {
		defer layer.Close()
	}
	// A clone's capture is its generation's payload with the clone's own layer merged over
	// it. The clone's lease keeps that payload while the lock keeps the clone stopped. A
	// memory capture's snapshot (hooks.Time set) is whole: its disk stands on the image alone
	// (flattenCapture), and the layers below it (a microVM's checkpoint chain or fork-state)
	// would only be copied to be hidden by it.
	lowers, err := s.sandboxLowers(l, cfg)
	if err != nil {
		return nil, err
	}
	if hooks.Time != nil {
		lowers = nil
	}
	var layers []*os.File
	defer func() {
		for _, f := range layers {
			f.Close()
		}
	}()
	for i := len(lowers) - 1; i >= 0; i-- { // lowers are top first; layers bottom first
		f, err := platform.OpenDir(lowers[i])
		if err != nil {
			return nil, errcode.Wrap(errcode.Internal, err, "The generation sandbox %s was cloned from cannot be opened.", id)
		}
		layers = append(layers, f)
	}
	rt, err := s.runtimeFor(cfg)
	if err != nil {
		return nil, err
	}
	if layer == nil {
		if layer, err = rt.OpenLayer(l.Dir(), cfg.DiskMB > 0); err != nil {
			if errcode.Of(err) == errcode.NotImplemented {
				return nil, err // a runtime that cannot capture (microvm) says so itself
			}
			return nil, layerError(id, err)
		}
		defer layer.Close()
	}
	layers = append(layers, layer)
	digest, err := s.imageDigest(cfg.Image)
	if err != nil {
		return nil, err
	}
	key := template.Key{
		Runtime:     rt.Identity(),
		Image:       cfg.Image,
		ImageDigest: digest,
		Resources:   cfg.Resources,
	}
	// Progress is reported a few times a second at most, and at the end: a layer of many
	// small files would otherwise flood the event stream.
	hooks.Source = &template.Source{Sandbox: id}
	if cfg.Template != nil {
		hooks.Source.Template, hooks.Source.Generation = cfg.Template.Template, cfg.Template.Generation
	}
	var last time.Time
	hooks.Progress = func(copied, total int64) {
		if now := time.Now(); now.Sub(last) >= progressInterval || copied == total {
			last = now
			s.emit(Event{Type: EventProgress, Sandbox: id, Template: templateName, Progress: &Progress{Phase: "copying", Done: copied, Total: total}})
		}
	}
	g, err = s.templates.CaptureLayersWith(ctx, templateName, layers, key, hooks)
	if err != nil {
		return nil, err
	}
	if digest != "" {
		onImage = cfg.Image
	}
	s.emit(Event{Type: EventCaptured, Sandbox: id, Template: templateName, Generation: g.ID})
	s.pushCaptured(templateName, g.ID)
	return g, nil
}

// holdForCapture returns the hooks that keep the sandbox l locks still while a capture copies
// its layer, r being what reattach found of it, and the layer to copy when it opened it (nil:
// the caller opens the stopped sandbox's layer). A stopped sandbox needs nothing, and neither
// does a paused one, which stays paused; but a paused one's own disk is still mounted by its
// launch, so its layer comes from a snapshot of that disk (a second mount of a live image
// would replay its journal under the live one; the disk's lock makes such a mount wait for
// the launch to end). A running one is frozen by the runtime's
// [runtime.Pauser], with no pause record written, and its layer opened by the runtime's
// [runtime.LiveLayerer]: a live layer keeps it frozen until the copy has read it, a snapshot
// only until the snapshot is taken. A crash of bothyd while it is frozen leaves a frozen
// sandbox without a record, which start-up thaws (the thorough [Supervisor.reconcilePause] of
// [Supervisor.ReattachAll]), as it does after a resume that crashed.
func (s *Supervisor) holdForCapture(ctx context.Context, l *store.Lock, cfg *store.Config, r reconciled) (template.CaptureHooks, *os.File, error) {
	id := l.ID()
	var none template.CaptureHooks
	switch {
	case r.state != StateRunning:
		return none, nil, nil
	case r.paused:
		return s.pausedDiskLayer(ctx, l, cfg)
	case r.mismatch:
		return none, nil, mismatchError(id)
	}
	rt, err := s.runtimeFor(cfg)
	if err != nil {
		return none, nil, err
	}
	live, ok := rt.(runtime.LiveLayerer)
	if !ok {
		return none, nil, errcode.New(errcode.SandboxLaunched, "Sandbox %s is running and the %s runtime captures stopped sandboxes only; stop it before capturing it.", id, rt.Kind())
	}
	p, err := pauserOf(rt)
	if err != nil {
		return none, nil, errcode.Wrap(errcode.SandboxLaunched, err, "Sandbox %s is running and this server cannot freeze it for a capture; stop it before capturing it.", id)
	}
	freeze := func() (time.Time, error) {
		at := time.Now()
		if err := p.Freeze(ctx, id, l.Dir()); err != nil {
			s.thawAfterCapture(ctx, p, l)
			return at, errcode.Wrap(errcode.TransitionInProgress, err, "Sandbox %s could not be frozen for its capture and runs on; retry the capture.", id)
		}
		s.crash("capture-frozen")
		return at, nil
	}
	if cfg.DiskMB == 0 && !capturesMemory(rt) {
		layer, _, err := live.OpenLiveLayer(ctx, id, l.Dir(), false)
		if err != nil {
			return none, nil, layerError(id, err)
		}
		var frozenAt time.Time
		return template.CaptureHooks{
			Hold: func() (err error) {
				frozenAt, err = freeze()
				return err
			},
			Release: func() time.Duration {
				s.thawAfterCapture(ctx, p, l)
				return time.Since(frozenAt)
			},
		}, layer, nil
	}
	// A snapshot: of the sandbox's own disk, or of a VM's memory with its disk. The sandbox
	// is frozen only until the snapshot is taken.
	var at *template.TimeContract
	if capturesMemory(rt) {
		if err := s.checkMemoryCapture(l, cfg); err != nil {
			return none, nil, err
		}
		if cfg.Template != nil {
			// The clone's disk is its writes over its generation's frozen disk, which its
			// copy in a new generation would name as its backing file; that generation holds
			// no lease on the older one, which could then be retired under it.
			return none, nil, errcode.New(errcode.NotImplemented,
				"Sandbox %s is a microVM cloned from template %s; a microVM clone's disk is kept as its changes over its generation's disk, so capturing a clone is not implemented. Capture the sandbox that generation was captured from instead.", id, cfg.Template.Template)
		}
		// The memory holds the moment it stopped: the generation's time contract is read
		// then, so that a clone's downtime (its clock's advance) counts from it.
		now, err := s.templates.Now()
		if err != nil {
			return none, nil, err
		}
		at = &now
	}
	frozenAt, err := freeze()
	if err != nil {
		return none, nil, err
	}
	layer, err := openSnapshotLayer(ctx, live, l, cfg.DiskMB > 0)
	s.thawAfterCapture(ctx, p, l)
	held := time.Since(frozenAt)
	if err != nil {
		return none, nil, s.liveLayerErr(id, err)
	}
	if capturesMemory(rt) {
		if err := s.flattenCapture(ctx, rt, layer, id); err != nil {
			layer.Close()
			return none, nil, err
		}
	}
	return template.CaptureHooks{
		Hold:    func() error { return nil },
		Release: func() time.Duration { return held },
		Time:    at,
	}, layer, nil
}

// pausedDiskLayer is [Supervisor.holdForCapture] of a paused sandbox: the layer of a
// snapshot of its own disk, which its frozen launch still has mounted, or nil (the caller
// opens the layer) when it has no disk of its own or its runtime's captures do not read the
// disk that way (a microVM's say themselves what they cannot do).
func (s *Supervisor) pausedDiskLayer(ctx context.Context, l *store.Lock, cfg *store.Config) (template.CaptureHooks, *os.File, error) {
	var none template.CaptureHooks
	if cfg.DiskMB == 0 {
		return none, nil, nil
	}
	rt, err := s.runtimeFor(cfg)
	if err != nil {
		return none, nil, err
	}
	live, ok := rt.(runtime.LiveLayerer)
	if !ok || capturesMemory(rt) {
		return none, nil, nil
	}
	layer, err := openSnapshotLayer(ctx, live, l, true)
	if err != nil {
		return none, nil, s.liveLayerErr(l.ID(), err)
	}
	return none, layer, nil
}

// openSnapshotLayer opens the layer of a snapshot of the sandbox l locks, which runs (frozen)
// under live's runtime: of its own disk if disk says it has one, or of what else the runtime
// snapshots (a microVM's memory with its disk); a live layer that is no snapshot is refused.
func openSnapshotLayer(ctx context.Context, live runtime.LiveLayerer, l *store.Lock, disk bool) (*os.File, error) {
	layer, snapshot, err := live.OpenLiveLayer(ctx, l.ID(), l.Dir(), disk)
	if err == nil && !snapshot {
		layer.Close()
		err = errors.New("the runtime has no snapshot of a sandbox's own disk")
	}
	return layer, err
}

// capturesMemory reports whether rt's captures of a running sandbox hold its memory.
func capturesMemory(rt runtime.Runtime) bool {
	m, ok := rt.(runtime.MemoryCapturer)
	return ok && m.CapturesMemory()
}

func layerError(id string, err error) error {
	if errcode.Of(err) == errcode.NotRunning {
		return err // the sandbox stopped under the capture: the runtime says so
	}
	if errors.Is(err, os.ErrNotExist) {
		return errcode.New(errcode.NotRunning, "Sandbox %s has never run, so it has nothing to capture: start it, make your changes, stop it, then capture it.", id)
	}
	return errcode.Wrap(errcode.Internal, err, "The writable layer of sandbox %s cannot be opened.", id)
}

// thawAfterCapture thaws a sandbox that a capture froze. The capture's outcome does not depend
// on it: a thaw that fails is logged, and the sandbox stays frozen until a resume (which thaws
// a sandbox without a pause record too) or the next start-up thaws it.
func (s *Supervisor) thawAfterCapture(ctx context.Context, p runtime.Pauser, l *store.Lock) {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := p.Thaw(cctx, l.ID(), l.Dir()); err != nil {
		s.log.Error("thawing a sandbox after its capture; resume it to retry", "sandbox", l.ID(), "err", err)
	}
}

// CloneRequest says which generation a new sandbox is cloned from. Image, when set, must
// match the generation's key. Resources are the limits the clone chooses, each field 0 for
// the generation's; nil takes the generation's. They must equal the generation's only under a
// runtime that pins them ([runtime.ResourcePinner]); otherwise they are no part of the
// compatibility.
type CloneRequest struct {
	Template   string
	Generation string // "" for the latest eligible, non-tombstoned generation of a matching key
	Image      string
	Resources  *store.Resources
	// Runtime, when set, must be the kind the generation was captured under; a clone runs
	// under that kind either way.
	Runtime string
	// DiskDefault says the create's disk size is the server's default, not the request's: a
	// clone of a generation of another runtime than the default (microvm) gets none.
	DiskDefault bool
}

// cloneNIC gives cfg the network interface of the generation's captured memory, when the
// clone restores memory (a clone of files alone gets a fresh one at its start), and refuses
// before anything is made a clone that restores memory and mounts volumes (a microVM's are
// virtio-fs devices, which QEMU cannot restore).
func (s *Supervisor) cloneNIC(rt runtime.Runtime, memory bool, cfg *store.Config, template, generation string) error {
	if !memory {
		return nil
	}
	if len(cfg.Volumes) > 0 {
		return errcode.New(errcode.NotImplemented,
			"A clone of template %s restores a microVM's memory, and a microVM whose memory is restored cannot mount volumes (its volumes are virtio-fs devices, which QEMU cannot restore); clone it without volumes.", template)
	}
	dir, err := s.templates.PayloadDir(template, generation)
	if err != nil {
		return err
	}
	_, err = s.restoreNIC(rt, cfg, dir)
	return err
}

// cloneResources is what a clone of a generation captured with k runs with: the fields req
// sets, the generation's for the others.
func cloneResources(k store.Resources, req *store.Resources) store.Resources {
	if req == nil {
		return k
	}
	if req.VCPUs != 0 {
		k.VCPUs = req.VCPUs
	}
	if req.MemoryMB != 0 {
		k.MemoryMB = req.MemoryMB
	}
	if req.Pids != 0 {
		k.Pids = req.Pids
	}
	return k
}

// pinsResources reports whether rt needs a clone's resources equal to its generation's.
func pinsResources(rt runtime.Runtime) bool {
	p, ok := rt.(runtime.ResourcePinner)
	return ok && p.PinsCloneResources()
}

// keyKind is the runtime kind a generation was captured under: its key's runtime identity
// begins with it ("namespace/p3/...", "microvm/p3/...").
func keyKind(k template.Key) string {
	kind, _, _ := strings.Cut(k.Runtime, "/")
	return kind
}

// Clone provisions a sandbox whose lower layer is a template generation, and leases that
// generation for as long as the sandbox exists. It follows DESIGN.md's order: the template
// store's lock, then the sandbox's lifecycle lock; check the generation and the sandbox; the
// lease record durably, then the sandbox's clone binding durably.
func (s *Supervisor) Clone(ctx context.Context, cfg store.Config, req CloneRequest) (*Status, error) {
	return s.clone(ctx, cfg, req, provisioning{})
}

// clone is [Supervisor.Clone] with what p adds.
func (s *Supervisor) clone(ctx context.Context, cfg store.Config, req CloneRequest, p provisioning) (_ *Status, err error) {
	defer s.observe("clone", time.Now(), &err)
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	if err := store.ValidateID(cfg.ID); err != nil {
		return nil, err
	}
	// The template's name is checked first, then a generation this node lacks is pulled.
	if err := s.pullMissing(ctx, req); err != nil {
		return nil, err
	}
	tx, err := s.templates.Lock(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Unlock()
	now, err := s.templates.Now()
	if err != nil {
		return nil, err
	}
	g, err := s.pickGeneration(tx, req, now)
	if err != nil {
		return nil, err
	}
	rt, err := s.cloneRuntime(&cfg, g.Key, req)
	if err != nil {
		return nil, err
	}
	memory := capturesMemory(rt)
	if err := s.cloneNIC(rt, memory, &cfg, req.Template, g.ID); err != nil {
		return nil, err
	}
	l, err := s.store.LockForProvision(ctx, cfg.ID)
	if err != nil {
		return nil, err
	}
	defer s.unlock(l)
	if err := l.RequireUnprovisioned(); err != nil {
		return nil, err
	}
	if err := template.CheckUnbound(l.Dir(), cfg.ID); err != nil {
		return nil, err
	}
	// A clone names its own volumes (none of its generation's: a capture holds none).
	if err := s.holdVolumes(cfg.ID, cfg.Volumes); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.releaseVolumes(cfg.ID, cfg.Volumes)
		}
	}()
	cfg.Format = store.ConfigFormat
	cfg.Image = g.Key.Image
	cfg.Resources = cloneResources(g.Key.Resources, req.Resources)
	if err := p.admission.admit(cfg.Resources); err != nil {
		return nil, err
	}
	cfg.Template = &store.TemplateRef{Template: req.Template, Generation: g.ID}
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
	if memory {
		// Recorded with the provision, before the lease: a crash leaves a clone that the next
		// start-up removes as an interrupted provision or one whose lease is missing.
		if err := writeRestore(l.Dir(), req.Template, g.ID); err != nil {
			s.undoProvision(ctx, l)
			return nil, err
		}
	}
	lease, err := tx.WriteLease(req.Template, g.ID, cfg.ID)
	if err == nil {
		if err = template.WriteBinding(l.Dir(), template.NewBinding(lease)); err != nil {
			// The lease without a binding is swept by the next retirement; release it now.
			_ = tx.Release(req.Template, g.ID, lease.ID)
		}
	}
	if err != nil {
		// Undo the provision: a clone without its lease must not exist.
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		if rerr := l.Deprovision(cctx); rerr != nil {
			s.log.Error("undoing a clone that could not lease its generation", "sandbox", cfg.ID, "err", rerr)
		}
		return nil, err
	}
	s.emit(Event{Type: EventCreated, Sandbox: cfg.ID, State: StateProvisioned})
	s.emit(Event{Type: EventAcquired, Sandbox: cfg.ID, Template: req.Template, Generation: g.ID, Lease: lease.ID})
	s.armLifetime(cfg.ID)
	st := &Status{Config: cfg, State: StateProvisioned, Runtime: s.kindOf(&cfg), Binding: template.NewBinding(lease)}
	st.ExpiresAt, st.OnTimeout = s.expiry(l.Dir())
	return st, nil
}

// cloneRuntime is the runtime a clone runs under, the one its generation was captured under,
// and sets cfg's runtime and disk for it; it refuses what that runtime cannot do for cfg.
func (s *Supervisor) cloneRuntime(cfg *store.Config, k template.Key, req CloneRequest) (runtime.Runtime, error) {
	rt, err := s.runtimeOf(keyKind(k))
	if err != nil {
		return nil, err
	}
	if rt != s.rt || cfg.Runtime != "" {
		cfg.Runtime = rt.Kind()
	}
	if rt != s.rt && req.DiskDefault {
		cfg.DiskMB = 0 // the server's default disk is the default runtime's (a loop-mounted image)
	}
	if err := s.checkDisk(cfg.Runtime, cfg.DiskMB); err != nil {
		return nil, err
	}
	return rt, nil
}

// checkMemoryCapture refuses the memory capture of the microVM cfg (l locks it) when it mounts
// volumes (virtio-fs devices, which QEMU cannot save). One that stands on checkpoints, or a
// fork, is captured: its snapshot's disk is made to stand on the image alone
// ([Supervisor.flattenCapture]).
func (s *Supervisor) checkMemoryCapture(l *store.Lock, cfg *store.Config) error {
	if len(cfg.Volumes) > 0 {
		return errcode.New(errcode.NotImplemented,
			"Sandbox %s is a microVM that mounts volumes; a microVM's capture saves its memory, and its volumes are virtio-fs devices, which QEMU cannot save. Capture a microVM without volumes.", l.ID())
	}
	// An interrupted checkpoint operation is finished first: the chain the snapshot reads
	// must be settled.
	_, err := s.chainLowers(l)
	return err
}

// flattenCapture makes the disk of the snapshot layer (of the microVM id, still locked and
// thawed) back onto the image's base disk alone ([runtime.SnapshotFlattener]): a microVM on
// a checkpoint chain, or a fork, has a disk that backs onto files of its own directory (its
// checkpoints' layers, its fork-state), which a generation would name without holding, and
// which a rollback, a checkpoint's delete or the sandbox's delete removes. The chain's
// clusters are copied into the snapshot's copy; the layers it reads are frozen files, which
// the lock keeps, so the VM runs on meanwhile. The snapshot is a detached tmpfs, freed with
// bothyd's descriptor, and nothing of the generation is recorded yet: a crash here leaves
// the store as a crash after the capture's thaw does.
func (s *Supervisor) flattenCapture(ctx context.Context, rt runtime.Runtime, layer *os.File, id string) error {
	f, ok := rt.(runtime.SnapshotFlattener)
	if !ok {
		return nil
	}
	if err := s.flattenSnapshot(ctx, f, layer, fmt.Sprintf("The saved disk of sandbox %s could not be made to stand on its image alone for its capture; it runs on. Retry the capture.", id)); err != nil {
		return err
	}
	s.crash("capture-flattened")
	return nil
}

// pickGeneration chooses the generation a clone leases, under the template store's lock.
func (s *Supervisor) pickGeneration(tx *template.Tx, req CloneRequest, now template.TimeContract) (*template.Generation, error) {
	if req.Generation != "" {
		g, err := tx.Leasable(req.Template, req.Generation, now)
		if err != nil {
			return nil, err
		}
		if why := s.keyMismatch(g.Key, req); why != "" {
			return nil, errcode.New(errcode.TemplateIneligible, "Generation %s of template %s cannot be cloned here: %s.", g.ID, req.Template, why)
		}
		return g, nil
	}
	gens, err := s.templates.Generations(req.Template, now)
	if err != nil {
		return nil, err
	}
	// Newest first: generation ids grow with each capture (as numbers: g1000000 is newer
	// than g999999).
	slices.SortFunc(gens, func(a, b template.Generation) int {
		switch {
		case template.NewerGeneration(a.ID, b.ID):
			return -1
		case template.NewerGeneration(b.ID, a.ID):
			return 1
		}
		return 0
	})
	var skipped []string
	for _, g := range gens {
		switch {
		case g.State != template.StateActive:
			skipped = append(skipped, fmt.Sprintf("%s is %s", g.ID, g.State))
		case g.Eligibility != template.Eligible:
			skipped = append(skipped, fmt.Sprintf("%s is %s", g.ID, g.Eligibility))
		default:
			if why := s.keyMismatch(g.Key, req); why != "" {
				skipped = append(skipped, fmt.Sprintf("%s: %s", g.ID, why))
				continue
			}
			return tx.Leasable(req.Template, g.ID, now)
		}
	}
	if len(gens) == 0 {
		return nil, errcode.New(errcode.TemplateIneligible, "Template %s has no generations; capture one first.", req.Template)
	}
	return nil, errcode.New(errcode.TemplateIneligible, "No generation of template %s can be cloned here (%s); capture a new one.", req.Template, strings.Join(skipped, "; "))
}

// keyMismatch says why a generation's key does not fit this server and the request, or "".
func (s *Supervisor) keyMismatch(k template.Key, req CloneRequest) string {
	rt, err := s.runtimeOf(keyKind(k))
	switch {
	case err != nil || k.Runtime != rt.Identity():
		return "it was captured under another bothyd build or runtime configuration"
	case req.Runtime != "" && req.Runtime != rt.Kind():
		return fmt.Sprintf("it was captured under the %s runtime, not %s", rt.Kind(), req.Runtime)
	case req.Image != "" && req.Image != k.Image:
		return fmt.Sprintf("it was captured from image %q, not %q", k.Image, req.Image)
	case pinsResources(rt) && cloneResources(k.Resources, req.Resources) != k.Resources:
		return fmt.Sprintf("the %s runtime runs a clone with its generation's resources only (%s); leave resources out", rt.Kind(), k.Resources)
	}
	if d, err := s.imageDigest(k.Image); err != nil || d != k.ImageDigest {
		return fmt.Sprintf("it was captured on image %s %s, which this server no longer holds as it was", k.Image, k.ImageDigest)
	}
	return ""
}

// cloneLowers returns the layers of a clone (its generation's payload), or nil for a sandbox
// that is not a clone.
func (s *Supervisor) cloneLowers(l *store.Lock, cfg *store.Config) ([]string, error) {
	if cfg.Template == nil {
		return nil, nil
	}
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	b, err := template.ReadBinding(l.Dir())
	if errors.Is(err, template.ErrNoBinding) {
		return nil, errcode.New(errcode.GenerationNotFound, "Sandbox %s was cloned from template %s but holds no lease (its clone was interrupted); delete it and clone again.", cfg.ID, cfg.Template.Template)
	}
	if err != nil {
		return nil, err
	}
	dir, err := s.templates.PayloadDir(b.Template, b.Generation)
	if err != nil {
		return nil, err
	}
	return []string{dir}, nil
}

// releaseBinding removes a clone's binding durably, under its lifecycle lock, and returns it,
// so that the lease is released once the lock is gone (never the template lock inside a
// sandbox lock: clones take them in the other order).
func releaseBinding(l *store.Lock) (*template.Binding, error) {
	b, err := template.ReadBinding(l.Dir())
	if errors.Is(err, template.ErrNoBinding) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return b, template.RemoveBinding(l.Dir())
}

// releaseLease releases a clone's lease after its binding is gone. A failure leaves a lease
// without binding, which retirement sweeps; it is logged, not returned.
func (s *Supervisor) releaseLease(ctx context.Context, id string, b *template.Binding) {
	if b == nil || s.templates == nil {
		return
	}
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := s.templates.Release(cctx, b.Template, b.Generation, b.Lease); err != nil {
		s.log.Warn("releasing a lease; retirement will sweep it", "sandbox", id, "lease", b.Lease, "err", err)
		return
	}
	s.emit(Event{Type: EventReleased, Sandbox: id, Template: b.Template, Generation: b.Generation, Lease: b.Lease})
	// The last lease of a draining generation finishes its retirement.
	s.releaseGenerations(ctx, b.Template, b.Generation)
	if s.generationGone(b.Template, b.Generation) {
		s.emit(Event{Type: EventRetired, Template: b.Template, Generation: b.Generation})
		s.releaseRemote(b.Template, b.Generation)
	}
}

// sweepUnboundLeases first removes what interrupted writes left in the template store (temp
// files of records, dead captures' staging), then releases the leases whose sandbox has no clone binding naming them, as
// the start-up reconciliation: a crash between a clone's lease and its binding, or between a
// removal's deprovision and its release, leaves one, which would otherwise hold its
// generation (and read as a problem to `bothyd check`) until the next retirement. Each is
// judged again under its sandbox's lock, which a clone holds from its lease to its binding,
// so a clone in flight beside the reconciliation is never swept under it; the release runs
// after that lock is let go (the template store's lock is never awaited under a sandbox's),
// which is safe because no binding is ever written for an existing lease. A removal's own
// release of the same lease afterwards finds nothing to remove. The clone left without its
// lease refuses to start, as before ("delete it and clone again").
func (s *Supervisor) sweepUnboundLeases(ctx context.Context, timeout time.Duration) {
	if s.templates == nil {
		return
	}
	bound := template.BindingChecker(s.store.Dir)
	cctx, cancel := context.WithTimeout(ctx, timeout) // the store's lock waits for a deadline
	if err := s.templates.RemoveLeftovers(cctx); err != nil {
		s.log.Warn("reattach: cannot remove what interrupted template writes left", "err", err)
	}
	problems, err := s.templates.Check(cctx, bound, false)
	cancel()
	if err != nil {
		s.log.Warn("reattach: cannot look for leases without a binding", "err", err)
		return
	}
	for _, p := range problems {
		if p.Kind != template.LeaseWithoutBinding || !s.unboundUnderLock(ctx, timeout, p) {
			continue
		}
		s.log.Warn("reattach: releasing a lease that no clone binding names (a clone or a removal was interrupted)",
			"sandbox", p.Sandbox, "template", p.Template, "generation", p.Generation, "lease", p.Lease)
		s.releaseLease(ctx, p.Sandbox, &template.Binding{Template: p.Template, Generation: p.Generation, Lease: p.Lease})
	}
}

// unboundUnderLock says whether p's sandbox, under its lock, is gone or has no binding naming
// p's lease.
func (s *Supervisor) unboundUnderLock(ctx context.Context, timeout time.Duration, p template.Problem) bool {
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l, err := s.store.LockExisting(lctx, p.Sandbox)
	if errcode.Of(err) == errcode.SandboxNotFound {
		return true
	}
	if err != nil {
		s.log.Warn("reattach: cannot lock the sandbox of a lease without a binding", "sandbox", p.Sandbox, "lease", p.Lease, "err", err)
		return false
	}
	defer s.unlock(l)
	return !template.BindingChecker(s.store.Dir)(p.Sandbox, p.Lease)
}

// Tombstone quarantines a generation: no new lease, selection skips it, clones keep working.
func (s *Supervisor) Tombstone(ctx context.Context, name, gen string) (*template.Generation, error) {
	if err := s.recordRemote(ctx, name, []string{gen}, false); err != nil {
		return nil, err
	}
	g, err := s.tombstoneLocal(ctx, name, gen)
	s.settleRemote(ctx, name, []string{gen}, false, err)
	return g, err
}

// tombstoneLocal is Tombstone on this node only.
func (s *Supervisor) tombstoneLocal(ctx context.Context, name, gen string) (*template.Generation, error) {
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	before := s.generationStates(name)
	g, err := s.templates.Tombstone(ctx, name, gen)
	if err != nil {
		return nil, err
	}
	s.emitGenerationChanges(name, before)
	return g, nil
}

// Retire retires a generation (see template.Store.Retire); with drain it finishes when the
// last lease goes. A retirement refused as leased changes nothing and emits nothing.
func (s *Supervisor) Retire(ctx context.Context, name, gen string, drain bool) (template.Outcome, error) {
	if err := s.recordRemote(ctx, name, []string{gen}, true); err != nil {
		return 0, err
	}
	out, err := s.retire(ctx, name, gen, drain)
	s.settleRemote(ctx, name, []string{gen}, true, err)
	return out, err
}

// retireLocal retires a generation on this node only, with drain: the registry's
// retirement of a generation this node holds.
func (s *Supervisor) retireLocal(ctx context.Context, name, gen string) (template.Outcome, error) {
	return s.retire(ctx, name, gen, true)
}

func (s *Supervisor) retire(ctx context.Context, name, gen string, drain bool) (template.Outcome, error) {
	if err := s.requireTemplates(); err != nil {
		return 0, err
	}
	before := s.generationStates(name)
	out, err := s.templates.Retire(ctx, name, gen, drain, s.bindingExists())
	if err == nil && out == template.Retired {
		s.releaseGenerations(ctx, name, gen)
	}
	if err == nil {
		s.emitGenerationChanges(name, before)
	}
	return out, err
}

// DeleteTemplate retires every generation of a template, then the template.
func (s *Supervisor) DeleteTemplate(ctx context.Context, name string, drain bool) (template.Outcome, error) {
	if err := s.requireTemplates(); err != nil {
		return 0, err
	}
	before := s.generationStates(name)
	gens := slices.Sorted(maps.Keys(before))
	if err := s.recordRemote(ctx, name, gens, true); err != nil {
		return 0, err
	}
	out, err := s.templates.DeleteTemplate(ctx, name, drain, s.bindingExists())
	if err == nil {
		s.releaseGenerations(ctx, name, "")
		s.emitGenerationChanges(name, before)
	}
	s.settleRemote(ctx, name, gens, true, err)
	return out, err
}

// generationStates reads the states of a template's generations, so that
// [Supervisor.emitGenerationChanges] can tell what a change did; nil when it cannot.
func (s *Supervisor) generationStates(name string) map[string]template.State {
	now, err := s.templates.Now()
	if err != nil {
		return nil
	}
	gens, err := s.templates.Generations(name, now)
	if err != nil {
		return nil
	}
	out := make(map[string]template.State, len(gens))
	for _, g := range gens {
		out[g.ID] = g.State
	}
	return out
}

// emitGenerationChanges emits the events of what a change did to the generations of a
// template that were in before: generation.tombstoned for each that was active and is
// tombstoned or retiring now (a drain), generation.retired for each that is gone. Every
// tombstone and retirement emits its event so, also those no request names: the end of a
// drain, which the release of the last lease finishes, and the generations of a deleted
// template.
func (s *Supervisor) emitGenerationChanges(name string, before map[string]template.State) {
	if len(before) == 0 {
		return
	}
	after := s.generationStates(name)
	ids := make([]string, 0, len(before))
	for id := range before {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		now, ok := after[id]
		switch {
		case !ok && after != nil, !ok && s.generationGone(name, id):
			s.emit(Event{Type: EventRetired, Template: name, Generation: id})
			s.releaseRemote(name, id)
		case ok && before[id] == template.StateActive && now != template.StateActive:
			s.emit(Event{Type: EventTombstoned, Template: name, Generation: id})
		}
	}
}
