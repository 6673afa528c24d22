package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// commitGrace is how long a capture's commit waits for the lock at least, even when the
// caller's deadline passed during the copy: giving up then would throw the copy away.
const commitGrace = 10 * time.Second

// Capture copies the directory tree at sourceLayerDir (a stopped sandbox's upper/, which the
// caller keeps stopped under its lifecycle lock) into a new generation of template name with
// compatibility key key and the time contract read now, and returns it. The source is copied,
// never moved: the sandbox stays intact. The copy keeps file types (overlayfs whiteouts are
// character devices 0/0), modes, ownership, symbolic links, hard links, xattrs (overlayfs's
// trusted.overlay.* always, others where the file system allows) and times. progress, if not
// nil, is called with the bytes copied so far and the total.
//
// The copy runs without the template store's lock, in a staging directory inside the
// template's directory that the capture holds an flock on; every file and directory is
// fsynced, then the index entry is written into staging, and under the lock the staging
// directory is renamed to the generation's id: a generation appears whole, with its index
// entry, or not at all. A crash leaves only the staging directory, which the next operation
// on the template removes (its flock died with the process). The generation id is reserved
// (template.json's counter bumped durably) before the copy starts, so ids are never reused.
//
// ctx bounds the waits for the lock and cancels the copy; its deadline does not cut a copy
// short (the commit waits at least commitGrace for the lock). Errors: template-not-found,
// template-tombstoned (the template is being deleted).
func (s *Store) Capture(ctx context.Context, name, sourceLayerDir string, key Key, progress func(copied, total int64)) (_ *Generation, err error) {
	defer func() { err = s.storage(err) }()
	src, err := platform.OpenDir(sourceLayerDir)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "The sandbox's writable layer cannot be opened; it must be a directory, not a link.")
	}
	defer src.Close()
	return s.CaptureLayers(ctx, name, []*os.File{src}, key, progress)
}

// CaptureLayers is Capture of a stack of open directories, lowest first, which the caller
// closes. Everything below each is reached through its descriptor, so a layer may lie on a
// mount that only the descriptor reaches (a sandbox's own disk, mounted on the side for the
// copy). The generation holds the lowest copied, then each layer above merged over it as
// overlayfs would show it (its whiteouts kept, so that they still hide what lies below the
// stack). A clone's capture is its generation's payload with the clone's own layer above: a
// generation that stands alone, so that it leases nothing.
func (s *Store) CaptureLayers(ctx context.Context, name string, layers []*os.File, key Key, progress func(copied, total int64)) (_ *Generation, err error) {
	return s.CaptureLayersWith(ctx, name, layers, key, CaptureHooks{Progress: progress})
}

// CaptureHooks are what a capture calls back into its caller. Hold and Release bracket the
// copy's reads and nothing else, so that a caller who must keep its source still for the
// copy (a running sandbox, frozen) keeps it still for as short a time as the copy allows:
// the reservation before and the commit after run with the source released.
type CaptureHooks struct {
	// Progress, if not nil, is called with the bytes copied so far and the total.
	Progress func(copied, total int64)
	// Hold, if not nil, is called after the generation id is reserved and before the first
	// read of a layer; its error fails the capture.
	Hold func() error
	// Release, if not nil, is called exactly once when Hold succeeded: once the copy is read
	// and synced in full, or as soon as the capture fails. It returns how long the source was
	// held, which the generation records as its capture pause.
	Release func() time.Duration
	// Time, if not nil, is the time contract of the captured state, read by the caller when
	// it took the state before the capture (a snapshot of a running VM, whose memory holds
	// that moment); nil reads the contract when the capture begins.
	Time *TimeContract
	// Source, if not nil, is what is captured: the generation records it as its lineage.
	Source *Source
}

