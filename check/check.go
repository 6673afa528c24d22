package check

import (
	"context"
	"errors"
	"fmt"
	"github.com/bothy/bothy/checkpoint"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/image"
	"github.com/bothy/bothy/store/template"
	"github.com/bothy/bothy/supervisor"
)

// The kinds of problem the checker reports besides the template store's own
// (template.ProblemKind values, reported as they are).
const (
	ForeignEntry             = "foreign-entry"              // an entry nobody owns
	BadDirectory             = "bad-directory"              // a state directory that is a link, not private, or unreadable
	BadEntry                 = "bad-entry"                  // a known name of the wrong type (a link where a record should be)
	BadRecord                = "bad-record"                 // a record that does not read, or names another sandbox
	LeftoverDirectory        = "leftover-directory"         // a state directory without config.json
	StaleRecord              = "stale-runtime-record"       // runtime.json names a process that is gone
	UnmarkedProcess          = "unmarked-process"           // runtime.json names a live process that is not this sandbox's shim
	InterruptedStart         = "interrupted-start"          // launch.json without the runtime record of its launch
	CommittedJournal         = "committed-journal"          // launch.json beside the runtime record of its own launch
	UnrecordedProcess        = "unrecorded-process"         // a runtime process that no runtime record names
	LeakedMount              = "leaked-mount"               // a host mount below the state root
	LeakedCgroup             = "leaked-cgroup"              // the cgroup of a sandbox that is not running
	LeakedRuntimeFile        = "leaked-runtime-file"        // a file only a running launch needs (a microVM's control socket), of a sandbox that is not running
	StaleSharedFile          = "stale-shared-file"          // a runtime's shared asset (initramfs, base disk, a half-made build) that nothing needs
	LeakedLoop               = "leaked-loop"                // a loop device holding a disk image of a sandbox that is not running
	BindingWithoutLease      = "binding-without-lease"      // clone.json names a lease record that does not exist
	InterruptedPause         = "interrupted-pause"          // paused.json names the live launch, whose processes are not frozen
	InterruptedResume        = "interrupted-resume"         // the live launch's processes are frozen, and no paused.json says so
	StalePause               = "stale-pause-record"         // paused.json names a launch that is not running
	InTransition             = "in-transition"              // note: another process holds the sandbox's lock
	IdleSpare                = "idle-spare"                 // note: a spare that does not run, which bothyd's next start-up deletes
	TrashNote                = "trash"                      // note: deleted sandboxes' entries not yet freed, which a server frees at once
	RuntimeMismatchNote      = "runtime-mismatch"           // note: a live sandbox of another runtime identity
	TemplateStoreSkipped     = "template-store-unusable"    // the template store could not be opened
	TemplateTombstonePending = "template-tombstone-pending" // note: a tombstone made here that the template registry does not hold yet (the outbox)
	CheckpointProblem        = "checkpoint-interrupted"     // a checkpoint operation left pending, or its leftovers (package checkpoint)
	defaultLockTimeout       = 10 * time.Second
	maxReportedDirEntries    = 20
)

// Problem is one inconsistency (or, among Report.Notes, one observation that is not one).
type Problem struct {
	Kind    string `json:"kind"`
	Sandbox string `json:"sandbox,omitempty"`
	// Entry is the path at fault, relative to the state root where it lies below it.
	Entry    string `json:"entry,omitempty"`
	Detail   string `json:"detail"`
	Repaired bool   `json:"repaired,omitempty"`
}

func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.Kind)
	if p.Sandbox != "" {
		fmt.Fprintf(&b, " sandbox %s", p.Sandbox)
	}
	if p.Entry != "" {
		fmt.Fprintf(&b, " (%s)", p.Entry)
	}
	fmt.Fprintf(&b, ": %s", p.Detail)
	if p.Repaired {
		b.WriteString(" [repaired]")
	}
	return b.String()
}

// key identifies a problem across the two passes of a repair.
func (p Problem) key() string { return p.Kind + "\x00" + p.Sandbox + "\x00" + p.Entry }

// Report is the result of a check.
type Report struct {
	Root      string `json:"root"`
	Repair    bool   `json:"repair"`
	Sandboxes int    `json:"sandboxes"`
	Running   int    `json:"running"`
	// Paused counts the running sandboxes that are paused (and frozen).
	Paused int `json:"paused"`
	// Spares counts the sandboxes that are a server's spares, started ahead for creates
	// (supervisor/spares.go): no client's, and not listed by the API.
	Spares    int `json:"spares"`
	Processes int `json:"processes"`
	// Trash counts the bins in the store's trash: what deletes moved out of state directories
	// that the file system has not freed yet (store.TrashDir).
	Trash int `json:"trash"`
	// Problems are the inconsistencies found (by the first pass, with repair); Notes are
	// observations that are not inconsistencies.
	Problems []Problem `json:"problems"`
	Notes    []Problem `json:"notes"`
	// Remaining counts the problems not repaired.
	Remaining int  `json:"remaining"`
	OK        bool `json:"ok"`
}

