package supervisor

import (
	"errors"
	"os"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/volume"
)

// checkVolumes refuses the volumes of a create that this server or its runtime cannot mount:
// bad paths, too many, volumes on a server without a volume store or on a runtime that
// mounts none here (the microVM runtime on a host without virtiofsd: docs/volumes.md). A
// missing volume is refused when its hold is taken, under the volume store's lock.
func (s *Supervisor) checkVolumes(req CreateRequest) error {
	if len(req.Volumes) == 0 {
		return nil
	}
	if err := volume.CheckMounts("volumes", req.Volumes); err != nil {
		return err
	}
	if s.volumes == nil {
		return errcode.New(errcode.NotImplemented, "This server keeps no volumes; create the sandbox without volumes.")
	}
	kind := req.Runtime
	if req.Clone != nil && req.Clone.Runtime != "" {
		kind = req.Clone.Runtime
	}
	rt, err := s.runtimeOf(kind)
	if err != nil {
		return err
	}
	vm, ok := rt.(runtime.VolumeMounter)
	if !ok {
		return errcode.New(errcode.NotImplemented, "The %s runtime does not mount volumes (docs/volumes.md); create the sandbox under the namespace runtime, or without volumes.", rt.Kind())
	}
	if err := vm.VolumeSupport(); err != nil {
		return errcode.Wrap(errcode.Unavailable, err, "This server cannot mount volumes into %s sandboxes: %v.", rt.Kind(), err)
	}
	return nil
}

func volumeNames(mounts []store.VolumeMount) []string {
	var out []string
	seen := map[string]bool{}
	for _, m := range mounts {
		if !seen[m.Name] {
			seen[m.Name] = true
			out = append(out, m.Name)
		}
	}
	return out
}

// holdVolumes records that sandbox id mounts its volumes, before its configuration names
// them: a volume deleted meanwhile fails the create with volume-not-found.
func (s *Supervisor) holdVolumes(id string, mounts []store.VolumeMount) error {
	if len(mounts) == 0 {
		return nil
	}
	if s.volumes == nil {
		return errcode.New(errcode.NotImplemented, "This server keeps no volumes; create the sandbox without volumes.")
	}
	return s.volumes.Hold(id, volumeNames(mounts))
}

// releaseVolumes drops sandbox id's holds once it is gone (or was never made); a hold left
// by a failure here is stale, and the next delete of the volume or check --repair drops it.
func (s *Supervisor) releaseVolumes(id string, mounts []store.VolumeMount) {
	if len(mounts) == 0 || s.volumes == nil {
		return
	}
	if err := s.volumes.Release(id, volumeNames(mounts)); err != nil {
		s.log.Warn("releasing a sandbox's volumes", "sandbox", id, "err", err)
	}
}

// VolumeHeldBy is the volume store's [volume.HeldBy] over the sandbox store st: sandbox id
// holds volume name while its configuration names the volume, or while its state directory
// exists without a configuration (a provision in flight, whose hold comes first; an
// interrupted one, which the store's removal of it ends).
func VolumeHeldBy(st *store.Store) volume.HeldBy {
	return func(id, name string) bool {
		if store.ValidateID(id) != nil {
			return false
		}
		cfg, err := st.ReadConfigUnlocked(id)
		if errcode.Of(err) == errcode.SandboxNotFound {
			dir, derr := st.Dir(id)
			if derr != nil {
				return false
			}
			_, serr := os.Lstat(dir)
			return serr == nil
		}
		if err != nil {
			return true // unreadable: keep the hold rather than lose a volume under a sandbox
		}
		for _, m := range cfg.Volumes {
			if m.Name == name {
				return true
			}
		}
		return false
	}
}

// launchVolumes resolves a launch's volumes to their host mounts.
func (s *Supervisor) launchVolumes(rt runtime.Runtime, mounts []store.VolumeMount) ([]runtime.VolumeMount, error) {
	if len(mounts) == 0 {
		return nil, nil
	}
	if s.volumes == nil {
		return nil, errcode.New(errcode.NotImplemented, "This server keeps no volumes; the sandbox names some.")
	}
	if _, ok := rt.(runtime.VolumeMounter); !ok {
		return nil, errcode.New(errcode.NotImplemented, "The %s runtime does not mount volumes (docs/volumes.md).", rt.Kind())
	}
	out := make([]runtime.VolumeMount, 0, len(mounts))
	for _, m := range mounts {
		src, err := s.volumes.Source(m.Name)
		if err != nil {
			var e *errcode.Error
			if errors.As(err, &e) {
				return nil, err
			}
			return nil, errcode.Wrap(errcode.Unavailable, err, "Volume %s cannot be mounted: %v. Run bothyd check.", m.Name, err)
		}
		out = append(out, runtime.VolumeMount{Source: src, Target: m.Path, ReadOnly: m.ReadOnly})
	}
	return out, nil
}
