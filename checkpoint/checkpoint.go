package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/store/template"
)

// The entries this package keeps in a sandbox's state directory.
const (
	// DirName is the directory of a sandbox's checkpoints, declared to the store.
	DirName      = "checkpoints"
	manifestName = "manifest.json"
	layersName   = "layers"
	stagingPref  = ".staging-"
	trashPref    = "trash-"
	nextUpper    = "upper.next"
	// UpperName is the sandbox's writable layer in its state directory (the namespace
	// runtime's shim.EntryUpper; this package imports no runtime).
	UpperName = "upper"
	// DiskImageName is the disk of a sandbox's own in its state directory (the namespace
	// runtime's shim.EntryDiskImage).
	DiskImageName = "disk.img"
)

// MaxChain is the most layers a chain holds. Every rotation and every checkpoint adds one
// below the sandbox's upper, and overlayfs takes at most 500 lowers (the image's among
// them); a checkpoint or fork that would make a longer chain flattens it instead: the chain
// and the upper are merged into one layer, a copy of the sandbox's files (the one cost of
// the layers that grows with the data, paid once every MaxChain checkpoints).
const MaxChain = 32

// Format is the manifest's format.
const Format = 1

// The operations a manifest's Pending names.
const (
	OpRotate   = "rotate"   // a stopped sandbox's upper becomes a layer
	OpCopy     = "copy"     // a running sandbox's upper is copied into a layer
	OpRollback = "rollback" // the chain becomes a checkpoint's, the upper an empty one
	OpDelete   = "delete"   // a checkpoint is removed
)

// Limits bound one sandbox's checkpoints.
type Limits struct {
	// Count is the most checkpoints a sandbox holds (0: DefaultCount).
	Count int
	// Bytes is the most bytes the layers of a sandbox's checkpoints hold together (0:
	// DefaultBytes); a checkpoint that would exceed it is refused, and its layer removed.
	Bytes int64
}

// The default limits.
const (
	DefaultCount       = 16
	DefaultBytes int64 = 10 << 30
)

func (l Limits) count() int {
	if l.Count <= 0 {
		return DefaultCount
	}
	return l.Count
}

func (l Limits) bytes() int64 {
	if l.Bytes <= 0 {
		return DefaultBytes
	}
	return l.Bytes
}

// Checkpoint is one named point of a sandbox's files.
type Checkpoint struct {
	Name string `json:"name"`
	// Chain is the layers that hold the files at that point, top first.
	Chain     []string  `json:"chain"`
	CreatedAt time.Time `json:"created_at"`
	// Size is the bytes of the layer the checkpoint added (the files written since the
	// checkpoint or rollback below it, and a microVM's saved memory, Sandbox.AddToLayer).
	Size int64 `json:"size"`
	// Mode is how it was taken: OpRotate or OpCopy.
	Mode string `json:"mode"`
	// FreezeMS is how long the sandbox was frozen for it (0 for a stopped sandbox).
	FreezeMS int64 `json:"freeze_ms,omitempty"`
}

// Pending is an operation recorded before it is made.
type Pending struct {
	Op    string   `json:"op"`
	Name  string   `json:"name"`
	Layer string   `json:"layer,omitempty"`
	Chain []string `json:"chain,omitempty"`
	// Checkpoint is the record a rotation or copy commits.
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	// Disk says the sandbox's writable layer is a disk of its own, for the recovery of a
	// rollback (which throws the disk away rather than swapping in an empty upper).
	Disk bool `json:"disk,omitempty"`
	// File is the sandbox's [Sandbox.File], for the recovery of a rotation or a rollback.
	File string `json:"file,omitempty"`
}

// Manifest is a sandbox's checkpoint state.
type Manifest struct {
	Format int `json:"format"`
	// Chain is the layers between the sandbox's upper and its image (or generation), top
	// first.
	Chain       []string     `json:"chain,omitempty"`
	Checkpoints []Checkpoint `json:"checkpoints,omitempty"`
	Pending     *Pending     `json:"pending,omitempty"`
}