// Options configure Run.
type Options struct {
	// Root is the state root.
	Root string
	// Runtime is the runtime the server uses, configured as the server configures it: its
	// declared entries, processes, host resources, identity and Cleanup are the checker's
	// reference.
	Runtime runtime.Runtime
	// Runtimes are the server's other runtimes (of other kinds), configured as it configures
	// them: their processes, host resources and declared entries count as the default's do,
	// and each sandbox is judged by the runtime its records name.
	Runtimes []runtime.Runtime
	// Repair fixes what is safe to fix (see the package doc).
	Repair bool
	// LockTimeout bounds each wait for a sandbox's lock during repair (default 10 s).
	LockTimeout time.Duration
	Logger      *slog.Logger
	// Network, if set, is the sandbox networks' Manager, whose leftovers are reported and
	// repaired.
	Network Network
	// Webhooks, if set, checks the webhooks' records (package webhook, through cmd/bothyd).
	Webhooks StoreCheck
	// Volumes, if set, checks the volumes (package volume, through cmd/bothyd): their
	// records, images, host mounts and loop devices below <root>/volumes, which the mounts'
	// and loops' own checks leave to it.
	Volumes StoreCheck
	// Egress, if set, checks the egress proxy's CA files (package egress, through cmd/bothyd).
	Egress StoreCheck
	// FlushTemplateOutbox, if set, pushes to the template registry, with Repair, the
	// tombstones and retirements the template store's outbox holds (a crash or a registry
	// that was down kept them from it); without it they are notes, which the server pushes
	// at its next start or sweep.
	FlushTemplateOutbox func(ctx context.Context, ts *template.Store) error
}

