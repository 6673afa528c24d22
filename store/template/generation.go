package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// Eligibility is whether a generation may be cloned at a host time.
type Eligibility string

const (
	Eligible Eligibility = "eligible"
	Early    Eligibility = "early"   // the host's clock reads before the capture
	Expired  Eligibility = "expired" // captured longer ago than the maximum age
	// Tombstoned and Retiring mirror the generation's State: whatever the clock says, such a
	// generation takes no new lease.
	Tombstoned Eligibility = "tombstoned"
	Retiring   Eligibility = "retiring"
)

// State is a generation's life-cycle state.
type State string

const (
	StateActive     State = "active"     // clones may lease it
	StateTombstoned State = "tombstoned" // quarantined: no new lease, existing clones work
	StateRetiring   State = "retiring"   // its retirement waits for the last lease, or was interrupted
)

// EligibilityAt says whether a generation captured under contract c may be cloned at the
// host time now, and the downtime it measured. The downtime is measured by the monotonic
// clock when host, boot and clock are the capture's (it cannot be set, so a wrong wall clock
// does not matter), and by UTC otherwise (a monotonic reading means nothing on another boot or
// host). Negative downtime is Early; more than max is Expired.
func EligibilityAt(c, now TimeContract, max time.Duration) (Eligibility, time.Duration) {
	var down time.Duration
	// The boot id alone names one boot of one kernel; the host id (which a container may lack,
	// and then is empty on both sides) guards against a copied state root read elsewhere.
	if c.Clock != "" && c.BootID != "" &&
		c.HostID == now.HostID && c.BootID == now.BootID && c.Clock == now.Clock {
		down = now.Monotonic - c.Monotonic
	} else {
		down = now.UTC.Sub(c.UTC)
	}
	switch {
	case down < 0:
		return Early, down
	case down > max:
		return Expired, down
	}
	return Eligible, down
}

// Generation is the view of one generation.
type Generation struct {
	ID          string       `json:"id"`
	Template    string       `json:"template"`
	State       State        `json:"state"`
	Key         Key          `json:"key"`
	CapturedAt  time.Time    `json:"captured_at"`
	Time        TimeContract `json:"time"`
	Eligibility Eligibility  `json:"eligibility"`
	SizeBytes   int64        `json:"size_bytes"`
	// CapturePauseMS is how long the capture froze its running sandbox, in milliseconds; 0
	// when it froze nothing (the sandbox was stopped, or paused already).
	CapturePauseMS int64 `json:"capture_pause_ms,omitempty"`
	// Source is what the generation was captured from; nil for a generation recorded before
	// sources were (or imported from a registry copy whose source was unreadable).
	Source *Source `json:"source,omitempty"`
	// Leases is how many lease records the generation has.
	Leases int `json:"leases"`
	// Indexed is false for a generation whose retirement removed its index entry but was
	// interrupted: it shows as retiring, without key or time, until retiring again ends it.
	Indexed bool `json:"-"`
	// Drain is set when the generation is to be retired when its last lease goes.
	Drain bool `json:"-"`
}

// Lease is the view of one lease record.
type Lease struct {
	ID         string    `json:"id"`
	Template   string    `json:"template"`
	Generation string    `json:"generation"`
	Sandbox    string    `json:"sandbox"`
	AcquiredAt time.Time `json:"acquired_at"`
}

// genState is what a generation's directory holds.
type genState struct {
	id      string
	n       uint64
	index   *indexEntry
	tomb    *tombstoneRecord
	payload bool
	leases  []string // lease ids, sorted
}

// loadGeneration reads the generation gen of the template whose directory is tdir; found is
// false when it has no directory.
func loadGeneration(tdir *os.File, gen string) (*genState, bool, error) {
	n, ok := parseGeneration(gen)
	if !ok {
		return nil, false, ValidateGeneration(gen)
	}
	gdir, err := platform.OpenDirAt(tdir, gen)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, errcode.Wrap(errcode.Internal, err, "The directory of generation %s is not a directory; remove it by hand.", gen)
	}
	defer gdir.Close()
	g := &genState{id: gen, n: n}
	if data, found, err := readRecordFile(gdir, IndexName); err != nil {
		return nil, false, err
	} else if found {
		if g.index, err = decodeIndex(data); err != nil {
			return nil, false, err
		}
		if g.index.ID != gen {
			return nil, false, badRecord(IndexName, "names generation %q in the directory of %q", g.index.ID, gen)
		}
	}
	if data, found, err := readRecordFile(gdir, TombstoneName); err != nil {
		return nil, false, err
	} else if found {
		if g.tomb, err = decodeTombstone(data); err != nil {
			return nil, false, err
		}
	}
	if st, err := platform.LstatAt(gdir, PayloadDir); err == nil {
		g.payload = st.IsDir()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	g.leases, err = leaseIDs(gdir)
	if err != nil {
		return nil, false, err
	}
	return g, true, nil
}