// Find returns the checkpoint named name, or nil.
func (m *Manifest) Find(name string) *Checkpoint {
	for i := range m.Checkpoints {
		if m.Checkpoints[i].Name == name {
			return &m.Checkpoints[i]
		}
	}
	return nil
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

// ValidateName checks a checkpoint's name: 1-63 of a-z, 0-9, '.', '_' and '-', starting and
// ending with a letter or digit.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return errcode.Invalid("name", "A checkpoint's name is 1 to 63 characters of a-z, 0-9, '.', '_' and '-', starting and ending with a letter or digit; %q is not.", name)
	}
	return nil
}

// Sandbox is the checkpoints of the sandbox whose state directory is Dir. Its caller holds
// the sandbox's lifecycle lock.
type Sandbox struct {
	Dir string
	// Disk says the sandbox's writable layer is on a disk of its own (DiskImageName in
	// Dir), not in the directory UpperName: it is then copied for every checkpoint (through
	// OpenUpper) and never rotated, and a rollback throws the disk away (the next launch
	// makes an empty one) rather than swapping in an empty upper.
	Disk bool
	// File, if set, says the sandbox's writable layer is this one file in Dir (a microVM's
	// disk overlay, whose header names the disk it backs onto), not the directory UpperName.
	// A layer is then a directory holding the file under the same name: a rotation moves
	// the file into a new layer (a rename), a copy copies it (the caller holds the sandbox
	// frozen with its disk flushed), and a rollback throws it away, the next launch making a
	// new file over the top of the checkpoint's chain. A chain of files is not flattened: a
	// checkpoint past MaxChain is refused.
	File string
	// OpenUpper, if set, opens the writable layer for a copy (nil and no error: there is
	// none yet); nil opens Dir/UpperName. A sandbox with a disk of its own needs one: its
	// layer is inside the disk image.
	OpenUpper func() (*os.File, error)
	// UpperIsSnapshot says what OpenUpper opens is a snapshot that stays as it is once the
	// sandbox runs on (a copy of a disk): the hold is released as soon as it is open, not
	// after the copy.
	UpperIsSnapshot bool
	// AddToLayer, if set, is called by Copy once the writable layer is copied and the
	// sandbox released, with the staging layer's directory: what it writes there (a
	// microVM's saved memory and device state) is part of the checkpoint, counted in its
	// Size and in Limits.Bytes, and committed or undone with the layer. It returns the
	// bytes it wrote, as the file system holds them.
	AddToLayer func(dir string) (int64, error)
	// Discard, if set, moves the named entries of a directory of Dir's away at once, to be
	// deleted later without the sandbox's lock (the store's trash), and returns those it
	// did not move; Sweep removes those in place. Unset, Sweep removes everything in place.
	Discard func(dir *os.File, names []string) []string
	// Crash, if set, is called at the named steps (the tests' crash points).
	Crash func(step string)
}

func (s *Sandbox) crash(step string) {
	if s.Crash != nil {
		s.Crash(step)
	}
}

func (s *Sandbox) root() string { return filepath.Join(s.Dir, DirName) }

// LayersDir is the directory of the layers of the sandbox whose state directory is dir: every
// layer of its chain lies directly in it.
func LayersDir(dir string) string { return filepath.Join(dir, DirName, layersName) }

// LayerDir is the path of the layer id.
func (s *Sandbox) LayerDir(id string) string { return filepath.Join(s.root(), layersName, id) }

// Manifest reads the manifest; a sandbox that never had a checkpoint has an empty one.
func (s *Sandbox) Manifest() (*Manifest, error) {
	b, err := platform.ReadFile(filepath.Join(s.root(), manifestName), 16<<20)
	if errors.Is(err, fs.ErrNotExist) {
		return &Manifest{Format: Format}, nil
	}
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("checkpoint manifest of %s: %w", s.Dir, err)
	}
	if m.Format != Format {
		return nil, fmt.Errorf("checkpoint manifest of %s: format %d, this server reads %d", s.Dir, m.Format, Format)
	}
	return &m, nil
}

func (s *Sandbox) write(m *Manifest) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return platform.WriteFileDurable(s.root(), manifestName, b, 0o600)
}

// ensure makes the checkpoints directory and its layers directory.
func (s *Sandbox) ensure() error {
	for _, d := range []string{s.root(), filepath.Join(s.root(), layersName)} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return platform.SyncDirPath(s.Dir)
}