// Run checks the state root and, with Repair, repairs it and checks it again. An error means
// the check could not be made (a missing root, an unusable runtime); problems found are in
// the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Runtime == nil {
		return nil, errors.New("check: a runtime is required")
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = defaultLockTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(root); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("check: there is no state root directory at %s", root)
	}
	st, err := store.Open(root)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// The supervisor runs the repair's reconciliation; the names it declares to the store are
	// what a state directory may hold besides the store's own entries.
	// The image store and the template store, when there are, let it judge image references.
	imgs, ts, imgErr := openImageStores(root)
	if imgs != nil {
		defer imgs.Close()
	}
	if ts != nil {
		defer ts.Close()
	}
	sup, err := supervisor.New(supervisor.Options{Store: st, Runtime: o.Runtime, Runtimes: o.Runtimes, Images: imgs, Templates: ts, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	defer sup.Close()
	c := newChecker(o, root, st, sup)
	c.images, c.imagesErr = imgs, imgErr

	first, err := c.scan(ctx)
	if err != nil {
		return nil, err
	}
	if !o.Repair {
		return first.report(root, false), nil
	}
	c.repair(ctx, first)
	second, err := c.scan(ctx)
	if err != nil {
		return nil, err
	}
	left := map[string]bool{}
	for _, p := range second.problems {
		left[p.key()] = true
	}
	for i := range first.problems {
		if !left[first.problems[i].key()] {
			first.problems[i].Repaired = true
		}
	}
	// Anything the repair could not reach and the second pass found anew is reported too.
	seen := map[string]bool{}
	for _, p := range first.problems {
		seen[p.key()] = true
	}
	for _, p := range second.problems {
		if !seen[p.key()] {
			first.problems = append(first.problems, p)
		}
	}
	r := first.report(root, true)
	r.Sandboxes, r.Running, r.Spares, r.Processes, r.Trash = second.sandboxes, second.running, second.spares, len(second.procs), second.trash
	r.Notes = second.notes
	return r, nil
}

type checker struct {
	o    Options
	root string
	st   *store.Store
	sup  *supervisor.Supervisor
	// owners are the runtimes that listed each process of the last scan.
	owners map[platform.ProcessID]runtime.Runtime
	// own are the store's own entries, records those of them whose temp names are the
	// store's, and declared the names the supervisor declares to the store, with their kinds.
	own      []string
	records  []string
	declared map[string]store.EntryKind
	// images is the image store (nil when there is none, or imagesErr says why it is
	// unusable).
	images    *image.Store
	imagesErr error
}

func newChecker(o Options, root string, st *store.Store, sup *supervisor.Supervisor) *checker {
	c := &checker{o: o, root: root, st: st, sup: sup,
		own: store.OwnNames(), records: store.RecordNames(), declared: map[string]store.EntryKind{}}
	for _, d := range supervisor.DeclaredEntries(c.runtimes()...) {
		c.declared[d.Name] = d.Kind
	}
	return c
}

// sandboxState is what one pass learnt of one state directory.
type sandboxState struct {
	id          string
	dir         string
	busy        bool // another process held the lock
	provisioned bool
	rec         *store.RuntimeRecord
	alive       bool // rec names a live process
}

// pass is one scan's findings.
type pass struct {
	problems  []Problem
	notes     []Problem
	sandboxes int
	running   int
	paused    int
	spares    int
	trash     int
	states    map[string]*sandboxState // by directory
	procs     []runtime.Process
	// unrecorded, leaked (host resources: cgroups, files only a running launch needs) and
	// leakedMounts are what repair acts on, by sandbox id.
	unrecorded   []runtime.Process
	leaked       map[string]bool
	leakedMounts map[string]bool
	leftovers    []string
}

func (p *pass) add(kind, sandbox, entry, format string, args ...any) {
	p.problems = append(p.problems, Problem{Kind: kind, Sandbox: sandbox, Entry: entry, Detail: fmt.Sprintf(format, args...)})
}

func (p *pass) note(kind, sandbox, entry, format string, args ...any) {
	p.notes = append(p.notes, Problem{Kind: kind, Sandbox: sandbox, Entry: entry, Detail: fmt.Sprintf(format, args...)})
}

func (p *pass) report(root string, repair bool) *Report {
	r := &Report{Root: root, Repair: repair, Sandboxes: p.sandboxes, Running: p.running, Paused: p.paused, Spares: p.spares, Processes: len(p.procs),
		Trash: p.trash, Problems: p.problems, Notes: p.notes}
	if r.Problems == nil {
		r.Problems = []Problem{}
	}
	if r.Notes == nil {
		r.Notes = []Problem{}
	}
	for _, pr := range r.Problems {
		if !pr.Repaired {
			r.Remaining++
		}
	}
	r.OK = r.Remaining == 0
	return r
}

func (c *checker) rel(path string) string {
	if r, err := filepath.Rel(c.root, path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return path
}

// scan makes one read-only pass over the state root.
func (c *checker) scan(ctx context.Context) (*pass, error) {
	p := &pass{states: map[string]*sandboxState{}, leaked: map[string]bool{}, leakedMounts: map[string]bool{}}
	// Processes first: see the package doc.
	if err := c.listProcesses(p); err != nil {
		return nil, err
	}
	sbxPath := filepath.Join(c.root, store.SandboxesDir)
	sbx, err := platform.OpenDir(sbxPath)
	if err != nil {
		return nil, fmt.Errorf("check: open %s: %w", sbxPath, err)
	}
	defer sbx.Close()
	names, err := platform.ReadDirNames(sbx)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	for _, name := range names {
		entry := filepath.Join(store.SandboxesDir, name)
		st, err := platform.LstatAt(sbx, name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			p.add(BadEntry, "", entry, "cannot stat it: %v", err)
			continue
		}
		if store.ValidateID(name) != nil {
			p.add(ForeignEntry, "", entry, "not a valid sandbox id; the store never makes this name")
			continue
		}
		if !st.IsDir() {
			p.add(BadDirectory, name, entry, "a state directory must be a directory, and this is a %v", st.Mode.Type())
			continue
		}
		c.checkSandbox(sbx, name, p)
	}
	c.checkProcesses(p)
	c.checkMounts(p)
	c.checkHostResources(p)
	c.checkShared(p, false)
	c.checkLoops(p)
	c.checkTemplates(ctx, p)
	c.checkImages(ctx, p, false)
	c.checkNetwork(p)
	c.checkTrash(p)
	c.checkWebhooks(p, false)
	c.checkVolumes(p, false)
	c.checkIdempotency(p, false)
	c.checkSecrets(p, false)
	c.checkEgress(p, false)
	return p, nil
}

// checkTrash counts the trash's bins. They are no inconsistency: a running server frees them
// right after each delete, a server's start-up frees what a crash left, and so does --repair.
func (c *checker) checkTrash(p *pass) {
	bins, err := c.st.TrashBins()
	if err != nil {
		p.add(BadDirectory, "", store.TrashDir, "cannot read the trash: %v", err)
		return
	}
	p.trash = len(bins)
	if p.trash > 0 {
		p.note(TrashNote, "", store.TrashDir, "%d deleted sandboxes' entries are not freed yet; a running server frees them at once, its next start-up or --repair does", p.trash)
	}
}

// checkSandbox examines one state directory, holding its lock if nobody else does.
func (c *checker) checkSandbox(sbx *os.File, id string, p *pass) {
	dirPath := filepath.Join(c.root, store.SandboxesDir, id)
	entry := c.rel(dirPath)
	s := &sandboxState{id: id, dir: dirPath}
	p.states[dirPath] = s
	dir, err := platform.OpenDirAt(sbx, id)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		p.add(BadDirectory, id, entry, "cannot open it without following a link: %v", err)
		return
	}
	defer dir.Close()
	checkPrivate(dir, id, entry, p)
	if lf := tryLock(dir, s); lf != nil {
		defer lf.Close() // closing releases the lock
	}
	c.checkEntries(dir, id, entry, p)
	recs := c.readRecords(id, entry, p)
	if s.busy {
		noteBusy(s, recs.rec, entry, p)
		return
	}
	checkConfig(s, recs, entry, p)
	c.checkRuntimeRecord(s, recs.rec, entry, p)
	c.checkPause(s, entry, p)
	if recs.cfg != nil && recs.cfg.Spare {
		p.spares++
		if !s.alive {
			p.note(IdleSpare, id, entry, "a spare that does not run; the next start-up of bothyd deletes it")
		}
	}
	checkJournal(id, recs, entry, p)
	checkCheckpoints(dirPath, id, entry, p)
	if recs.cfg != nil {
		c.checkBinding(id, entry, p)
	}
}

// checkPrivate reports a state directory that is not private to bothyd's user.
func checkPrivate(dir *os.File, id, entry string, p *pass) {
	if fst, err := platform.StatOf(dir); err == nil {
		if fst.UID != uint32(os.Geteuid()) || fst.Mode.Perm() != 0o700 {
			p.add(BadDirectory, id, entry, "not private to bothyd's user: owner %d, mode %v (want %d, 0700)", fst.UID, fst.Mode.Perm(), os.Geteuid())
		}
	}
}

// tryLock tries the lifecycle lock once: while another holds it, a transition is changing the
// records, and they are noted rather than judged (s.busy). It returns the lock file, which
// the caller closes when done (releasing the lock if it got it), or nil if there is none.
func tryLock(dir *os.File, s *sandboxState) *os.File {
	lf, err := platform.OpenFileAt(dir, store.LockName, os.O_RDONLY, 0)
	if err != nil {
		return nil
	}
	if got, err := platform.TryLock(lf); err == nil && !got {
		s.busy = true
	}
	return lf
}

// records are a state directory's records as one pass read them; a record that is missing
// is nil, and one that does not read is reported and nil.
type records struct {
	cfg     *store.Config
	cfgErr  error // config.json does not read (it is not missing)
	journal *store.LaunchJournal
	rec     *store.RuntimeRecord
}

// readRecords reads the store's records of a sandbox without its lock, reporting those that
// do not read.
func (c *checker) readRecords(id, entry string, p *pass) records {
	cfg, cerr := c.st.ReadConfigUnlocked(id)
	if errcode.Of(cerr) == errcode.SandboxNotFound {
		cfg, cerr = nil, nil // no config.json
	}
	journal, jerr := c.st.ReadLaunchJournalUnlocked(id)
	rec, rerr := c.st.ReadRuntimeRecordUnlocked(id)
	for _, r := range []struct {
		name string
		err  error
	}{{store.ConfigName, cerr}, {store.LaunchName, jerr}, {store.RuntimeName, rerr}} {
		if r.err != nil && errcode.Of(r.err) != errcode.SandboxNotFound {
			p.add(BadRecord, id, filepath.Join(entry, r.name), "does not read: %v", r.err)
		}
	}
	if _, err := c.st.ReadOutcomeUnlocked(id); err != nil && errcode.Of(err) != errcode.SandboxNotFound {
		p.add(BadRecord, id, filepath.Join(entry, store.OutcomeName), "does not read: %v", err)
	}
	return records{cfg: cfg, cfgErr: cerr, journal: journal, rec: rec}
}

// noteBusy notes a sandbox in a transition, counting it, and as running if its runtime record
// names a live process.
func noteBusy(s *sandboxState, rec *store.RuntimeRecord, entry string, p *pass) {
	p.note(InTransition, s.id, entry, "another process holds the lifecycle lock; its records are changing and were not judged")
	p.sandboxes++
	if rec != nil && platformID(rec).Alive() {
		s.rec, s.alive = rec, true
		p.running++
	}
}

// checkConfig reports a state directory without config.json, and a config.json that names
// another sandbox.
func checkConfig(s *sandboxState, recs records, entry string, p *pass) {
	switch {
	case recs.cfg == nil && recs.cfgErr == nil:
		s.provisioned = false
		p.leftovers = append(p.leftovers, s.id)
		p.add(LeftoverDirectory, s.id, entry, "a state directory without config.json (an interrupted provision or removal)")
	case recs.cfg != nil:
		s.provisioned = true
		p.sandboxes++
		if recs.cfg.ID != s.id {
			p.add(BadRecord, s.id, filepath.Join(entry, store.ConfigName), "names sandbox %q, not its directory's %q", recs.cfg.ID, s.id)
		}
	}
}

// checkRuntimeRecord reports a runtime record whose process is gone, or is not the sandbox's
// runtime process, and notes one of another runtime identity.
func (c *checker) checkRuntimeRecord(s *sandboxState, rec *store.RuntimeRecord, entry string, p *pass) {
	if rec == nil {
		return
	}
	s.rec = rec
	proc := platformID(rec)
	re := filepath.Join(entry, store.RuntimeName)
	if !proc.Alive() {
		p.add(StaleRecord, s.id, re, "names runtime process %s, which is gone", proc)
		return
	}
	s.alive = true
	p.running++
	if !isShimOf(p.procs, proc, s.dir) && !c.shimNow(s, proc) {
		p.add(UnmarkedProcess, s.id, re, "names live process %s, which is not this sandbox's runtime process", proc)
	}
	if want := c.identityOf(rec.RuntimeKind); rec.RuntimeID != want {
		p.note(RuntimeMismatchNote, s.id, entry, "runs under runtime %s, not this bothyd's %s; a forced stop ends it", rec.RuntimeID, want)
	}
}

// checkPause reports a pause record and a freezer state that disagree (a pause or resume
// that a crash interrupted between its two steps, which the next transition on the sandbox
// or the next start-up of bothyd finishes), and a pause record of a launch that is not
// running; it counts the paused sandboxes.
func (c *checker) checkPause(s *sandboxState, entry string, p *pass) {
	launch := ""
	if s.alive {
		launch = s.rec.LaunchID
	}
	f, err := supervisor.InspectPause(c.sandboxRuntime(s), s.id, s.dir, launch)
	pe := filepath.Join(entry, supervisor.PausedName)
	switch {
	case err != nil:
		p.add(BadRecord, s.id, pe, "the pause state does not read: %v", err)
	case f.Stale:
		p.add(StalePause, s.id, pe, "names a launch that is not running; the next transition on the sandbox removes it")
	case f.Recorded && f.Frozen:
		p.paused++
	case f.Recorded:
		p.add(InterruptedPause, s.id, pe, "the sandbox is recorded paused but its processes are not frozen; the next transition on it, or bothyd's start-up, freezes them")
	case f.Frozen:
		p.add(InterruptedResume, s.id, entry, "the sandbox's processes are frozen but no pause is recorded; the next transition on it, or bothyd's start-up, thaws them")
	}
}

// shimNow looks for proc as s's shim in a fresh listing of its runtime's processes: a start
// beside the check can make its shim after the listing the pass holds and record it before
// the check reads the sandbox's records, which is no problem (the faster starts got, the more
// often a check beside a server met this).
func (c *checker) shimNow(s *sandboxState, proc platform.ProcessID) bool {
	procs, err := c.sandboxRuntime(s).Processes(c.root)
	return err == nil && isShimOf(procs, proc, s.dir)
}

// isShimOf says whether procs has proc as the shim of the state directory dir.
func isShimOf(procs []runtime.Process, proc platform.ProcessID, dir string) bool {
	return slices.ContainsFunc(procs, func(pr runtime.Process) bool {
		return pr.Role == runtime.RoleShim && pr.ID == proc && pr.Dir == dir
	})
}

// checkJournal reports a launch journal: one beside the runtime record of its own launch
// committed, any other never did.
func checkJournal(id string, recs records, entry string, p *pass) {
	j := recs.journal
	if j == nil {
		return
	}
	if recs.rec != nil && recs.rec.LaunchID == j.LaunchID {
		p.add(CommittedJournal, id, filepath.Join(entry, store.LaunchName), "the launch %s committed, but its journal was not removed", j.LaunchID)
	} else {
		p.add(InterruptedStart, id, filepath.Join(entry, store.LaunchName), "launch %s (pid %d) never committed", j.LaunchID, j.Pid)
	}
}

// checkEntries reports the entries of a state directory that nobody owns, or that have the
// wrong type.
func (c *checker) checkEntries(dir *os.File, id, entry string, p *pass) {
	names, err := platform.ReadDirNames(dir)
	if err != nil {
		p.add(BadDirectory, id, entry, "cannot list it: %v", err)
		return
	}
	slices.Sort(names)
	foreign := 0
	for _, n := range names {
		st, err := platform.LstatAt(dir, n)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			p.add(BadEntry, id, filepath.Join(entry, n), "cannot stat it: %v", err)
			continue
		}
		switch {
		case slices.Contains(c.own, n):
			if !st.IsRegular() {
				p.add(BadEntry, id, filepath.Join(entry, n), "a store record must be a regular file, and this is a %v", st.Mode.Type())
			}
		case c.declared[n] == store.EntryFile:
			if !st.IsRegular() {
				p.add(BadEntry, id, filepath.Join(entry, n), "declared as a file, and this is a %v", st.Mode.Type())
			}
		case c.declared[n] == store.EntryDir:
			if !st.IsDir() {
				p.add(BadEntry, id, filepath.Join(entry, n), "declared as a directory, and this is a %v", st.Mode.Type())
			}
		case c.ownTemp(n), strings.HasPrefix(n, ".nfs"):
			// A durable write's temp name (its owner removes it once no write can be in
			// flight), or a removed file that NFS keeps while someone holds it open.
		default:
			foreign++
			if foreign <= maxReportedDirEntries {
				p.add(ForeignEntry, id, filepath.Join(entry, n), "neither the store's nor declared to it; a removal will refuse (foreign-files) until it is moved away")
			}
		}
	}
	if foreign > maxReportedDirEntries {
		p.add(ForeignEntry, id, entry, "%d more foreign entries", foreign-maxReportedDirEntries)
	}
}

