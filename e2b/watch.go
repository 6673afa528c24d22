package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/e2b/envd/filesystem"
	"github.com/bothy/bothy/supervisor"
)

// Bounds of the polled watchers, which live in bothyd's memory: how many there are at
// once, and how long one lives without being polled.
const (
	maxWatchers = 1024
	// maxSandboxWatchers bounds one sandbox's share of them.
	maxSandboxWatchers = 64
	watcherIdle        = 10 * time.Minute
	maxPolledKept      = control.MaxWatchQueued
)

// errOverflow ends a watch whose events were lost: E2B's events have no way to say so.
var errOverflow = connect.NewError(connect.CodeResourceExhausted,
	errors.New("the directory changed faster than the watch was read, and events were lost; watch again"))

// watchOptions are envd's: a directory on a network or FUSE file system is refused
// (invalid_argument) unless the client allows network mounts, as envd refuses it.
func watchOptions(recursive, allowNetworkMounts bool) supervisor.WatchOptions {
	return supervisor.WatchOptions{Recursive: recursive, RefuseNetwork: !allowNetworkMounts}
}

// watchEvent maps one of the agent's events to E2B's; overflow is not one.
func (s *filesystemService) watchEvent(ctx context.Context, id, root, user string, ev supervisor.WatchEvent, entry bool) (*filesystem.FilesystemEvent, bool) {
	out := &filesystem.FilesystemEvent{Name: ev.Name}
	switch control.WatchOp(ev.Op) {
	case control.WatchCreate:
		out.Type = filesystem.EventType_EVENT_TYPE_CREATE
	case control.WatchWrite:
		out.Type = filesystem.EventType_EVENT_TYPE_WRITE
	case control.WatchRemove:
		out.Type = filesystem.EventType_EVENT_TYPE_REMOVE
	case control.WatchRename:
		out.Type = filesystem.EventType_EVENT_TYPE_RENAME
	case control.WatchChmod:
		out.Type = filesystem.EventType_EVENT_TYPE_CHMOD
	default:
		return nil, false
	}
	if entry && out.Type != filesystem.EventType_EVENT_TYPE_REMOVE && out.Type != filesystem.EventType_EVENT_TYPE_RENAME {
		// Best effort: a file gone again since has no entry.
		if e, err := s.stat(ctx, id, path.Join(root, ev.Name), user); err == nil {
			out.Entry = e
		}
	}
	return out, true
}

// WatchDir streams the changes below a directory: start, then its events as they come, with
// keepalive events at the client's interval. It ends when the client leaves, the directory
// goes away, or events were lost (resource_exhausted).
func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	if err := resolveArg(&req.Msg.Path, userOfHeader(req.Header())); err != nil {
		return err
	}
	id, user, root := sandboxOf(ctx), userOfHeader(req.Header()), path.Clean(req.Msg.Path)
	w, err := s.h.sup.WatchDir(ctx, id, root, user, watchOptions(req.Msg.Recursive, req.Msg.AllowNetworkMounts))
	if err != nil {
		return connectError(err)
	}
	defer w.Close()
	stop := context.AfterFunc(ctx, func() { w.Close() })
	defer stop()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	type batch struct {
		evs []supervisor.WatchEvent
		err error
	}
	batches := make(chan batch)
	go func() {
		for {
			evs, err := w.Next()
			select {
			case batches <- batch{evs, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var tick <-chan time.Time
	if iv := keepalive(req.Header()); iv > 0 {
		t := time.NewTicker(iv)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case b := <-batches:
			if b.err != nil {
				// The directory went away, or its sandbox; or the call's end closed the watch.
				return leave(ctx)
			}
			for _, ev := range b.evs {
				if control.WatchOp(ev.Op) == control.WatchOverflow {
					return errOverflow
				}
				out, ok := s.watchEvent(ctx, id, root, user, ev, req.Msg.IncludeEntry)
				if !ok {
					continue
				}
				if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: out}}); err != nil {
					return err
				}
			}
		case <-tick:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return leave(ctx)
		}
	}
}