// Lowers returns the paths of the sandbox's chain, top first, for its overlay.
func (s *Sandbox) Lowers() ([]string, error) {
	m, err := s.Manifest()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(m.Chain))
	for _, id := range m.Chain {
		out = append(out, s.LayerDir(id))
	}
	return out, nil
}

func (s *Sandbox) admit(m *Manifest, name string, lim Limits) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if m.Pending != nil {
		return errcode.New(errcode.TransitionInProgress, "A checkpoint operation of this sandbox was interrupted and is being finished; retry.")
	}
	if m.Find(name) != nil {
		return errcode.New(errcode.CheckpointExists, "The sandbox already has a checkpoint named %s; delete it first or choose another name.", name)
	}
	if len(m.Checkpoints) >= lim.count() {
		return errcode.New(errcode.CheckpointLimit, "The sandbox holds %d checkpoints, as many as this server allows; delete one before taking another.", len(m.Checkpoints))
	}
	return nil
}

func (m *Manifest) used() int64 {
	var n int64
	for _, c := range m.Checkpoints {
		n += c.Size
	}
	return n
}

// Rotate takes the checkpoint name of a stopped sandbox: its upper becomes a new layer on
// top of its chain, and the next launch makes it a fresh upper. No file is copied.
func (s *Sandbox) Rotate(name string, lim Limits) (*Checkpoint, error) {
	if s.Disk {
		return nil, errors.New("checkpoint: a disk of its own is copied, not rotated")
	}
	m, err := s.Manifest()
	if err != nil {
		return nil, err
	}
	if err := s.admit(m, name, lim); err != nil {
		return nil, err
	}
	if err := s.ensure(); err != nil {
		return nil, err
	}
	size, err := s.upperSize()
	if err != nil {
		return nil, err
	}
	if m.used()+size > lim.bytes() {
		return nil, errcode.New(errcode.CheckpointLimit, "The sandbox's checkpoints would hold %d bytes, more than the %d this server allows; delete one before taking another.", m.used()+size, lim.bytes())
	}
	if len(m.Chain)+1 > MaxChain && s.File != "" {
		return nil, chainFull()
	}
	if len(m.Chain)+1 > MaxChain {
		// Flatten: a copy of the whole files, which the stopped sandbox then stands on
		// alone. Each step is crash-safe on its own; between them the checkpoint is taken
		// and the sandbox still on its old chain.
		if _, err := s.Copy(context.Background(), name, lim, func() (func(), error) { return func() {}, nil }); err != nil {
			return nil, err
		}
		return s.Rollback(name)
	}
	id := naming.RandomHex(8)
	c := &Checkpoint{Name: name, Chain: append([]string{id}, m.Chain...), CreatedAt: time.Now().UTC(), Size: size, Mode: OpRotate}
	if err := s.rotate(m, id, c); err != nil {
		return nil, err
	}
	return c, nil
}

// upperSize is the bytes of the sandbox's writable layer (0 for none yet).
func (s *Sandbox) upperSize() (int64, error) {
	if s.File != "" {
		fi, err := os.Lstat(filepath.Join(s.Dir, s.File))
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			return st.Blocks * 512, nil // what it takes: an overlay file is sparse
		}
		return fi.Size(), nil
	}
	f, err := platform.OpenDir(filepath.Join(s.Dir, UpperName))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return template.LayerSize(f)
}

// chainFull refuses a checkpoint past MaxChain of a sandbox whose layers are files.
func chainFull() error {
	return errcode.New(errcode.CheckpointLimit, "The sandbox's disk is a chain of %d checkpoint layers, as many as this server stacks, and flattening a chain of disk files is not implemented; roll back to an older checkpoint (which shortens the chain) before taking another.", MaxChain)
}

// rotate records and makes the rotation of the upper into the layer id, committing c (nil
// for a fork's rotation, which names no checkpoint).
func (s *Sandbox) rotate(m *Manifest, id string, c *Checkpoint) error {
	name := ""
	if c != nil {
		name = c.Name
	}
	m.Pending = &Pending{Op: OpRotate, Name: name, Layer: id, Chain: append([]string{id}, m.Chain...), Checkpoint: c, File: s.File}
	if err := s.write(m); err != nil {
		return err
	}
	s.crash("checkpoint-recorded")
	return s.finishRotate(m)
}

