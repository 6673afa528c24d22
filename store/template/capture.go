package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/sandboxd/sandboxd/errcode"
	"github.com/sandboxd/sandboxd/platform"
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
func (s *Store) Capture(ctx context.Context, name, sourceLayerDir string, key Key, progress func(copied, total int64)) (*Generation, error) {
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
func (s *Store) CaptureLayers(ctx context.Context, name string, layers []*os.File, key Key, progress func(copied, total int64)) (*Generation, error) {
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

	// Reserve the id and make the staging directory under the lock.
	var (
		gen, staging string
		uid          string
		tdir, sdir   *os.File
	)
	err = s.withLock(ctx, func(tx *Tx) error {
		d, rec, err := s.openTemplate(name)
		if err != nil {
			return err
		}
		ok := false
		defer func() {
			if !ok {
				d.Close()
			}
		}()
		if rec.Deleting {
			return errcode.New(errcode.TemplateTombstoned, "Template %s is being deleted and takes no new captures.", name)
		}
		if err := s.cleanTemplateDir(d, name); err != nil {
			return err
		}
		gen = generationID(rec.NextGeneration)
		rec.NextGeneration++
		if err := s.writeRecord(d, TemplateRecordName, rec, ""); err != nil {
			return err
		}
		staging = platform.TempName(gen)
		if err := platform.MkdirAt(d, staging, 0o700); err != nil {
			return err
		}
		sd, err := platform.OpenDirAt(d, staging)
		if err != nil {
			return err
		}
		// The flock tells cleaners that this staging directory is alive; it is taken before
		// the store's lock is released, so no cleaner ever sees it unlocked while we live.
		if got, err := platform.TryLock(sd); err != nil || !got {
			sd.Close()
			return errors.Join(err, errors.New("template: a fresh staging directory is locked by another process"))
		}
		if err := platform.SyncDir(d); err != nil {
			sd.Close()
			return err
		}
		s.synced(StepCaptureReserve)
		tdir, sdir, uid, ok = d, sd, rec.UID, true
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer tdir.Close()
	committed := false
	defer func() {
		if !committed {
			// Ours to remove: we hold its flock. Closing releases the flock afterwards.
			_ = removeTree(tdir, staging)
			_ = platform.SyncDir(tdir)
		}
		sdir.Close()
	}()

	c := &copier{ctx: ctx, progress: progress, links: map[inode]string{}, dstRoot: filepath.Join(s.path, name, staging), euid: os.Geteuid(), egid: os.Getegid()}
	for _, l := range layers {
		n, err := sizeTree(l, map[inode]bool{})
		if err != nil {
			return nil, err
		}
		c.total += n
	}
	if progress != nil {
		progress(0, c.total)
	}
	size, err := c.copyRoot(layers[0], sdir, PayloadDir)
	if err != nil {
		return nil, err
	}
	if len(layers) > 1 {
		for _, l := range layers[1:] {
			if _, err := c.mergeRoot(l, sdir, PayloadDir); err != nil {
				return nil, err
			}
		}
		// What the merge replaced or hid was copied but is not in the payload.
		payload, err := openDirAt(sdir, PayloadDir)
		if err != nil {
			return nil, err
		}
		size, err = sizeTree(payload, map[inode]bool{})
		payload.Close()
		if err != nil {
			return nil, err
		}
	}
	s.synced(StepCaptureCopied)
	entry := &indexEntry{Format: IndexFormat, ID: gen, Template: name, Key: key, Time: now, CapturedAt: now.UTC, SizeBytes: size}
	if err := s.writeRecord(sdir, IndexName, entry, StepCaptureIndex); err != nil {
		return nil, err
	}

	cctx := ctx
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < commitGrace && !errors.Is(ctx.Err(), context.Canceled) {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), commitGrace)
		defer cancel()
	}
	var out *Generation
	err = s.withLock(cctx, func(tx *Tx) error {
		rec, err := readTemplateRecord(tdir)
		if err != nil {
			return err
		}
		if rec == nil || rec.UID != uid {
			return errcode.New(errcode.TemplateNotFound, "Template %s was deleted during the capture.", name)
		}
		if rec.Deleting {
			return errcode.New(errcode.TemplateTombstoned, "Template %s is being deleted and takes no new captures.", name)
		}
		if err := renameAt(tdir, staging, gen); err != nil {
			return err
		}
		committed = true
		if err := platform.SyncDir(tdir); err != nil {
			return err
		}
		s.synced(StepCaptureCommit)
		g := &genState{id: gen, index: entry, payload: true}
		g.n, _ = parseGeneration(gen)
		v := s.view(name, g, now)
		out = &v
		return nil
	})
	if err != nil && !committed {
		// The template went away meanwhile: remove the staging now, and the template's
		// directory if that was all that kept it.
		_ = removeTree(tdir, staging)
		_ = platform.SyncDir(tdir)
		committed = true
		if errcode.Of(err) == errcode.TemplateNotFound {
			_ = s.withLock(cctx, func(tx *Tx) error {
				if rec, rerr := readTemplateRecord(tdir); rerr == nil && rec == nil {
					return s.removeTemplateDirIfEmpty(tdir, name)
				}
				return nil
			})
		}
	}
	return out, err
}
