package check

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/runtime/namespace/shim"

	"github.com/sandboxd/sandboxd/errcode"
	"github.com/sandboxd/sandboxd/platform"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/store/template"
	"github.com/sandboxd/sandboxd/supervisor"
)

// The kinds of problem the checker reports besides the template store's own
// (template.ProblemKind values, reported as they are).
const (
	ForeignEntry          = "foreign-entry"           // an entry nobody owns
	BadDirectory          = "bad-directory"           // a state directory that is a link, not private, or unreadable
	BadEntry              = "bad-entry"               // a known name of the wrong type (a link where a record should be)
	BadRecord             = "bad-record"              // a record that does not read, or names another sandbox
	LeftoverDirectory     = "leftover-directory"      // a state directory without config.json
	StaleRecord           = "stale-runtime-record"    // runtime.json names a process that is gone
	UnmarkedProcess       = "unmarked-process"        // runtime.json names a live process that is not this sandbox's shim
	InterruptedStart      = "interrupted-start"       // launch.json without the runtime record of its launch
	CommittedJournal      = "committed-journal"       // launch.json beside the runtime record of its own launch
	UnrecordedProcess     = "unrecorded-process"      // a runtime process that no runtime record names
	LeakedMount           = "leaked-mount"            // a host mount below the state root
	LeakedCgroup          = "leaked-cgroup"           // the cgroup of a sandbox that is not running
	LeakedLoop            = "leaked-loop"             // a loop device holding a disk image of a sandbox that is not running
	BindingWithoutLease   = "binding-without-lease"   // clone.json names a lease record that does not exist
	InTransition          = "in-transition"           // note: another process holds the sandbox's lock
	RuntimeMismatchNote   = "runtime-mismatch"        // note: a live sandbox of another runtime identity
	TemplateStoreSkipped  = "template-store-unusable" // the template store could not be opened
	defaultCgroupParent   = "sandboxd"
	defaultLockTimeout    = 10 * time.Second
	maxReportedDirEntries = 20
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
	Processes int    `json:"processes"`
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
	// Runtime is the runtime the server uses (the namespace runtime); its declared entries,
	// process marker, identity and Cleanup are the checker's reference.
	Runtime runtime.Runtime
	// CgroupParent is the cgroup below which the runtime makes sandbox cgroups; "" means the
	// namespace runtime's default, "sandboxd".
	CgroupParent string
	// Repair fixes what is safe to fix (see the package doc).
	Repair bool
	// LockTimeout bounds each wait for a sandbox's lock during repair (default 10 s).
	LockTimeout time.Duration
	Logger      *slog.Logger
}

