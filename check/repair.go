package check

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// repair fixes what the first pass found and what is safe to fix (see the package doc).
// Failures are logged: the second pass reports what is left.
func (c *checker) repair(ctx context.Context, p *pass) {
	log := c.o.Logger
	// The supervisor's own reconciliation, each sandbox under its lock: interrupted starts
	// end, stale records clear (with the runtime's Cleanup of the launch), committed journals go.
	if err := c.sup.ReattachAll(ctx, c.o.LockTimeout); err != nil {
		log.Error("check: reattach", "err", err)
	}
	// What deletes moved into the trash and nothing freed yet (a crash in between).
	if _, err := c.st.EmptyTrash(); err != nil {
		log.Error("check: empty the trash", "err", err)
	}

	// Per sandbox: unrecorded processes to kill, and leaked cgroups or mounts to release.
	sbxDir := filepath.Join(c.root, store.SandboxesDir)
	work := map[string][]runtime.Process{}
	var strays []runtime.Process // processes whose directory is no state directory of this root
	for _, pr := range p.unrecorded {
		if filepath.Dir(pr.Dir) == sbxDir && store.ValidateID(filepath.Base(pr.Dir)) == nil {
			work[filepath.Base(pr.Dir)] = append(work[filepath.Base(pr.Dir)], pr)
		} else {
			strays = append(strays, pr)
		}
	}
	for id := range p.leaked {
		if _, ok := work[id]; !ok {
			work[id] = nil
		}
	}
	for id := range p.leakedMounts {
		if _, ok := work[id]; !ok {
			work[id] = nil
		}
	}
	ids := make([]string, 0, len(work))
	for id := range work {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := c.repairSandbox(ctx, id, work[id]); err != nil {
			log.Error("check: repair sandbox", "sandbox", id, "err", err)
		}
	}
	// Nothing can come to record a stray: no state directory of this root names it.
	for _, pr := range strays {
		if err := c.kill(ctx, pr); err != nil {
			log.Error("check: kill a stray runtime process", "process", pr.ID.String(), "err", err)
		}
	}

	// A directory without config.json: one lock-existing attempt lets the store remove its
	// lock file and the directory if nothing else is in it (foreign entries are kept).
	for _, id := range p.leftovers {
		lctx, cancel := context.WithTimeout(ctx, c.o.LockTimeout)
		l, err := c.st.LockExisting(lctx, id)
		cancel()
		if err == nil {
			// It was provisioned meanwhile: nothing to repair.
			_ = l.Unlock()
		} else if errcode.Of(err) != errcode.SandboxNotFound {
			log.Error("check: lock a left-over directory", "sandbox", id, "err", err)
		}
	}

	c.repairNetwork(p)

	// The webhooks' leftovers, when no server holds their lock.
	c.checkWebhooks(&pass{}, true)
	c.checkVolumes(&pass{}, true)
	c.checkIdempotency(&pass{}, true)
	c.checkSecrets(&pass{}, true)
	c.checkEgress(&pass{}, true)

	c.checkShared(&pass{}, true)

	// Image references of users that are gone, then the image store's own leftovers.
	c.checkImages(ctx, &pass{}, true)

	if ts, err := template.Open(c.root, template.Options{}); err == nil {
		lctx, cancel := context.WithTimeout(ctx, c.o.LockTimeout)
		if _, err := ts.Check(lctx, template.BindingChecker(c.st.Dir), true); err != nil {
			log.Error("check: repair the template store", "err", err)
		}
		cancel()
		if c.o.FlushTemplateOutbox != nil {
			fctx, cancel := context.WithTimeout(ctx, time.Minute)
			if err := c.o.FlushTemplateOutbox(fctx, ts); err != nil {
				log.Warn("check: pushing the template store's outbox to the template registry; what is left stays for bothyd", "err", err)
			}
			cancel()
		}
		ts.Close()
	}
}

// repairSandbox kills the unrecorded processes of one sandbox and releases its cgroup and
// mounts if it is not running, under its lifecycle lock, so that no transition of a running
// server interleaves.
func (c *checker) repairSandbox(ctx context.Context, id string, procs []runtime.Process) error {
	dir := filepath.Join(c.root, store.SandboxesDir, id)
	lctx, cancel := context.WithTimeout(ctx, c.o.LockTimeout)
	defer cancel()
	l, err := c.st.LockExisting(lctx, id)
	switch {
	case errcode.Of(err) == errcode.SandboxNotFound:
		// Not provisioned: no transition can record these processes, so no lock is needed.
		l = nil
	case err != nil:
		return err
	}
	if l != nil {
		defer l.Unlock()
	}
	var recorded platform.ProcessID
	if l != nil {
		rec, err := l.RuntimeRecord()
		if err != nil {
			return err
		}
		if rec != nil && platformID(rec).Alive() {
			recorded = platformID(rec)
		}
	}
	for _, pr := range procs {
		if !recorded.IsZero() && (pr.ID == recorded || pr.Role == runtime.RoleInit && isChildOf(pr.ID, recorded)) {
			continue // recorded meanwhile
		}
		if err := c.kill(lctx, pr); err != nil {
			return err
		}
	}
	if !recorded.IsZero() {
		return nil // running: its cgroup is in use
	}
	// Not running: the cgroup and mounts are leftovers (Cleanup refuses a live process, and
	// the zero identity names none).
	return c.cleanupAll(lctx, id, dir)
}

// kill ends one runtime process by verified identity: a shim through the runtime's Kill (its
// init first, then the shim), an init directly.
func (c *checker) kill(ctx context.Context, pr runtime.Process) error {
	c.o.Logger.Warn("check: killing an unrecorded runtime process", "role", pr.Role, "process", pr.ID.String(), "dir", pr.Dir)
	if pr.Role == runtime.RoleShim {
		return c.ownerOf(pr).Kill(ctx, pr.Dir, pr.ID)
	}
	err := platform.SignalVerified(pr.ID, syscall.SIGKILL)
	if errors.Is(err, platform.ErrProcessGone) {
		return nil
	}
	return err
}

func isChildOf(child, parent platform.ProcessID) bool {
	ppid, err := platform.ParentPid(child.Pid)
	return err == nil && ppid == parent.Pid && parent.Alive()
}