// ownTemp says whether n is the temp name of a durable write of a store record or of a
// declared file.
func (c *checker) ownTemp(n string) bool {
	target, ok := platform.IsTempName(n)
	return ok && (slices.Contains(c.records, target) || c.declared[target] == store.EntryFile)
}

// checkBinding checks that a clone's binding names a lease record that exists. The lease is
// written before the binding and removed after it, so a binding without its lease is never a
// moment of a transition.
func (c *checker) checkBinding(id, entry string, p *pass) {
	dir := filepath.Join(c.root, store.SandboxesDir, id)
	b, err := template.ReadBinding(dir)
	if errors.Is(err, template.ErrNoBinding) {
		return
	}
	be := filepath.Join(entry, template.BindingFile)
	if err != nil {
		p.add(BadRecord, id, be, "does not read: %v", err)
		return
	}
	ts, err := template.Open(c.root, template.Options{})
	if err != nil {
		p.add(BindingWithoutLease, id, be, "names lease %s of %s/%s, and the template store cannot be opened: %v", b.Lease, b.Template, b.Generation, err)
		return
	}
	defer ts.Close()
	leases, err := ts.Leases(b.Template, b.Generation)
	if err != nil && errcode.Of(err) != errcode.TemplateNotFound && errcode.Of(err) != errcode.GenerationNotFound {
		p.add(BadRecord, id, be, "the leases of %s/%s do not read: %v", b.Template, b.Generation, err)
		return
	}
	for _, l := range leases {
		if l.ID == b.Lease {
			return
		}
	}
	p.add(BindingWithoutLease, id, be, "names lease %s of %s/%s, which does not exist: the generation could be retired under this clone", b.Lease, b.Template, b.Generation)
}

