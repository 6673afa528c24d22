package supervisor

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store"
)

// StorageState is the health of the state root's file system, as the last fault or probe
// found it.
type StorageState string

// The states of [StorageHealth].
const (
	StorageOK          StorageState = "ok"
	StorageFull        StorageState = "full"        // ENOSPC or EDQUOT: freeing space cures it
	StorageUnavailable StorageState = "unavailable" // EROFS or EIO: the operator must act
)

// StorageStatus is what /v1/info and the dashboard show of the state root's health.
type StorageStatus struct {
	State StorageState
	// Since is when State began (the server's start for a root that was always ok).
	Since time.Time
	// Root is the state root.
	Root string
	// Path is the file the fault that began State was met on, if it named one; "" when ok.
	Path string
}

// StorageHealth tracks the health of a state root's file system. Every error that crosses a
// boundary where the state root is known passes through [StorageHealth.Classify], which gives
// storage faults their code (errcode.Storage) and resource exhaustion its own
// (errcode.Exhausted), counts each fault, and logs a change of state once, with the path:
// a storm of refused requests on a full disk is one log line, not one per request. While the
// state is not ok, a probe (create, write, fsync and remove a small file in the root) runs
// every probe interval, and the first that succeeds returns the state to ok, logged once too.
//
// A sandbox's own disk being full is not the state root's fault: errors that carry
// [ErrSandboxDiskFull] are left alone.
type StorageHealth struct {
	root    string
	log     *slog.Logger
	onFault func(errcode.Code)
	every   time.Duration
	probe   func() error

	mu      sync.Mutex
	status  StorageStatus
	probing bool
	closed  bool
	stop    chan struct{}
}

// ErrSandboxDiskFull marks a write that a sandbox's own disk had no room for, as opposed to
// the state root: it answers storage-full, but says nothing of the host.
var ErrSandboxDiskFull = errors.New("the sandbox's own disk is full")

// storageProbeSize is what a probe writes: a root with less room than this is still full, in
// practice, since no create or start fits in it.
const storageProbeSize = 64 << 10

// storageProbePrefix names the probe's file in the state root; a leftover (a crash between
// create and remove) is harmless and the next probe does not reuse it.
const storageProbePrefix = ".storage-probe-"

// NewStorageHealth returns the health of the state root root, probed once now so that a root
// that is already full or read-only reads so from the start. onFault, if set, is told of
// every fault (for bothy_storage_faults_total); it must not block.
func NewStorageHealth(root string, log *slog.Logger, onFault func(errcode.Code)) *StorageHealth {
	if log == nil {
		log = slog.Default()
	}
	if abs, err := filepath.Abs(root); err == nil {
		root = abs
	}
	h := &StorageHealth{
		root: root, log: log, onFault: onFault, every: 2 * time.Second,
		status: StorageStatus{State: StorageOK, Since: time.Now().UTC(), Root: root},
		stop:   make(chan struct{}),
	}
	h.probe = h.probeRoot
	if err := h.probe(); err != nil {
		_ = h.Classify(err) // it records the fault; the probe runs again later
	}
	return h
}

// Close stops the probe.
func (h *StorageHealth) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.stop)
	}
}

// Status is the current health.
func (h *StorageHealth) Status() StorageStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.status
}

// Classify returns err with the code of its fault: storage-full or storage-unavailable for a
// storage errno met under the state root (or with no path to say where), unavailable for
// exhausted descriptors or processes, and err itself otherwise. A storage fault is counted,
// and moves the health to full or unavailable. It is safe for concurrent use.
func (h *StorageHealth) Classify(err error) error {
	return h.classify(err, true)
}

// classify is Classify; count says whether the fault is counted (a failed probe is not: it
// is the same fault, met again).
func (h *StorageHealth) classify(err error, count bool) error {
	if err == nil || errors.Is(err, ErrSandboxDiskFull) {
		return err
	}
	path := faultPath(err)
	if path != "" && filepath.IsAbs(path) && !h.under(path) {
		// A storage errno outside the state root (a cgroup file's ENOSPC means a controller's
		// limit, not a full disk): not the state root's fault.
		return errcode.Exhausted(err)
	}
	err = errcode.Exhausted(errcode.Storage(err, h.root))
	var state StorageState
	switch errcode.Of(err) {
	case errcode.StorageFull:
		state = StorageFull
	case errcode.StorageUnavailable:
		state = StorageUnavailable
	default:
		return err
	}
	if count && h.onFault != nil {
		h.onFault(errcode.Of(err))
	}
	h.enter(state, path, err)
	return err
}

// noteFull counts and enters a full state root that a sandbox's agent met, which carries no
// errno of the host's to classify.
func (h *StorageHealth) noteFull(path string) {
	if h.onFault != nil {
		h.onFault(errcode.StorageFull)
	}
	h.enter(StorageFull, path, errcode.New(errcode.StorageFull, "a sandbox without a disk of its own found the state root full"))
}

func (h *StorageHealth) under(path string) bool {
	return path == h.root || strings.HasPrefix(path, strings.TrimSuffix(h.root, "/")+"/")
}