// Run checks the state root and, with Repair, repairs it and checks it again. An error means
// the check could not be made (a missing root, an unusable runtime); problems found are in
// the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Runtime == nil {
		return nil, errors.New("check: a runtime is required")
	}
	if o.CgroupParent == "" {
		o.CgroupParent = defaultCgroupParent
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
	// supervisor.New declares the names it and its runtime keep in state directories; the
	// checker learns them from the same source (see declaredNames).
	sup, err := supervisor.New(supervisor.Options{Store: st, Runtime: o.Runtime, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	defer sup.Close()
	c := &checker{o: o, root: root, st: st, sup: sup, rt: o.Runtime, declared: declaredNames(o.Runtime), probed: map[string]bool{}}

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
	r.Sandboxes, r.Running, r.Processes = second.sandboxes, second.running, len(second.procs)
	r.Notes = second.notes
	return r, nil
}

// declaredNames are the names that supervisor.New declares to the store, with their kinds:
// the supervisor's own (exported constants), the clone binding, and the runtime's
// DeclaredEntries. A name missing here is still recognised as declared by asking the store
// (see isDeclared), so this list only adds the kinds.
func declaredNames(rt runtime.Runtime) map[string]store.EntryKind {
	m := map[string]store.EntryKind{}
	for _, n := range []string{supervisor.ExecLockName, supervisor.CapabilityName, template.BindingFile, supervisor.LogName} {
		m[n] = store.EntryFile
	}
	for _, e := range rt.DeclaredEntries() {
		if e.Dir {
			m[e.Name] = store.EntryDir
		} else {
			m[e.Name] = store.EntryFile
		}
	}
	return m
}

// storeRecords are the store's own regular files.
var storeRecords = []string{store.LockName, store.ConfigName, store.LaunchName, store.RuntimeName, store.OutcomeName}

type checker struct {
	o        Options
	root     string
	st       *store.Store
	sup      *supervisor.Supervisor
	rt       runtime.Runtime
	declared map[string]store.EntryKind
	probed   map[string]bool // isDeclared's verdicts
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
	states    map[string]*sandboxState // by directory
	procs     []runtime.Process
	// unrecorded, leakedCgroups and leakedMounts are what repair acts on, by sandbox id.
	unrecorded    []runtime.Process
	leakedCgroups map[string]bool
	leakedMounts  map[string]bool
	leftovers     []string
}

func (p *pass) add(kind, sandbox, entry, format string, args ...any) {
	p.problems = append(p.problems, Problem{Kind: kind, Sandbox: sandbox, Entry: entry, Detail: fmt.Sprintf(format, args...)})
}

func (p *pass) note(kind, sandbox, entry, format string, args ...any) {
	p.notes = append(p.notes, Problem{Kind: kind, Sandbox: sandbox, Entry: entry, Detail: fmt.Sprintf(format, args...)})
}

func (p *pass) report(root string, repair bool) *Report {
	r := &Report{Root: root, Repair: repair, Sandboxes: p.sandboxes, Running: p.running, Processes: len(p.procs),
		Problems: p.problems, Notes: p.notes}
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
	p := &pass{states: map[string]*sandboxState{}, leakedCgroups: map[string]bool{}, leakedMounts: map[string]bool{}}
	// Processes first: see the package doc.
	procs, err := c.rt.Processes(c.root)
	if err != nil {
		return nil, fmt.Errorf("check: list runtime processes: %w", err)
	}
	p.procs = procs
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
	c.checkCgroups(p)
	c.checkLoops(p)
	c.checkTemplates(ctx, p)
	return p, nil
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
	if fst, err := platform.StatOf(dir); err == nil {
		if fst.UID != uint32(os.Geteuid()) || fst.Mode.Perm() != 0o700 {
			p.add(BadDirectory, id, entry, "not private to sandboxd's user: owner %d, mode %v (want %d, 0700)", fst.UID, fst.Mode.Perm(), os.Geteuid())
		}
	}
	// Try the lifecycle lock once: while another holds it, a transition is changing the
	// records, and they are noted rather than judged.
	if lf, err := platform.OpenFileAt(dir, store.LockName, os.O_RDONLY, 0); err == nil {
		got, lerr := platform.TryLock(lf)
		if lerr == nil && !got {
			s.busy = true
		}
		defer lf.Close() // closing releases the lock
	}
	c.checkEntries(dir, id, entry, p)

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
	if s.busy {
		p.note(InTransition, id, entry, "another process holds the lifecycle lock; its records are changing and were not judged")
		p.sandboxes++
		if rec != nil && platformID(rec).Alive() {
			s.rec, s.alive = rec, true
			p.running++
		}
		return
	}
	if cfg == nil && cerr == nil {
		s.provisioned = false
		p.leftovers = append(p.leftovers, id)
		p.add(LeftoverDirectory, id, entry, "a state directory without config.json (an interrupted provision or removal)")
	} else if cfg != nil {
		s.provisioned = true
		p.sandboxes++
		if cfg.ID != id {
			p.add(BadRecord, id, filepath.Join(entry, store.ConfigName), "names sandbox %q, not its directory's %q", cfg.ID, id)
		}
	}
	if rec != nil {
		s.rec = rec
		proc := platformID(rec)
		if !proc.Alive() {
			p.add(StaleRecord, id, filepath.Join(entry, store.RuntimeName), "names runtime process %s, which is gone", proc)
		} else {
			s.alive = true
			p.running++
			marked := false
			for _, pr := range p.procs {
				if pr.Role == runtime.RoleShim && pr.ID == proc && pr.Dir == dirPath {
					marked = true
				}
			}
			if !marked {
				p.add(UnmarkedProcess, id, filepath.Join(entry, store.RuntimeName), "names live process %s, which is not this sandbox's runtime process", proc)
			}
			if rec.RuntimeID != c.rt.Identity() {
				p.note(RuntimeMismatchNote, id, entry, "runs under runtime %s, not this sandboxd's %s; a forced stop ends it", rec.RuntimeID, c.rt.Identity())
			}
		}
	}
	if journal != nil {
		if rec != nil && rec.LaunchID == journal.LaunchID {
			p.add(CommittedJournal, id, filepath.Join(entry, store.LaunchName), "the launch %s committed, but its journal was not removed", journal.LaunchID)
		} else {
			p.add(InterruptedStart, id, filepath.Join(entry, store.LaunchName), "launch %s (pid %d) never committed", journal.LaunchID, journal.Pid)
		}
	}
	if cfg != nil {
		c.checkBinding(id, entry, p)
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
		case slices.Contains(storeRecords, n):
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
		case c.isDeclared(n):
			// Declared by the supervisor under a name this checker does not know the kind of.
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

// isDeclared asks the store whether n was declared to it (by supervisor.New): a name that a
// fresh store would accept but the supervisor's store refuses can only have been declared
// already. The verdict is remembered, since asking declares n to this private store.
func (c *checker) isDeclared(n string) bool {
	if v, ok := c.probed[n]; ok {
		return v
	}
	fresh, err := store.Open(c.root)
	if err != nil {
		return false
	}
	defer fresh.Close()
	declared := false
	if fresh.Declare(n, store.EntryFile) == nil {
		declared = c.st.Declare(n, store.EntryFile) != nil
	}
	c.probed[n] = declared
	return declared
}

func (c *checker) ownTemp(n string) bool {
	target, ok := platform.IsTempName(n)
	return ok && (slices.Contains(storeRecords, target) && target != store.LockName || c.declared[target] == store.EntryFile)
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
// sandbox runs there to use it: a sandbox's disk is attached by its init with autoclear, so
// the device goes with the sandbox's mount namespace, and one left means something else
// holds it (a mount in another namespace). It is not repaired: detaching a device that is
// mounted would fail, and whoever holds it must let go first.
func (c *checker) checkLoops(p *pass) {
	files, err := platform.LoopBackingFiles()
	if err != nil {
		return // no /sys/block: no loop devices to look at
	}
	for _, dev := range slices.Sorted(maps.Keys(files)) {
		f := strings.TrimSuffix(files[dev], " (deleted)")
		rest, ok := strings.CutPrefix(f, c.root+"/")
		if !ok {
			continue
		}
		id := ""
		if r, ok := strings.CutPrefix(rest, store.SandboxesDir+"/"); ok {
			id, _, _ = strings.Cut(r, "/")
			dir := filepath.Join(c.root, store.SandboxesDir, id)
			if s := p.states[dir]; s != nil && (s.busy || s.alive) || !c.stillIdle(dir, id) {
				continue // in a transition, or running (or being captured): its disk is in use
			}
		}
		p.add(LeakedLoop, id, rest, "loop device /dev/%s holds it while no sandbox runs there; find what mounts it (findmnt /dev/%s in every mount namespace) and unmount it", dev, dev)
	}
}

// checkCgroups reports the cgroups of this root's sandboxes that are not running.
func (c *checker) checkCgroups(p *pass) {
	cg, err := platform.OpenCgroup(c.o.CgroupParent + "/probe")
	if err != nil {
		p.note(LeakedCgroup, "", "", "cannot find the cgroup hierarchy: %v", err)
		return
	}
	ids := map[string]bool{}
	for _, d := range cg.Dirs() {
		ents, err := os.ReadDir(filepath.Dir(d))
		if err != nil {
			continue // no sandbox cgroup made yet in this hierarchy
		}
		for _, e := range ents {
			// A sandbox's cgroup is shim.CgroupLeaf(id, dir); another root's differs.
			id, _, ok := strings.Cut(e.Name(), ".")
			if e.IsDir() && ok && store.ValidateID(id) == nil &&
				e.Name() == shim.CgroupLeaf(id, filepath.Join(c.root, store.SandboxesDir, id)) {
				ids[id] = true
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		dir := filepath.Join(c.root, store.SandboxesDir, id)
		s := p.states[dir]
		if s == nil {
			// The cgroup names this root's state directory, which was not there when the
			// directories were read: a sandbox deleted without its cgroup, unless one of that
			// id was provisioned since.
			if _, err := os.Lstat(dir); err == nil {
				continue
			}
		} else if s.busy || s.alive || !c.cgroupStillLeaked(dir, id) {
			continue // in a transition, or running
		}
		p.leakedCgroups[id] = true
		p.add(LeakedCgroup, id, c.o.CgroupParent+"/"+shim.CgroupLeaf(id, filepath.Join(c.root, store.SandboxesDir, id)), "the cgroup of a sandbox that is not running")
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

// cgroupStillLeaked says whether the cgroup of a sandbox that was not running is still there
// while the sandbox is idle.
func (c *checker) cgroupStillLeaked(dir, id string) bool {
	if !c.stillIdle(dir, id) {
		return false
	}
	cg, err := platform.OpenCgroup(c.o.CgroupParent + "/" + shim.CgroupLeaf(id, dir))
	return err == nil && cg.Exists()
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
}

func platformID(rec *store.RuntimeRecord) platform.ProcessID {
	return platform.ProcessID{Pid: rec.Pid, StartTime: rec.PidStartTime, BootID: rec.BootID}
}
