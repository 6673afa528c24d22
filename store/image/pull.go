package image

import (
	"context"
	"sync"

	"github.com/bothy/bothy/errcode"
)

// Fetcher resolves a reference to an image's parts. store/image/registry implements it with
// the OCI distribution protocol; the store itself speaks no network protocol.
type Fetcher interface {
	// Fetch resolves ref (to the host's platform when it names an index) and returns the
	// image's manifest digest, configuration and layers; the layers' blobs are read only
	// when opened.
	Fetch(ctx context.Context, ref string) (*Source, error)
}

// flight is one pull in progress in this process, shared by every Pull of its ref that
// starts while it runs.
type flight struct {
	done chan struct{}
	img  *Image
	err  error

	mu      sync.Mutex
	waiters int
	cancel  context.CancelFunc
	subs    []Progress
}

func (f *flight) progress(p LayerProgress) {
	f.mu.Lock()
	subs := append([]Progress(nil), f.subs...)
	f.mu.Unlock()
	for _, fn := range subs {
		fn(p)
	}
}

// leave drops a waiter; when the last one has gone the pull is cancelled.
func (f *flight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waiters--
	if f.waiters == 0 {
		f.cancel()
	}
}

// Pull fetches ref with the store's [Fetcher] and records it as the image name. Two pulls
// of one ref share one download: within this process the second joins the first (receiving
// its progress from then on and its outcome), and across processes it waits, as long as
// ctx allows, for the other's work lock and then finds the layers present. Layers the store
// holds already, from any image, are not downloaded again.
//
// The shared pull runs until it ends or every Pull waiting for it has returned (its ctx
// ended); a joiner that asked for another name records that name itself once the pull is
// done. ctx must have a deadline, which bounds the wait for another process's pull.
func (s *Store) Pull(ctx context.Context, ref, name string, progress Progress) (*Image, error) {
	if s.opts.Fetcher == nil {
		return nil, errcode.New(errcode.Unavailable, "This server pulls no images: it has no registry client configured.")
	}
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if ref == "" {
		return nil, errcode.Invalid("ref", "Give the reference of the image to pull.")
	}
	f, runCtx, first := s.join(ctx, ref, progress)
	if first {
		go s.fly(ctx, runCtx, f, ref, name)
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		f.leave()
		return nil, ctx.Err()
	}
	f.leave()
	if f.err != nil {
		return nil, f.err
	}
	if f.img.Name == name {
		return f.img, nil
	}
	img := *f.img
	img.Name = name
	if err := s.commit(ctx, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// join returns the flight of ref, making it if there is none (first is then true, and
// runCtx is the new flight's context). The flight's context is detached from ctx, so that
// the first caller leaving does not end a pull that others wait for.
func (s *Store) join(ctx context.Context, ref string, progress Progress) (f *flight, runCtx context.Context, first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f = s.flights[ref]
	if f != nil {
		f.mu.Lock()
		abandoned := f.waiters == 0 // every waiter left: it is being cancelled
		f.mu.Unlock()
		if abandoned {
			f = nil
		}
	}
	if f == nil {
		f = &flight{done: make(chan struct{})}
		runCtx, f.cancel = context.WithCancel(context.WithoutCancel(ctx))
		s.flights[ref] = f
		first = true
	}
	f.mu.Lock()
	f.waiters++
	if progress != nil {
		f.subs = append(f.subs, progress)
	}
	f.mu.Unlock()
	return f, runCtx, first
}

// fly runs the pull of f in runCtx. It keeps the first caller's deadline (ctx's) for the
// wait on another process's work lock.
func (s *Store) fly(ctx, runCtx context.Context, f *flight, ref, name string) {
	defer func() {
		f.cancel()
		s.mu.Lock()
		if s.flights[ref] == f {
			delete(s.flights, ref)
		}
		s.mu.Unlock()
		close(f.done)
	}()
	lockCtx, lcancel := context.WithCancel(runCtx)
	if dl, ok := ctx.Deadline(); ok {
		lockCtx, lcancel = context.WithDeadline(runCtx, dl)
	}
	w, err := s.lockWork(lockCtx, pullKey(ref), false)
	lcancel()
	if err != nil {
		f.err = err
		return
	}
	defer func() { _ = w.release() }()
	src, err := s.opts.Fetcher.Fetch(runCtx, ref)
	if err != nil {
		f.err = err
		return
	}
	src.Ref = ref
	f.img, f.err = s.add(runCtx, name, src, f.progress)
}