// leaseIDs lists the lease records of a generation directory; no leases directory is none.
func leaseIDs(gdir *os.File) ([]string, error) {
	ldir, err := platform.OpenDirAt(gdir, LeasesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer ldir.Close()
	names, err := platform.ReadDirNames(ldir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, name := range names {
		if id, ok := leaseIDOf(name); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

func (g *genState) state() State {
	switch {
	case g.index == nil || !g.payload || (g.tomb != nil && g.tomb.Drain):
		return StateRetiring
	case g.tomb != nil:
		return StateTombstoned
	}
	return StateActive
}

func (s *Store) view(name string, g *genState, now TimeContract) Generation {
	v := Generation{ID: g.id, Template: name, State: g.state(), Leases: len(g.leases), Indexed: g.index != nil, Drain: g.tomb != nil && g.tomb.Drain}
	if g.index != nil {
		v.Key = g.index.Key
		v.CapturedAt = g.index.CapturedAt
		v.Time = g.index.Time
		v.SizeBytes = g.index.SizeBytes
		v.CapturePauseMS = g.index.PauseMS
		v.Source = g.index.Source
		v.Eligibility, _ = EligibilityAt(g.index.Time, now, s.opts.MaxAge)
	} else {
		v.Eligibility = Expired
	}
	switch v.State {
	case StateTombstoned:
		v.Eligibility = Tombstoned
	case StateRetiring:
		v.Eligibility = Retiring
	}
	return v
}

// generationNames lists the generation directories of a template, oldest first.
func generationNames(tdir *os.File) ([]string, error) {
	names, err := platform.ReadDirNames(tdir)
	if err != nil {
		return nil, err
	}
	var gens []string
	for _, name := range names {
		if _, ok := parseGeneration(name); ok && isDirAt(tdir, name) {
			gens = append(gens, name)
		}
	}
	slices.SortFunc(gens, func(a, b string) int {
		na, _ := parseGeneration(a)
		nb, _ := parseGeneration(b)
		return cmpUint(na, nb)
	})
	return gens, nil
}

// isDirAt reports whether the entry name in dir is a directory (a link to one is not).
func isDirAt(dir *os.File, name string) bool {
	st, err := platform.LstatAt(dir, name)
	return err == nil && st.IsDir()
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (s *Store) loadAll(tdir *os.File) ([]*genState, error) {
	names, err := generationNames(tdir)
	if err != nil {
		return nil, err
	}
	var gens []*genState
	for _, gen := range names {
		g, found, err := loadGeneration(tdir, gen)
		if err != nil {
			return nil, fmt.Errorf("template: generation %s: %w", gen, err)
		}
		if found {
			gens = append(gens, g)
		}
	}
	return gens, nil
}

// Generations lists the generations of a template, oldest first, as views at the host time
// now. It reads without the lock: records are replaced by rename, so each read is whole.
func (s *Store) Generations(name string, now TimeContract) (_ []Generation, err error) {
	defer func() { err = s.storage(err) }()
	tdir, _, err := s.openTemplate(name)
	if err != nil {
		return nil, err
	}
	defer tdir.Close()
	gens, err := s.loadAll(tdir)
	if err != nil {
		return nil, err
	}
	out := make([]Generation, 0, len(gens))
	for _, g := range gens {
		out = append(out, s.view(name, g, now))
	}
	return out, nil
}

// Generation returns the view of one generation at the host time now (template-not-found,
// generation-not-found).
func (s *Store) Generation(name, gen string, now TimeContract) (_ *Generation, err error) {
	defer func() { err = s.storage(err) }()
	tdir, g, err := s.lookup(name, gen)
	if err != nil {
		return nil, err
	}
	tdir.Close()
	v := s.view(name, g, now)
	return &v, nil
}

// lookup opens a template and loads one of its generations.
func (s *Store) lookup(name, gen string) (*os.File, *genState, error) {
	if err := ValidateName(name); err != nil {
		return nil, nil, err
	}
	if err := ValidateGeneration(gen); err != nil {
		return nil, nil, err
	}
	tdir, _, err := s.openTemplate(name)
	if err != nil {
		return nil, nil, err
	}
	g, found, err := loadGeneration(tdir, gen)
	if err == nil && !found {
		err = generationNotFound(name, gen)
	}
	if err != nil {
		tdir.Close()
		return nil, nil, err
	}
	return tdir, g, nil
}

// Leases lists the lease records of a generation.
func (s *Store) Leases(name, gen string) (_ []Lease, err error) {
	defer func() { err = s.storage(err) }()
	tdir, g, err := s.lookup(name, gen)
	if err != nil {
		return nil, err
	}
	defer tdir.Close()
	gdir, err := platform.OpenDirAt(tdir, gen)
	if err != nil {
		return nil, err
	}
	defer gdir.Close()
	return readLeases(gdir, g.leases)
}

func readLeases(gdir *os.File, ids []string) ([]Lease, error) {
	if len(ids) == 0 {
		return []Lease{}, nil
	}
	ldir, err := platform.OpenDirAt(gdir, LeasesDir)
	if err != nil {
		return nil, err
	}
	defer ldir.Close()
	out := make([]Lease, 0, len(ids))
	for _, id := range ids {
		data, found, err := readRecordFile(ldir, id+leaseExt)
		if err != nil {
			return nil, err
		}
		if !found {
			continue // released meanwhile
		}
		r, err := decodeLease(data)
		if err != nil {
			return nil, err
		}
		out = append(out, Lease{ID: r.ID, Template: r.Template, Generation: r.Generation, Sandbox: r.Sandbox, AcquiredAt: r.AcquiredAt})
	}
	return out, nil
}

// PayloadDir returns the absolute path of a generation's payload, the lower layer of its
// clones. It checks that the generation is indexed and its payload a directory.
func (s *Store) PayloadDir(name, gen string) (_ string, err error) {
	defer func() { err = s.storage(err) }()
	tdir, g, err := s.lookup(name, gen)
	if err != nil {
		return "", err
	}
	tdir.Close()
	if g.index == nil || !g.payload {
		return "", errcode.New(errcode.GenerationNotFound, "Generation %s of template %s is being retired; its payload is gone.", gen, name)
	}
	return filepath.Join(s.path, name, gen, PayloadDir), nil
}

// Select returns the latest generation of the template that a clone with key may lease at the
// host time now: indexed, not tombstoned, eligible, with an equal key. It reads without the
// lock, to preview; a clone selects under the lock with Tx.Select. Errors: template-not-found,
// template-ineligible (the message says why each generation was passed over).
func (s *Store) Select(name string, key Key, now TimeContract) (_ *Generation, err error) {
	defer func() { err = s.storage(err) }()
	tdir, _, err := s.openTemplate(name)
	if err != nil {
		return nil, err
	}
	defer tdir.Close()
	return s.selectIn(tdir, name, key, now)
}

func (s *Store) selectIn(tdir *os.File, name string, key Key, now TimeContract) (*Generation, error) {
	gens, err := s.loadAll(tdir)
	if err != nil {
		return nil, err
	}
	var why []string
	for i := len(gens) - 1; i >= 0; i-- {
		g := gens[i]
		v := s.view(name, g, now)
		switch {
		case v.State != StateActive:
			why = append(why, fmt.Sprintf("%s is %s", g.id, v.State))
		case v.Key != key:
			why = append(why, fmt.Sprintf("%s has another compatibility key (%s)", g.id, keyDiff(v.Key, key)))
		case v.Eligibility != Eligible:
			why = append(why, fmt.Sprintf("%s is %s", g.id, v.Eligibility))
		default:
			return &v, nil
		}
	}
	if len(why) == 0 {
		return nil, errcode.New(errcode.TemplateIneligible, "Template %s has no generation yet; capture one first.", name)
	}
	return nil, errcode.New(errcode.TemplateIneligible, "Template %s has no generation a clone can use: %s. Capture a new generation.", name, strings.Join(why, "; "))
}

func keyDiff(have, want Key) string {
	var d []string
	if have.Runtime != want.Runtime {
		d = append(d, fmt.Sprintf("runtime %q, not %q", have.Runtime, want.Runtime))
	}
	if have.Image != want.Image {
		d = append(d, fmt.Sprintf("image %q, not %q", have.Image, want.Image))
	}
	if have.Resources != want.Resources {
		d = append(d, fmt.Sprintf("resources %s, not %s", have.Resources, want.Resources))
	}
	return strings.Join(d, ", ")
}
