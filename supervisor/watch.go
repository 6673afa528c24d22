package supervisor

import (
	"context"

	"github.com/bothy/bothy/control"
)

// WatchEvent is one change below a watched directory: Name is relative to it, Op one of
// create, write, remove, rename, chmod and overflow (events were lost; see
// [control.MaxWatchQueued]).
type WatchEvent struct {
	Name string
	Op   string
}

// DirWatch is a watch of a directory in a sandbox ([Supervisor.WatchDir]).
type DirWatch struct {
	a *Admission
	w *control.DirWatch
}

// WatchOptions say how [Supervisor.WatchDir] watches.
type WatchOptions struct {
	// Recursive watches every directory below too.
	Recursive bool
	// RefuseNetwork refuses (invalid-request) a directory on a network or FUSE file system,
	// whose changes inotify may not see.
	RefuseNetwork bool
}

// WatchDir watches the directory at path as user through the sandbox's agent, and returns
// once it is watched. ctx bounds the start only; the watch lasts until Close, or until the
// directory goes away (Next returns io.EOF).
func (s *Supervisor) WatchDir(ctx context.Context, id, path, user string, opts WatchOptions) (*DirWatch, error) {
	a, err := s.trackedAdmission(ctx, id)
	if err != nil {
		return nil, err
	}
	w, err := a.agent.Watch(ctx, control.WatchRequest{Path: path, User: user, Recursive: opts.Recursive, RefuseNetwork: opts.RefuseNetwork})
	if err != nil {
		return nil, lost(a, err)
	}
	return &DirWatch{a: a, w: w}, nil
}

// Next blocks for the next events.
func (d *DirWatch) Next() ([]WatchEvent, error) {
	evs, err := d.w.Next()
	if err != nil {
		return nil, err
	}
	out := make([]WatchEvent, len(evs))
	for i, ev := range evs {
		out[i] = WatchEvent{Name: ev.Name, Op: string(ev.Op)}
	}
	return out, nil
}

// Close ends the watch.
func (d *DirWatch) Close() error { return d.w.Close() }