// checkProcesses reports runtime processes that no runtime record names.
func (c *checker) checkProcesses(p *pass) {
	for _, pr := range p.procs {
		if !pr.ID.Alive() {
			continue // ended since it was listed (an abandoned launch, a stop)
		}
		s := p.states[pr.Dir]
		if s != nil && s.busy {
			continue
		}
		if s != nil && s.alive {
			rp := platformID(s.rec)
			if pr.Role == runtime.RoleShim && pr.ID == rp {
				continue
			}
			if pr.Role == runtime.RoleInit {
				if ppid, err := platform.ParentPid(pr.ID.Pid); err == nil && ppid == rp.Pid {
					continue
				}
			}
		}
		id := ""
		if s != nil {
			id = s.id
		}
		p.unrecorded = append(p.unrecorded, pr)
		p.add(UnrecordedProcess, id, c.rel(pr.Dir), "runtime process (%s) %s runs, and no runtime record names it", pr.Role, pr.ID)
	}
}

// checkMounts reports host mounts below the state root. The runtime mounts only inside each
// sandbox's own mount namespace, so any is a leak (or an operator's doing).
func (c *checker) checkMounts(p *pass) {
	points, err := platform.MountsUnder(c.root)
	if err != nil {
		p.note(LeakedMount, "", "", "cannot read the host's mounts: %v", err)
		return
	}
	sbxDir := filepath.Join(c.root, store.SandboxesDir) + "/"
	for _, mp := range points {
		if mp == c.root {
			continue // the state root may well be a volume of its own
		}
		if c.o.Volumes != nil && strings.HasPrefix(mp, filepath.Join(c.root, volumesDir)+"/") {
			continue // the volumes' host mounts: their own check judges them
		}
		id := ""
		if rest, ok := strings.CutPrefix(mp, sbxDir); ok {
			id, _, _ = strings.Cut(rest, "/")
			if store.ValidateID(id) != nil {
				id = ""
			}
		}
		if id != "" {
			p.leakedMounts[id] = true
		}
		p.add(LeakedMount, id, c.rel(mp), "a host mount below the state root; sandboxes mount only in their own namespaces")
	}
}