// watcherTable holds the polled watchers (CreateWatcher), by id.
type watcherTable struct {
	mu   sync.Mutex
	byID map[string]*polledWatcher
}

// polledWatcher is one polled watcher: a watch whose events wait, at most maxPolledKept of
// them, for the next GetWatcherEvents.
type polledWatcher struct {
	sandbox string
	w       *supervisor.DirWatch

	mu       sync.Mutex
	events   []*filesystem.FilesystemEvent
	lost     bool
	ended    bool
	lastPoll time.Time
}

// sweep closes the watchers nobody polled for watcherIdle.
func (t *watcherTable) sweep(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, p := range t.byID {
		p.mu.Lock()
		idle := now.Sub(p.lastPoll) > watcherIdle
		p.mu.Unlock()
		if idle {
			p.w.Close()
			delete(t.byID, id)
		}
	}
}

func (t *watcherTable) take(sandbox, id string) (*polledWatcher, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.byID[id]
	if p == nil || p.sandbox != sandbox {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("there is no watcher %q", id))
	}
	return p, nil
}

func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	if err := resolveArg(&req.Msg.Path, userOfHeader(req.Header())); err != nil {
		return nil, err
	}
	t := &s.h.watchers
	t.sweep(time.Now())
	id, user, root := sandboxOf(ctx), userOfHeader(req.Header()), path.Clean(req.Msg.Path)
	t.mu.Lock()
	n, mine := len(t.byID), 0
	for _, p := range t.byID {
		if p.sandbox == id {
			mine++
		}
	}
	t.mu.Unlock()
	if n >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d watchers exist, the most bothyd keeps; remove one", maxWatchers))
	}
	if mine >= maxSandboxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("sandbox %s has %d watchers, the most one sandbox may; remove one", id, maxSandboxWatchers))
	}
	// The watch outlives this call: it lasts until RemoveWatcher or its idle end.
	w, err := s.h.sup.WatchDir(context.WithoutCancel(ctx), id, root, user, watchOptions(req.Msg.Recursive, req.Msg.AllowNetworkMounts))
	if err != nil {
		return nil, connectError(err)
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	wid := hex.EncodeToString(b[:])
	p := &polledWatcher{sandbox: id, w: w, lastPoll: time.Now()}
	t.mu.Lock()
	if t.byID == nil {
		t.byID = map[string]*polledWatcher{}
	}
	t.byID[wid] = p
	t.mu.Unlock()
	entry := req.Msg.IncludeEntry
	go func() {
		for {
			evs, err := w.Next()
			if err != nil {
				p.mu.Lock()
				p.ended = true
				p.mu.Unlock()
				return
			}
			for _, ev := range evs {
				if control.WatchOp(ev.Op) == control.WatchOverflow {
					p.mu.Lock()
					p.lost = true
					p.mu.Unlock()
					continue
				}
				out, ok := s.watchEvent(context.Background(), id, root, user, ev, entry)
				if !ok {
					continue
				}
				p.mu.Lock()
				if len(p.events) < maxPolledKept {
					p.events = append(p.events, out)
				} else {
					p.lost = true
				}
				p.mu.Unlock()
			}
		}
	}()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: wid}), nil
}

// GetWatcherEvents hands over the events since the last call. Events lost since (the
// watcher's bound) are resource_exhausted, once; a watch whose directory went away is
// failed_precondition once its events were taken.
func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	p, err := s.h.watchers.take(sandboxOf(ctx), req.Msg.WatcherId)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastPoll = time.Now()
	if p.lost {
		p.lost = false
		p.events = nil
		return nil, errOverflow
	}
	evs := p.events
	p.events = nil
	if len(evs) == 0 && p.ended {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the watched directory is gone"))
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	t := &s.h.watchers
	p, err := t.take(sandboxOf(ctx), req.Msg.WatcherId)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	delete(t.byID, req.Msg.WatcherId)
	t.mu.Unlock()
	p.w.Close()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
