package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/store"
)

// cgroupParentName is the record in the state root of the cgroup parent below which its
// sandboxes' cgroups live (--cgroup-parent), and cgroupParentFormat its format. The server
// writes it before it starts or reattaches any sandbox, so that `bothyd check` typed at a
// shell, without the unit's BOTHY_CGROUP_PARENT, looks for the cgroups where they are: the
// runtime's identity hashes the parent too, so a checker with another parent took every
// running sandbox for one of another runtime.
const (
	cgroupParentName   = "cgroup.json"
	cgroupParentFormat = 1
)

type cgroupParentRecord struct {
	Format int    `json:"format"`
	Parent string `json:"parent"`
}

// noteCgroupParentSource records, once fs is parsed, whether the operator gave the cgroup
// parent (the flag, else its environment variable): only a parent not given is taken from
// the state root's record (settleCgroupParent).
func (o *runtimeOptions) noteCgroupParentSource(fs *flag.FlagSet) {
	o.cgroupParentFrom = ""
	if _, ok := os.LookupEnv("BOTHY_CGROUP_PARENT"); ok {
		o.cgroupParentFrom = "BOTHY_CGROUP_PARENT"
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "cgroup-parent" {
			o.cgroupParentFrom = "--cgroup-parent"
		}
	})
}

// settleCgroupParent makes o's cgroup parent, in this order: the one the operator gave
// (--cgroup-parent, else BOTHY_CGROUP_PARENT), else the one root records, else the default.
// It returns the recorded one ("" when root records none).
func settleCgroupParent(o *runtimeOptions, root string) (recorded string, err error) {
	recorded, err = readCgroupParent(root)
	if err != nil {
		return "", err
	}
	if o.cgroupParentFrom == "" && recorded != "" {
		o.cgroupParentFrom = filepath.Join(root, cgroupParentName)
		o.cgroupParent = recorded
	}
	return recorded, nil
}

// readCgroupParent returns the cgroup parent that root records, or "" when it records none.
// A record that is a link or not a regular file is refused (platform.ReadFile), as every
// record of the root is.
func readCgroupParent(root string) (string, error) {
	path := filepath.Join(root, cgroupParentName)
	data, err := platform.ReadFile(path, record.MaxSize)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if errors.Is(err, platform.ErrNotRegular) {
		return "", fmt.Errorf("the state root's record of its cgroup parent: %w; remove %s and start bothyd with the --cgroup-parent its sandboxes run below", err, path)
	}
	if err != nil {
		return "", fmt.Errorf("the state root's record of its cgroup parent: %w", err)
	}
	var r cgroupParentRecord
	if err := record.Decode(cgroupParentName, data, cgroupParentFormat, &r); err != nil {
		return "", err
	}
	if r.Parent == "" {
		return "", fmt.Errorf("%s records no cgroup parent; remove it and start bothyd with the --cgroup-parent its sandboxes run below", path)
	}
	return r.Parent, nil
}

// recordCgroupParent records o's cgroup parent in root, durably, before the server starts or
// reattaches a sandbox. recorded is what root recorded before (settleCgroupParent).
//
// A parent other than the recorded one is refused while a cgroup of this root's sandboxes
// still exists below the recorded one: those sandboxes run there, and a server with the new
// parent would neither find their cgroups (reattach, check and repair look below the new one)
// nor drive them (the runtime's identity hashes the parent), and stopping the sandboxes'
// unit would no longer be what stops them all. With none left (after a reboot, after
// bothy-sandboxes.service was stopped, or once every sandbox was deleted) the new parent is
// adopted.
func recordCgroupParent(root string, o *runtimeOptions, recorded string, log *slog.Logger) error {
	parent := o.cgroupParent
	if parent == recorded {
		return nil
	}
	if recorded != "" {
		n, err := sandboxCgroupsBelow(root, recorded)
		if err != nil {
			return fmt.Errorf("cannot tell whether sandboxes still run below the cgroup parent %s that the state root records, so %s %s is not taken: %w", recorded, o.cgroupParentFrom, parent, err)
		}
		if n > 0 {
			return fmt.Errorf("%s %s: the state root %s records the cgroup parent %s, below which %d of its sandboxes' cgroups still exist; "+
				"a server with another parent would orphan them. Start bothyd with --cgroup-parent %s (or without the flag and BOTHY_CGROUP_PARENT), "+
				"or end those sandboxes first (delete them, or stop bothy-sandboxes.service; `bothyd check --repair` releases leftover cgroups)",
				o.cgroupParentFrom, parent, root, recorded, n, recorded)
		}
		log.Info("the sandboxes' cgroup parent changes: no sandbox runs below the recorded one", "recorded", recorded, "cgroup_parent", parent)
	}
	data, err := record.Encode(&cgroupParentRecord{Format: cgroupParentFormat, Parent: parent})
	if err != nil {
		return err
	}
	if err := platform.WriteFileDurable(root, cgroupParentName, data, record.Perm); err != nil {
		return fmt.Errorf("recording the cgroup parent in the state root: %w", err)
	}
	return nil
}

// sandboxCgroupsBelow counts the cgroups of root's sandboxes below parent, as the namespace
// runtime names them (namespace.Runtime.HostResources).
func sandboxCgroupsBelow(root, parent string) (int, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return 0, err
	}
	rt, err := namespace.New(namespace.Config{CgroupParent: parent})
	if err != nil {
		return 0, err
	}
	res, err := rt.HostResources(filepath.Join(abs, store.SandboxesDir))
	if err != nil {
		return 0, err
	}
	return len(res), nil
}