// checkLoops reports loop devices whose backing file lies under the state root while no
// sandbox runs there to use it: a sandbox's disk is attached by its shim with autoclear, so
// the device goes with the sandbox's root, and one left means something else holds it (a
// mount in another namespace). A device may still be going: a launch's releaser shuts its
// root down after the launch has ended (runtime/namespace/shim, release_linux.go), so a
// device is reported only once it is still there after loopReleaseGrace. It is not
// repaired: detaching a device that is mounted would fail, and whoever holds it must let go
// first.
func (c *checker) checkLoops(p *pass) {
	files, err := platform.LoopBackingFiles()
	if err != nil {
		return // no /sys/block: no loop devices to look at
	}
	type leak struct{ id, rest string }
	leaks := map[string]leak{}
	for dev, f := range files {
		f = strings.TrimSuffix(f, " (deleted)")
		rest, ok := strings.CutPrefix(f, c.root+"/")
		if !ok || c.o.Volumes != nil && strings.HasPrefix(rest, volumesDir+"/") {
			continue // not this root's, or a volume's: their own check judges them
		}
		id := ""
		if r, ok := strings.CutPrefix(rest, store.SandboxesDir+"/"); ok {
			id, _, _ = strings.Cut(r, "/")
			dir := filepath.Join(c.root, store.SandboxesDir, id)
			if s := p.states[dir]; s != nil && (s.busy || s.alive) || !c.stillIdle(dir, id) {
				continue // in a transition, or running (or being captured): its disk is in use
			}
			if slices.ContainsFunc(p.unrecorded, func(pr runtime.Process) bool { return pr.Dir == dir }) {
				continue // its unrecorded processes use it, and ending them (a repair) releases it
			}
		}
		leaks[dev] = leak{id, rest}
	}
	if len(leaks) == 0 {
		return
	}
	_, _ = platform.Poll(loopReleaseGrace, 100*time.Millisecond, nil, func() (bool, error) {
		now, err := platform.LoopBackingFiles()
		if err != nil {
			return true, nil
		}
		for dev := range leaks {
			if now[dev] != files[dev] {
				delete(leaks, dev) // released, or a device of something else since
			}
		}
		return len(leaks) == 0, nil
	})
	for _, dev := range slices.Sorted(maps.Keys(leaks)) {
		l := leaks[dev]
		p.add(LeakedLoop, l.id, l.rest, "loop device /dev/%s holds it while no sandbox runs there; find what mounts it (findmnt /dev/%s in every mount namespace) and unmount it", dev, dev)
	}
}

