package handlers

import (
	"io"
	"net/http"
	"sync"

	"github.com/bothy/bothy/errcode"
)

// The bounds on what a client can hold open, so that no sandbox (and no crowd of clients)
// can exhaust the server's descriptors through the API. Each open file operation holds a
// control stream to the agent and, for a transfer, the client's connection; each exec holds a
// control stream and its pipes; each event stream a connection. README.md ("Bounds") lists
// them and /v1/info reports them.
const (
	// MaxFileOpsPerSandbox bounds the file operations (list, read, write, remove) in flight on
	// one sandbox; a read counts until its body has been sent.
	MaxFileOpsPerSandbox = 16
	// MaxFileOps bounds the file operations in flight on all sandboxes together, and on
	// volumes' files (docs/volumes.md): both hold descriptors.
	MaxFileOps = 256
	// MaxFileOpsPerVolume bounds the file operations in flight on one volume's files; a read
	// counts until its body has been sent.
	MaxFileOpsPerVolume = 16
	// MaxExecs bounds the execs, buffered and streamed, running on all sandboxes together;
	// each sandbox runs one at a time (exec admission), so a sandbox holds at most one.
	MaxExecs = 256
	// MaxEventStreams bounds the open /v1/events streams.
	MaxEventStreams = 64
)

// Bounds are the limits in force, as /v1/info reports them.
type Bounds struct {
	FileOpsPerSandbox, FileOps, ExecsPerSandbox, Execs, EventStreams int
	// NoFile is bothyd's RLIMIT_NOFILE (0: unknown).
	NoFile uint64
}

// bounds counts what is in flight against the limits. The zero value is ready.
type bounds struct {
	mu         sync.Mutex
	fileOps    int
	perSandbox map[string]int
	perVolume  map[string]int
	execs      int
	events     int
}

// admitFileOp counts a file operation on sandbox id, or refuses it: sandbox-busy when the
// sandbox has its most, unavailable when the server has. release must be called once it
// ends.
func (b *bounds) admitFileOp(id string) (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.perSandbox[id] >= MaxFileOpsPerSandbox:
		return nil, errcode.New(errcode.SandboxBusy,
			"Sandbox %s has %d file operations in flight, the most one sandbox may have; retry when one ends.", id, MaxFileOpsPerSandbox)
	case b.fileOps >= MaxFileOps:
		return nil, errcode.New(errcode.Unavailable,
			"The server has %d file operations in flight, the most it takes; retry shortly.", MaxFileOps)
	}
	if b.perSandbox == nil {
		b.perSandbox = map[string]int{}
	}
	b.perSandbox[id]++
	b.fileOps++
	return b.once(func() {
		b.fileOps--
		if b.perSandbox[id]--; b.perSandbox[id] == 0 {
			delete(b.perSandbox, id)
		}
	}), nil
}

// admitVolumeFileOp counts a file operation on volume name, or refuses it: limit-reached
// when the volume has its most, unavailable when the server has (the sandboxes' and the
// volumes' file operations count together). release must be called once it ends.
func (b *bounds) admitVolumeFileOp(name string) (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.perVolume[name] >= MaxFileOpsPerVolume:
		return nil, errcode.New(errcode.LimitReached,
			"Volume %s has %d file operations in flight, the most one volume may have; retry when one ends.", name, MaxFileOpsPerVolume)
	case b.fileOps >= MaxFileOps:
		return nil, errcode.New(errcode.Unavailable,
			"The server has %d file operations in flight, the most it takes; retry shortly.", MaxFileOps)
	}
	if b.perVolume == nil {
		b.perVolume = map[string]int{}
	}
	b.perVolume[name]++
	b.fileOps++
	return b.once(func() {
		b.fileOps--
		if b.perVolume[name]--; b.perVolume[name] == 0 {
			delete(b.perVolume, name)
		}
	}), nil
}

// admitExec counts an exec, or refuses it with unavailable when the server runs its most.
func (b *bounds) admitExec() (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.execs >= MaxExecs {
		return nil, errcode.New(errcode.Unavailable,
			"The server runs %d execs, the most it takes at once; retry shortly.", MaxExecs)
	}
	b.execs++
	return b.once(func() { b.execs-- }), nil
}

// admitEventStream counts an event stream, or refuses it with limit-reached (429).
func (b *bounds) admitEventStream() (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.events >= MaxEventStreams {
		return nil, errcode.New(errcode.LimitReached,
			"The server has %d event streams open, the most it takes; close one, or retry shortly.", MaxEventStreams)
	}
	b.events++
	return b.once(func() { b.events-- }), nil
}

// once makes f, run under b.mu, a release that counts only the first call.
func (b *bounds) once(f func()) func() {
	var done sync.Once
	return func() {
		done.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			f()
		})
	}
}

// Bounds reports the limits in force.
func (h *Handlers) Bounds() Bounds {
	return Bounds{
		FileOpsPerSandbox: MaxFileOpsPerSandbox, FileOps: MaxFileOps,
		ExecsPerSandbox: 1, Execs: MaxExecs, EventStreams: MaxEventStreams,
		NoFile: h.cfg.NoFileLimit,
	}
}

// BoundEvents wraps the /v1/events route so that at most MaxEventStreams are open at once; a
// refused one is an ordinary problem response.
func (h *Handlers) BoundEvents(serve func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		release, err := h.bounds.admitEventStream()
		if err != nil {
			return err
		}
		defer release()
		return serve(w, r)
	}
}

// releasingReader releases a file operation's slot when its body is closed, which the
// generated code does once the body is sent (or the client left).
type releasingReader struct {
	io.ReadCloser
	release func()
}

// WriteTo copies the body as its own reader would (a volume's file hands the response the
// file itself, for sendfile), keeping the slot until Close.
func (r *releasingReader) WriteTo(w io.Writer) (int64, error) { return io.Copy(w, r.ReadCloser) }

func (r *releasingReader) Close() error {
	defer r.release()
	return r.ReadCloser.Close()
}