// CaptureLayersWith is [Store.CaptureLayers] with hooks.
func (s *Store) CaptureLayersWith(ctx context.Context, name string, layers []*os.File, key Key, hooks CaptureHooks) (_ *Generation, err error) {
	defer func() { err = s.storage(err) }()
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if len(layers) == 0 {
		return nil, errors.New("template: a capture of no layer")
	}
	now, err := s.Now()
	if err != nil {
		return nil, err
	}
	at := now
	if hooks.Time != nil {
		at = *hooks.Time
	}
	c, err := s.reserve(ctx, name)
	if err != nil {
		return nil, err
	}
	defer c.close()
	var held time.Duration
	release := func() {}
	if hooks.Hold != nil {
		if err := hooks.Hold(); err != nil {
			return nil, err
		}
		released := false
		release = func() {
			if !released && hooks.Release != nil {
				released = true
				held = hooks.Release()
			}
		}
		defer release() // on failure
	}
	size, err := s.copyLayers(ctx, c, layers, hooks.Progress)
	if err != nil {
		return nil, err
	}
	release()
	s.synced(StepCaptureCopied)
	entry := &indexEntry{Format: IndexFormat, ID: c.gen, Template: name, Key: key, Time: at, CapturedAt: at.UTC, SizeBytes: size}
	if held > 0 {
		entry.PauseMS = max(held.Milliseconds(), 1)
	}
	if hooks.Source != nil {
		if err := hooks.Source.Validate(); err != nil {
			return nil, errcode.Wrap(errcode.Internal, err, "The capture's source cannot be recorded.")
		}
		entry.Source = hooks.Source
	}
	if err := s.writeRecord(c.sdir, IndexName, entry, StepCaptureIndex); err != nil {
		return nil, err
	}
	return s.commit(ctx, c, entry, now)
}

// capture is a capture in flight: the generation id it reserved and its staging directory,
// which it holds an flock on from the reservation until close.
type capture struct {
	name    string
	gen     string   // the reserved generation id
	staging string   // the staging directory's name in tdir
	uid     string   // the template's UID at the reservation: the commit checks it is the same template
	tdir    *os.File // the template's directory
	sdir    *os.File // the staging directory, flocked
	fs      platform.FS
	// done is set once the staging directory is no longer ours to remove: renamed to the
	// generation, or removed already.
	done bool
}

// close removes the staging directory unless the capture committed or removed it, then
// closes the directories; closing the staging directory releases its flock, after the removal.
func (c *capture) close() {
	c.removeStaging()
	c.sdir.Close()
	c.tdir.Close()
}

// removeStaging removes the staging directory, once. It is ours to remove: we hold its flock.
func (c *capture) removeStaging() {
	if c.done {
		return
	}
	c.done = true
	_ = c.fs.RemoveAllAt(c.tdir, c.staging)
	_ = c.fs.SyncDir(c.tdir)
}

// reserve is the first phase of a capture: under the lock, it bumps the template's generation
// counter durably, so that the id is never reused, and makes and flocks the staging directory.
func (s *Store) reserve(ctx context.Context, name string) (*capture, error) {
	var c *capture
	err := s.withLock(ctx, func(tx *Tx) error {
		var err error
		c, err = s.reserveLocked(name)
		return err
	})
	if err != nil && c != nil {
		// The reservation was made but the unlock failed: give the staging directory up.
		c.close()
		c = nil
	}
	return c, err
}

func (s *Store) reserveLocked(name string) (*capture, error) {
	d, rec, err := s.openTemplate(name)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if rec.Deleting {
		return nil, tombstoned(name)
	}
	if err := s.cleanTemplateDir(d, name); err != nil {
		return nil, err
	}
	gen := generationID(rec.NextGeneration)
	rec.NextGeneration++
	if err := s.writeRecord(d, TemplateRecordName, rec, ""); err != nil {
		return nil, err
	}
	return s.stageLocked(d, name, gen, rec.UID)
}

// stageLocked makes and flocks the staging directory of generation gen in the template's
// directory d, under the lock; the capture it returns holds its own handle of d.
func (s *Store) stageLocked(d *os.File, name, gen, uid string) (*capture, error) {
	staging := platform.TempName(gen)
	if err := s.opts.FS.MkdirAt(d, staging, 0o700); err != nil {
		return nil, err
	}
	sd, err := platform.OpenDirAt(d, staging)
	if err != nil {
		return nil, errors.Join(err, s.removeDir(d, staging, ""))
	}
	// The flock tells cleaners that this staging directory is alive; it is taken before
	// the store's lock is released, so no cleaner ever sees it unlocked while we live.
	if got, err := platform.TryLock(sd); err != nil || !got {
		sd.Close()
		return nil, errors.Join(err, errors.New("template: a fresh staging directory is locked by another process"))
	}
	td, err := platform.OpenDirAt(s.dir, name)
	if err != nil {
		sd.Close()
		return nil, err
	}
	c := &capture{name: name, gen: gen, staging: staging, uid: uid, tdir: td, sdir: sd, fs: s.opts.FS}
	if err := s.opts.FS.SyncDir(d); err != nil {
		// Give the staging directory up at once rather than leave it to the next cleaner.
		c.removeStaging()
		sd.Close()
		td.Close()
		return nil, err
	}
	s.synced(StepCaptureReserve)
	return c, nil
}