// loopReleaseGrace is how long checkLoops lets a loop device of a sandbox that ended go
// before it reports it: a release takes milliseconds as a rule.
const loopReleaseGrace = 5 * time.Second

// checkHostResources reports what the runtimes hold for this root's sandboxes that are not
// running (Runtime.HostResources): cgroups, and files only a running launch needs. Those of
// other state roots are not among them.
func (c *checker) checkHostResources(p *pass) {
	found, err := c.hostResources()
	if err != nil {
		p.note(LeakedCgroup, "", "", "cannot find the cgroup hierarchy: %v", err)
		return
	}
	slices.SortStableFunc(found, func(a, b runtime.HostResource) int { return strings.Compare(a.SandboxID, b.SandboxID) })
	for _, res := range found {
		kind, what := LeakedCgroup, "the cgroup of a sandbox that is not running"
		switch res.Kind {
		case runtime.ResourceCgroup:
		case runtime.ResourceFile:
			kind, what = LeakedRuntimeFile, "a file that only a running launch needs, of a sandbox that is not running"
		default:
			continue
		}
		if store.ValidateID(res.SandboxID) != nil {
			continue
		}
		id, dir := res.SandboxID, res.Dir
		s := p.states[dir]
		if s == nil {
			// It names this root's state directory, which was not there when the directories
			// were read: a sandbox deleted without it, unless one of that id was provisioned
			// since.
			if _, err := os.Lstat(dir); err == nil {
				continue
			}
		} else if s.busy || s.alive || !c.stillLeaked(res) {
			continue // in a transition, or running
		}
		p.leaked[id] = true
		p.add(kind, id, res.Name, "%s", what)
	}
}

