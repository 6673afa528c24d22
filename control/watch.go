package control

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// FeatureWatch is announced by an agent whose Handler is also a [DirWatcher]: it serves the
// watch operation. Like [FeatureDial] it is not required; [Client.Watch] refuses an agent
// that lacks it.
const FeatureWatch = "watch"

// OpWatch watches a directory for changes (feature "watch"). Its header carries a
// [WatchRequest]. The agent answers a result {} once the directory is watched (a change made
// after the client read it is reported), then data frames each holding a JSON array of
// [WatchEvent], and ends with end (the watched directory itself went away) or error. The
// client sends nothing after the header: its close of the stream ends the watch.
const OpWatch Op = "watch"

// Bounds of one watch: the directories it watches (a recursive watch of a large tree stops
// adding watches there) and the events the agent holds that the client has not read. Past
// either, the agent reports one [WatchOverflow] event instead of holding more.
const (
	MaxWatchDirs   = 8192
	MaxWatchQueued = 4096
)

// WatchRequest is the header of a watch stream.
type WatchRequest struct {
	// Path is the absolute path of the directory to watch.
	Path string `json:"path"`
	// User is whose permissions the watch runs with: "user" (the default) or "root". A
	// directory the user may not read is not watched.
	User string `json:"user,omitempty"`
	// Recursive also watches every directory below Path, those created later included.
	Recursive bool `json:"recursive,omitempty"`
	// RefuseNetwork refuses (invalid-request) a Path on a network or FUSE file system (NFS,
	// CIFS, SMB, FUSE), whose changes inotify may never see (feature "file-meta"; an agent
	// without it watches such a directory).
	RefuseNetwork bool `json:"refuse_network,omitempty"`
}

// Validate checks the request's shape.
func (r *WatchRequest) Validate() error {
	if err := ValidatePath(r.Path); err != nil {
		return err
	}
	return validateUser(r.User)
}

// WatchOp is what happened to a watched path.
type WatchOp string

// The watch events. Overflow says events were lost: the client fell behind by more than
// [MaxWatchQueued] events, or a recursive watch reached [MaxWatchDirs] directories (Name is
// then the first directory left unwatched).
const (
	WatchCreate   WatchOp = "create"
	WatchWrite    WatchOp = "write"
	WatchRemove   WatchOp = "remove"
	WatchRename   WatchOp = "rename"
	WatchChmod    WatchOp = "chmod"
	WatchOverflow WatchOp = "overflow"
)

// WatchEvent is one change below a watched directory.
type WatchEvent struct {
	// Name is the changed path relative to the watched directory ("sub/file.txt").
	Name string  `json:"name"`
	Op   WatchOp `json:"op"`
}

// DirWatcher is what a [Handler] implements to serve watch. Watch calls started once the
// directory is watched, then emit with batches of events (emit blocks while the client does
// not read: the watcher holds what comes meanwhile, bounded, see [MaxWatchQueued]) until ctx
// ends (the client is gone: return) or the watched directory itself goes away (return nil).
// An error that is a [*RemoteError] is sent as it is.
type DirWatcher interface {
	Watch(ctx context.Context, req *WatchRequest, started func() error, emit func([]WatchEvent) error) error
}

// serveWatch runs the handler's watch on the stream.
func (s *server) serveWatch(ctx context.Context, st *yamux.Stream, fw *frameWriter, req *WatchRequest) {
	w, ok := s.h.(DirWatcher)
	if !ok {
		writeError(fw, invalidf("This agent does not serve %s.", OpWatch))
		return
	}
	ctx, stop := watchClient(ctx, st)
	defer stop()
	// A client that stops reading must not hold the handler in a write forever once it is
	// gone.
	unhook := context.AfterFunc(ctx, func() { st.SetWriteDeadline(time.Now()) })
	defer unhook()
	err := w.Watch(ctx, req,
		func() error { return writeJSON(fw, FrameResult, struct{}{}) },
		func(evs []WatchEvent) error {
			if len(evs) == 0 {
				return nil
			}
			return writeJSON(fw, FrameData, evs)
		})
	if ctx.Err() != nil {
		return // the client is gone: nobody to tell
	}
	if err != nil {
		writeError(fw, err)
		return
	}
	fw.write(FrameEnd, nil)
}

// DirWatch is the client's end of a watch: [DirWatch.Next] yields the events.
type DirWatch struct {
	st   *yamux.Stream
	once sync.Once
}

// Watch starts watching a directory as user and returns once it is watched: a change made
// after Watch returned is reported. ctx bounds the start only; the watch lasts until Close.
func (c *Client) Watch(ctx context.Context, req WatchRequest) (*DirWatch, error) {
	if !slices.Contains(c.hello.Features, FeatureWatch) {
		return nil, fmt.Errorf("control: the agent (%s) does not serve %s; restart the sandbox with this bothyd", c.hello.AgentVersion, OpWatch)
	}
	if err := req.Validate(); err != nil {
		return nil, asRemote(err).Err()
	}
	st, t, p, err := c.openAnswered(ctx, Header{Op: OpWatch, Watch: &req})
	if err != nil {
		return nil, err
	}
	switch t {
	case FrameResult:
		return &DirWatch{st: st}, nil
	case FrameError:
		st.Close()
		return nil, decodeRemoteError(p)
	}
	st.Close()
	return nil, fmt.Errorf("control: unexpected %s frame answering watch", t)
}

// Next blocks for the next batch of events. It returns io.EOF when the watched directory
// went away, and an error when the watch failed or was closed.
func (w *DirWatch) Next() ([]WatchEvent, error) {
	t, p, err := ReadFrame(w.st, nil)
	if err != nil {
		return nil, fmt.Errorf("control: the watch ended: %w", noEOF(err))
	}
	switch t {
	case FrameData:
		var evs []WatchEvent
		if err := json.Unmarshal(p, &evs); err != nil {
			return nil, fmt.Errorf("control: malformed watch events: %w", err)
		}
		return evs, nil
	case FrameEnd:
		return nil, io.EOF
	case FrameError:
		return nil, decodeRemoteError(p)
	}
	return nil, fmt.Errorf("control: unexpected %s frame in a watch", t)
}

// Close ends the watch; a Next blocked on it returns an error.
func (w *DirWatch) Close() error {
	w.once.Do(func() {
		w.st.Close()
		w.st.SetReadDeadline(time.Now())
	})
	return nil
}