func tombstoned(name string) error {
	return errcode.New(errcode.TemplateTombstoned, "Template %s is being deleted and takes no new captures.", name)
}

// copyLayers is the second phase of a capture, without the lock: it copies the lowest layer
// into the staging directory's payload and merges each layer above over it, every file and
// directory fsynced, and returns the payload's size.
func (s *Store) copyLayers(ctx context.Context, c *capture, layers []*os.File, progress func(copied, total int64)) (int64, error) {
	cp := &copier{ctx: ctx, progress: progress, links: map[inode]string{}, dstRoot: filepath.Join(s.path, c.name, c.staging), euid: os.Geteuid(), egid: os.Getegid()}
	for _, l := range layers {
		n, err := sizeTree(l, map[inode]bool{})
		if err != nil {
			return 0, err
		}
		cp.total += n
	}
	if progress != nil {
		progress(0, cp.total)
	}
	size, err := cp.copyRoot(layers[0], c.sdir, PayloadDir)
	if err != nil || len(layers) == 1 {
		return size, err
	}
	for _, l := range layers[1:] {
		if _, err := cp.mergeRoot(l, c.sdir, PayloadDir); err != nil {
			return 0, err
		}
	}
	// What the merge replaced or hid was copied but is not in the payload.
	payload, err := openDirAt(c.sdir, PayloadDir)
	if err != nil {
		return 0, err
	}
	defer payload.Close()
	return sizeTree(payload, map[inode]bool{})
}

// commit is the last phase of a capture: under the lock, unless the template was deleted or
// is being deleted meanwhile, it renames the staging directory to the generation's id, so
// that the generation appears whole, with its index entry. ctx's deadline does not cut it
// short: it waits at least commitGrace for the lock, since giving up would throw the copy away.
func (s *Store) commit(ctx context.Context, c *capture, entry *indexEntry, now TimeContract) (*Generation, error) {
	cctx := ctx
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < commitGrace && !errors.Is(ctx.Err(), context.Canceled) {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), commitGrace)
		defer cancel()
	}
	var out *Generation
	err := s.withLock(cctx, func(tx *Tx) error {
		var err error
		out, err = s.commitLocked(c, entry, now)
		return err
	})
	if err != nil && !c.done {
		// The template went away meanwhile: remove the staging now, and the template's
		// directory if that was all that kept it.
		c.removeStaging()
		if errcode.Of(err) == errcode.TemplateNotFound {
			_ = s.withLock(cctx, func(tx *Tx) error {
				if rec, rerr := readTemplateRecord(c.tdir); rerr == nil && rec == nil {
					return s.removeTemplateDirIfEmpty(c.tdir, c.name)
				}
				return nil
			})
		}
	}
	return out, err
}

func (s *Store) commitLocked(c *capture, entry *indexEntry, now TimeContract) (*Generation, error) {
	rec, err := readTemplateRecord(c.tdir)
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.UID != c.uid {
		return nil, errcode.New(errcode.TemplateNotFound, "Template %s was deleted during the capture.", c.name)
	}
	if rec.Deleting {
		return nil, tombstoned(c.name)
	}
	if err := s.opts.FS.RenameNoReplaceAt(c.tdir, c.staging, c.gen); err != nil {
		return nil, err
	}
	if err := s.opts.FS.SyncDir(c.tdir); err != nil {
		// The capture fails, so its generation must not be listed: move it back to staging
		// (a rename needs no space), which close then removes. If that fails too, the
		// generation stays, whole: payload and index entry, as a commit leaves it.
		if rerr := s.opts.FS.RenameNoReplaceAt(c.tdir, c.gen, c.staging); rerr != nil {
			c.done = true
			return nil, errors.Join(err, fmt.Errorf("template: undoing the commit of %s/%s: %w", c.name, c.gen, rerr))
		}
		return nil, err
	}
	c.done = true
	s.synced(StepCaptureCommit)
	g := &genState{id: c.gen, index: entry, payload: true}
	g.n, _ = parseGeneration(c.gen)
	v := s.view(c.name, g, now)
	return &v, nil
}