// finishRotate does, or finishes, the pending rotation of m: the upper (if it is still
// there) is renamed to the layer, and the checkpoint committed.
func (s *Sandbox) finishRotate(m *Manifest) error {
	p := m.Pending
	layer := s.LayerDir(p.Layer)
	upper := filepath.Join(s.Dir, UpperName)
	if p.File != "" {
		if err := rotateFile(s.Dir, layer, p.File); err != nil {
			return err
		}
	} else if _, err := os.Lstat(layer); errors.Is(err, fs.ErrNotExist) {
		if err := os.Rename(upper, layer); errors.Is(err, fs.ErrNotExist) {
			// A sandbox that never ran has no upper: its layer is empty.
			if err := os.Mkdir(layer, 0o755); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		if err := platform.SyncDirPath(filepath.Dir(layer)); err != nil {
			return err
		}
		if err := platform.SyncDirPath(s.Dir); err != nil {
			return err
		}
	}
	s.crash("checkpoint-rotated")
	m.Chain = p.Chain
	if p.Checkpoint != nil {
		m.Checkpoints = append(m.Checkpoints, *p.Checkpoint)
	}
	m.Pending = nil
	if err := s.write(m); err != nil {
		return err
	}
	s.crash("checkpoint-committed")
	return nil
}

// rotateFile moves the file name of dir into the layer directory layer (made if it is not
// there), or finishes that: a file already moved, or never made (a sandbox that never ran:
// its layer is empty), is no error.
func rotateFile(dir, layer, name string) error {
	if err := os.Mkdir(layer, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := os.Rename(filepath.Join(dir, name), filepath.Join(layer, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, d := range []string{layer, filepath.Dir(layer), dir} {
		if err := platform.SyncDirPath(d); err != nil {
			return err
		}
	}
	return nil
}

// Copy takes the checkpoint name of a running sandbox: hold (which freezes it, and returns
// the function that thaws it) is called, the upper copied into a new layer, and the sandbox
// thawed; the chain stays (the upper still holds those files). It returns the checkpoint,
// whose FreezeMS is how long the sandbox was held.
func (s *Sandbox) Copy(ctx context.Context, name string, lim Limits, hold func() (release func(), err error)) (*Checkpoint, error) {
	m, err := s.Manifest()
	if err != nil {
		return nil, err
	}
	if err := s.admit(m, name, lim); err != nil {
		return nil, err
	}
	if err := s.ensure(); err != nil {
		return nil, err
	}
	id := naming.RandomHex(8)
	c := &Checkpoint{Name: name, Chain: append([]string{id}, m.Chain...), CreatedAt: time.Now().UTC(), Mode: OpCopy}
	var flatten []string
	if len(c.Chain) > MaxChain && s.File != "" {
		return nil, chainFull()
	}
	if len(c.Chain) > MaxChain {
		flatten, c.Chain = m.Chain, []string{id}
	}
	m.Pending = &Pending{Op: OpCopy, Name: name, Layer: id, Checkpoint: c}
	if err := s.write(m); err != nil {
		return nil, err
	}
	s.crash("checkpoint-recorded")
	size, frozen, err := s.copyUpper(ctx, id, hold, flatten)
	if err != nil {
		return nil, errors.Join(err, s.undoCopy(m))
	}
	if s.AddToLayer != nil {
		added, err := s.AddToLayer(filepath.Join(s.root(), stagingPref+id))
		if err != nil {
			return nil, errors.Join(err, s.undoCopy(m))
		}
		size += added
	}
	c.Size, c.FreezeMS = size, frozen.Milliseconds()
	if m.used()+size > lim.bytes() {
		err := errcode.New(errcode.CheckpointLimit, "The sandbox's checkpoints would hold %d bytes, more than the %d this server allows; delete one before taking another.", m.used()+size, lim.bytes())
		return nil, errors.Join(err, s.undoCopy(m))
	}
	if err := os.Rename(filepath.Join(s.root(), stagingPref+id), s.LayerDir(id)); err != nil {
		return nil, errors.Join(err, s.undoCopy(m))
	}
	if err := platform.SyncDirPath(filepath.Join(s.root(), layersName)); err != nil {
		return nil, errors.Join(err, s.undoCopy(m))
	}
	s.crash("checkpoint-copied")
	m.Checkpoints = append(m.Checkpoints, *c)
	m.Pending = nil
	if err := s.write(m); err != nil {
		return nil, err
	}
	s.crash("checkpoint-committed")
	return c, nil
}

// copyUpper copies the upper into the staging layer id while hold holds the sandbox, and
// returns its size and how long it was held (from the call of hold); with flatten (a chain, top first) the staging
// layer is the merge of the chain and the upper, which stands alone.
func (s *Sandbox) copyUpper(ctx context.Context, id string, hold func() (func(), error), flatten []string) (int64, time.Duration, error) {
	root, err := platform.OpenDir(s.root())
	if err != nil {
		return 0, 0, err
	}
	defer root.Close()
	// The freeze counts from before hold: holding is freezing, and what a runtime saves while
	// it holds (a microVM's memory) is part of the time the sandbox stands.
	at := time.Now()
	release, err := hold()
	if err != nil {
		return 0, 0, err
	}
	if s.File != "" {
		size, err := copyFile(ctx, filepath.Join(s.Dir, s.File), filepath.Join(s.root(), stagingPref+id), s.File)
		frozen := time.Since(at)
		release()
		return size, frozen, err
	}
	var size int64
	upper, err := s.openUpper()
	var frozen time.Duration
	if s.UpperIsSnapshot {
		frozen = time.Since(at)
		release()
		release = func() {}
	}
	switch {
	case err == nil && len(flatten) > 0:
		size, err = s.merge(ctx, root, stagingPref+id, flatten, upper)
	case err == nil && upper == nil:
		err = os.Mkdir(filepath.Join(s.root(), stagingPref+id), 0o755) // nothing written yet
	case err == nil:
		size, err = template.CopyLayer(ctx, upper, root, stagingPref+id)
		upper.Close()
	}
	if !s.UpperIsSnapshot {
		frozen = time.Since(at)
	}
	release()
	return size, frozen, err
}

// copyFile copies the file src into a new directory dir as name (an empty dir for a src that
// is not there: a sandbox that never ran), synced, and returns the bytes it takes. A link at
// src is not followed.
func copyFile(ctx context.Context, src, dir, name string) (int64, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return 0, err
	}
	in, err := platform.OpenFile(src, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		n, rerr := in.Read(buf)
		if n > 0 {
			if _, err := out.Write(buf[:n]); err != nil {
				return 0, err
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return 0, rerr
		}
	}
	if err := out.Sync(); err != nil {
		return 0, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(out.Fd()), &st); err != nil {
		return 0, err
	}
	return st.Blocks * 512, nil
}

func (s *Sandbox) openUpper() (*os.File, error) {
	if s.OpenUpper != nil {
		return s.OpenUpper()
	}
	f, err := platform.OpenDir(filepath.Join(s.Dir, UpperName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return f, err
}

// undoCopy removes what a copy made and clears its record.
func (s *Sandbox) undoCopy(m *Manifest) error {
	p := m.Pending
	for _, d := range []string{filepath.Join(s.root(), stagingPref+p.Layer), s.LayerDir(p.Layer)} {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	m.Pending = nil
	return s.write(m)
}

// Rollback makes the sandbox's files those of the checkpoint name: its chain becomes the
// checkpoint's and an empty upper replaces its own (thrown away). The sandbox must be
// stopped. Nothing is copied; what it threw away is removed by [Sandbox.Sweep].
func (s *Sandbox) Rollback(name string) (*Checkpoint, error) {
	m, err := s.Manifest()
	if err != nil {
		return nil, err
	}
	if m.Pending != nil {
		return nil, errcode.New(errcode.TransitionInProgress, "A checkpoint operation of this sandbox was interrupted and is being finished; retry.")
	}
	c := m.Find(name)
	if c == nil {
		return nil, notFound(name)
	}
	if err := s.ensure(); err != nil {
		return nil, err
	}
	// The empty upper is made before the record, so that a record always finds it (or
	// finds it already swapped in); a leftover without a record is removed. A disk of its
	// own is thrown away instead: the next launch makes an empty one.
	if !s.Disk && s.File == "" {
		next := filepath.Join(s.root(), nextUpper)
		if err := os.RemoveAll(next); err != nil {
			return nil, err
		}
		if err := os.Mkdir(next, 0o755); err != nil {
			return nil, err
		}
		if err := platform.SyncDirPath(s.root()); err != nil {
			return nil, err
		}
	}
	m.Pending = &Pending{Op: OpRollback, Name: name, Chain: slices.Clone(c.Chain), Disk: s.Disk || s.File != "", File: s.File}
	if err := s.write(m); err != nil {
		return nil, err
	}
	s.crash("rollback-recorded")
	if err := s.finishRollback(m); err != nil {
		return nil, err
	}
	out := *m.Find(name)
	return &out, nil
}

// finishRollback does, or finishes, the pending rollback of m.
func (s *Sandbox) finishRollback(m *Manifest) error {
	next := filepath.Join(s.root(), nextUpper)
	upper := filepath.Join(s.Dir, UpperName)
	if s.Disk || m.Pending.Disk {
		// Until the commit, no launch can have made a new disk (recovery runs first).
		disk := filepath.Join(s.Dir, DiskImageName)
		if m.Pending.File != "" {
			disk = filepath.Join(s.Dir, m.Pending.File)
		}
		if err := os.Rename(disk, filepath.Join(s.root(), trashPref+naming.RandomHex(8))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		s.crash("rollback-discarded")
		if err := platform.SyncDirPath(s.Dir); err != nil {
			return err
		}
	} else if _, err := os.Lstat(next); err == nil {
		if _, err := os.Lstat(upper); err == nil {
			if err := os.Rename(upper, filepath.Join(s.root(), trashPref+naming.RandomHex(8))); err != nil {
				return err
			}
			s.crash("rollback-discarded")
		}
		if err := os.Rename(next, upper); err != nil {
			return err
		}
		if err := platform.SyncDirPath(s.root()); err != nil {
			return err
		}
		if err := platform.SyncDirPath(s.Dir); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	s.crash("rollback-swapped")
	m.Chain = m.Pending.Chain
	m.Pending = nil
	if err := s.write(m); err != nil {
		return err
	}
	s.crash("rollback-committed")
	return nil
}

// Delete removes the checkpoint name; its layers go with [Sandbox.Sweep] unless another
// checkpoint or the sandbox's chain names them.
func (s *Sandbox) Delete(name string) error {
	m, err := s.Manifest()
	if err != nil {
		return err
	}
	if m.Pending != nil {
		return errcode.New(errcode.TransitionInProgress, "A checkpoint operation of this sandbox was interrupted and is being finished; retry.")
	}
	if m.Find(name) == nil {
		return notFound(name)
	}
	m.Checkpoints = slices.DeleteFunc(m.Checkpoints, func(c Checkpoint) bool { return c.Name == name })
	if err := s.write(m); err != nil {
		return err
	}
	s.crash("checkpoint-deleted")
	return nil
}

func notFound(name string) error {
	return errcode.New(errcode.CheckpointNotFound, "The sandbox has no checkpoint named %s; list its checkpoints to see their names.", name)
}

// Pending says an operation is recorded and not finished: what [Sandbox.Recover] finishes or
// undoes. It reads the manifest alone (none: nothing pending), for the callers that look
// before every transition.
func (s *Sandbox) Pending() (bool, error) {
	m, err := s.Manifest()
	if err != nil {
		return false, err
	}
	return m.Pending != nil, nil
}

// Recover finishes or undoes an operation that a crash interrupted (see the package doc)
// and removes staging leftovers. It returns whether there was one to finish.
func (s *Sandbox) Recover() (bool, error) {
	if _, err := os.Lstat(s.root()); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	m, err := s.Manifest()
	if err != nil {
		return false, err
	}
	had := m.Pending != nil
	if had {
		switch m.Pending.Op {
		case OpRotate:
			err = s.finishRotate(m)
		case OpRollback:
			err = s.finishRollback(m)
		case OpCopy:
			err = s.undoCopy(m)
		default:
			err = fmt.Errorf("checkpoint manifest of %s: unknown pending operation %q", s.Dir, m.Pending.Op)
		}
		if err != nil {
			return had, err
		}
	}
	// A rollback's empty upper made before a record that was never written.
	if err := os.RemoveAll(filepath.Join(s.root(), nextUpper)); err != nil {
		return had, err
	}
	return had, s.removeStaging()
}

func (s *Sandbox) removeStaging() error {
	names, err := readNames(s.root())
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, stagingPref) {
			if err := os.RemoveAll(filepath.Join(s.root(), n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Sweep removes what rollbacks threw away and the layers that no chain names: moved into
// the store's trash through Discard (a rename each, whatever their size), else removed in
// place. Under the lifecycle lock, with no operation pending (after Recover).
func (s *Sandbox) Sweep() error {
	if _, err := os.Lstat(s.root()); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	m, err := s.Manifest()
	if err != nil || m.Pending != nil {
		return err
	}
	names, err := readNames(s.root())
	if err != nil {
		return err
	}
	var trash []string
	for _, n := range names {
		if strings.HasPrefix(n, trashPref) {
			trash = append(trash, n)
		}
	}
	if err := s.discard(s.root(), trash); err != nil {
		return err
	}
	used := map[string]bool{}
	for _, id := range m.Chain {
		used[id] = true
	}
	for _, c := range m.Checkpoints {
		for _, id := range c.Chain {
			used[id] = true
		}
	}
	layers, err := readNames(filepath.Join(s.root(), layersName))
	if err != nil {
		return err
	}
	var unused []string
	for _, id := range layers {
		if !used[id] {
			unused = append(unused, id)
		}
	}
	return s.discard(filepath.Join(s.root(), layersName), unused)
}

// discard moves names of dir away through Discard, and removes in place what it did not.
func (s *Sandbox) discard(dir string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	if s.Discard != nil {
		d, err := platform.OpenDir(dir)
		if err != nil {
			return err
		}
		names = s.Discard(d, names)
		d.Close()
	}
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

// Problems lists what a consistency check finds in the sandbox's checkpoints: an
// interrupted operation, staging leftovers, a layer that a chain names and is missing.
// Recover repairs all but the last.
func (s *Sandbox) Problems() ([]string, error) {
	if _, err := os.Lstat(s.root()); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	m, err := s.Manifest()
	if err != nil {
		return nil, err
	}
	var out []string
	if m.Pending != nil {
		out = append(out, fmt.Sprintf("an interrupted %s of checkpoint %s", m.Pending.Op, m.Pending.Name))
	}
	names, err := readNames(s.root())
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		// What a committed rollback threw away (trash-*) is no problem: it is removed right
		// after the rollback answers, or by the next operation's sweep.
		if strings.HasPrefix(n, stagingPref) || n == nextUpper {
			out = append(out, "a leftover "+n)
		}
	}
	chains := [][]string{m.Chain}
	for _, c := range m.Checkpoints {
		chains = append(chains, c.Chain)
	}
	seen := map[string]bool{}
	for _, ch := range chains {
		for _, id := range ch {
			if seen[id] {
				continue
			}
			seen[id] = true
			if fi, err := os.Lstat(s.LayerDir(id)); err != nil || !fi.IsDir() {
				out = append(out, "missing layer "+id)
			}
		}
	}
	return out, nil
}

func readNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, err
}

// merge makes name under root the merge of chain (top first) and upper (nil: none).
func (s *Sandbox) merge(ctx context.Context, root *os.File, name string, chain []string, upper *os.File) (int64, error) {
	var layers []*os.File
	defer func() {
		for _, f := range layers {
			f.Close()
		}
	}()
	for i := len(chain) - 1; i >= 0; i-- {
		f, err := platform.OpenDir(s.LayerDir(chain[i]))
		if err != nil {
			if upper != nil {
				upper.Close()
			}
			return 0, err
		}
		layers = append(layers, f)
	}
	if upper != nil {
		layers = append(layers, upper)
	}
	return template.MergeLayers(ctx, layers, root, name)
}