// enter moves the health to state, logging the change (only a change) and starting the probe.
func (h *StorageHealth) enter(state StorageState, path string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.status.State == state {
		return
	}
	h.status = StorageStatus{State: state, Since: time.Now().UTC(), Root: h.root, Path: path}
	h.log.Error("the state root's file system failed a write; writes answer "+string(errcode.Of(err))+" until it recovers",
		"state", state, "root", h.root, "path", path, "err", err)
	if !h.probing && !h.closed {
		h.probing = true
		go h.watch()
	}
}

// watch probes the root until a probe succeeds or the health closes.
func (h *StorageHealth) watch() {
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		if err := h.probe(); err != nil {
			_ = h.classify(err, false) // it records the state; the next probe tries again
			continue
		}
		h.mu.Lock()
		was := h.status
		h.status = StorageStatus{State: StorageOK, Since: time.Now().UTC(), Root: h.root}
		h.probing = false
		h.mu.Unlock()
		h.log.Info("the state root's file system takes writes again", "root", h.root, "was", was.State, "for", time.Since(was.Since).Round(time.Second).String())
		return
	}
}

func (h *StorageHealth) probeRoot() error { return probeStorage(h.root) }

// probeStorage writes, syncs and removes a small file in root: what every durable write
// needs of the file system.
func probeStorage(root string) error {
	f, err := os.CreateTemp(root, storageProbePrefix+"*")
	if err != nil {
		return err
	}
	name := f.Name()
	defer os.Remove(name)
	_, err = f.Write(make([]byte, storageProbeSize))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// faultPath is the path of the first path-carrying error in err's chain, or "".
func faultPath(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Path
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.New
	}
	return ""
}

// storageErr classifies an error met under the state root outside the stores (which
// classify their own): through the server's [StorageHealth] when there is one, so that the
// fault is counted and shown.
func (s *Supervisor) storageErr(err error) error {
	if s.health != nil {
		return s.health.Classify(err)
	}
	return errcode.Exhausted(errcode.Storage(err, s.store.Root()))
}

// startErr classifies the runtime's start error. Some of the runtime's steps run programs
// (mke2fs makes a sandbox's disk) whose failure carries no errno, only an exit status and
// the program's words: when such an error has no code, those words, or else a probe of the
// state root, tell whether the start failed for want of space (or of a writable file
// system), and the answer says so.
func (s *Supervisor) startErr(err error) error {
	err = s.storageErr(err)
	if errcode.Of(err) != "" {
		return err
	}
	// A program's report names the errno by its strerror text ("No space left on device"),
	// and the runtime may already have removed what it made, so that a probe now finds room.
	text := strings.ToLower(err.Error())
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS} {
		if strings.Contains(text, strings.ToLower(errno.Error())) {
			return s.storageErr(errors.Join(err, errno))
		}
	}
	if perr := probeStorage(s.store.Root()); errcode.StorageFaultOf(perr) != errcode.NoStorageFault {
		return s.storageErr(errors.Join(err, perr))
	}
	return err
}

// diskFullErr says whose disk a write of p (as user) inside sandbox id found full: a volume's,
// when p lies in one of its mounts (volume-full: neither the sandbox's disk nor the state
// root is at fault), the sandbox's own, when it has one (its writable layer is on it, so the
// host is not at fault), or else the state root's, where a sandbox without a disk of its own
// writes.
func (s *Supervisor) diskFullErr(id, p, user string, err error) error {
	if errcode.Of(err) != errcode.StorageFull {
		return err
	}
	cfg, cerr := s.store.ReadConfigUnlocked(id)
	if cerr == nil {
		if m, ok := volumeAt(cfg.Volumes, p, user); ok {
			return errcode.Wrap(errcode.VolumeFull, err,
				"Volume %s, mounted at %s in sandbox %s, is full: remove files from it, or write to a larger volume. Neither the sandbox's own disk nor the host's state root is full.", m.Name, m.Path, id)
		}
	}
	if cerr == nil && cfg.DiskMB > 0 {
		return errcode.Wrap(errcode.StorageFull, errors.Join(ErrSandboxDiskFull, err),
			"Sandbox %s's own disk (%d MiB) is full: remove files inside it, or recreate it with a larger resources.disk_mb. The host's state root is not full.", id, cfg.DiskMB)
	}
	root := s.store.Root()
	full := errcode.Wrap(errcode.StorageFull, err,
		"The state root %s is full (sandbox %s has no disk of its own and writes to it): delete sandboxes or templates you no longer need, or free space on its file system.", root, id)
	if s.health != nil {
		s.health.noteFull(root)
	}
	return full
}

// volumeAt is the volume mount that the path p of the files API (relative to user's home when
// not absolute) lies in, if any. A link inside the sandbox may lead a path elsewhere: this
// reads the path as written.
func volumeAt(mounts []store.VolumeMount, p, user string) (store.VolumeMount, bool) {
	if !path.IsAbs(p) {
		home := "/home/user"
		if user == "root" {
			home = "/root"
		}
		p = path.Join(home, p)
	}
	p = path.Clean(p)
	for _, m := range mounts {
		if p == m.Path || strings.HasPrefix(p, m.Path+"/") {
			return m, true
		}
	}
	return store.VolumeMount{}, false
}