// checkShared reports (and with repair removes) the shared assets of every runtime that keeps
// some in the host base directory (runtime.SharedFiles) that nothing needs any more.
func (c *checker) checkShared(p *pass, repair bool) {
	base := c.sup.HostBase()
	for _, rt := range c.runtimes() {
		sf, ok := rt.(runtime.SharedFiles)
		if !ok {
			continue
		}
		stale, err := sf.StaleShared(base, filepath.Join(c.root, store.SandboxesDir), repair)
		if err != nil {
			if repair {
				c.o.Logger.Error("check: remove stale shared files", "runtime", rt.Kind(), "err", err)
			} else {
				p.note(StaleSharedFile, "", c.rel(base), "the %s runtime could not look at its shared files: %v", rt.Kind(), err)
			}
		}
		for _, f := range stale {
			switch {
			case repair:
				c.o.Logger.Warn("check: removed a stale shared file", "runtime", rt.Kind(), "file", filepath.Join(base, f.Name), "why", f.Why)
			case f.Note:
				p.note(StaleSharedFile, "", c.rel(filepath.Join(base, f.Name)), "%s (kept: %s runtime)", f.Why, rt.Kind())
			default:
				p.add(StaleSharedFile, "", c.rel(filepath.Join(base, f.Name)), "%s (%s runtime)", f.Why, rt.Kind())
			}
		}
	}
}

// stillIdle looks again, under the sandbox's lifecycle lock, at a sandbox that was not running
// when its directory was examined: a start may have come since. It is idle if the lock is free
// and no runtime process of the sandbox lives.
func (c *checker) stillIdle(dir, id string) bool {
	lf, err := platform.OpenFile(filepath.Join(dir, store.LockName), os.O_RDONLY, 0)
	if err != nil {
		return true // no lock file: no transition can be under way
	}
	defer lf.Close() // closing releases the lock
	if got, err := platform.TryLock(lf); err != nil || !got {
		return false // a transition holds it now
	}
	rec, err := c.st.ReadRuntimeRecordUnlocked(id)
	return !(err == nil && rec != nil && platformID(rec).Alive())
}

// stillLeaked says whether a host resource of a sandbox that was not running is still there
// while the sandbox is idle.
func (c *checker) stillLeaked(res runtime.HostResource) bool {
	if !c.stillIdle(res.Dir, res.SandboxID) {
		return false
	}
	return slices.ContainsFunc(res.Paths, func(path string) bool {
		_, err := os.Lstat(path)
		return err == nil
	})
}

// checkTemplates runs the template store's own check (read-only).
func (c *checker) checkTemplates(ctx context.Context, p *pass) {
	if _, err := os.Lstat(filepath.Join(c.root, template.TemplatesDir)); errors.Is(err, fs.ErrNotExist) {
		return // no template was ever made; do not create the directory for a check
	}
	ts, err := template.Open(c.root, template.Options{})
	if err != nil {
		p.add(TemplateStoreSkipped, "", template.TemplatesDir, "cannot open the template store: %v", err)
		return
	}
	defer ts.Close()
	lctx, cancel := context.WithTimeout(ctx, c.o.LockTimeout)
	defer cancel()
	probs, err := ts.Check(lctx, template.BindingChecker(c.st.Dir), false)
	if err != nil {
		p.add(TemplateStoreSkipped, "", template.TemplatesDir, "the template store's check failed: %v", err)
		return
	}
	for _, tp := range probs {
		p.problems = append(p.problems, Problem{Kind: string(tp.Kind), Sandbox: tp.Sandbox,
			Entry: filepath.Join(template.TemplatesDir, tp.Entry), Detail: tp.Detail})
	}
	pending, err := ts.RemoteTombstones()
	if err != nil {
		p.add(TemplateStoreSkipped, "", template.TemplatesDir, "cannot read the template store's outbox: %v", err)
		return
	}
	for _, r := range pending {
		what := "tombstone"
		if r.Retire {
			what = "retirement"
		}
		p.note(TemplateTombstonePending, "", filepath.Join(template.TemplatesDir, template.OutboxDir),
			"the %s of generation %s of template %s (made %s) is not yet in the template registry; bothyd pushes it at its next start or sweep, or check --repair --template-registry now",
			what, r.Generation, r.Template, r.At.Format(time.RFC3339))
	}
}

func platformID(rec *store.RuntimeRecord) platform.ProcessID {
	return platform.ProcessID{Pid: rec.Pid, StartTime: rec.PidStartTime, BootID: rec.BootID}
}

// checkCheckpoints reports what package checkpoint finds in the sandbox's checkpoints: an
// operation a crash interrupted, leftovers, a layer a chain names and that is missing. The
// repair's reattach finishes or undoes the first two.
func checkCheckpoints(dir, id, entry string, p *pass) {
	problems, err := (&checkpoint.Sandbox{Dir: dir}).Problems()
	if err != nil {
		p.add(CheckpointProblem, id, filepath.Join(entry, checkpoint.DirName), "cannot read the checkpoints: %v", err)
		return
	}
	for _, pr := range problems {
		p.add(CheckpointProblem, id, filepath.Join(entry, checkpoint.DirName), "%s", pr)
	}
}
