package handlers

import (
	"context"
	"errors"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/events"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// defaultWait is how long a wait for a state lasts when the request names no timeout_ms.
const defaultWait = 60 * time.Second

func (h *Handlers) PauseSandbox(ctx context.Context, req openapi.PauseSandboxRequestObject) (openapi.PauseSandboxResponseObject, error) {
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	pause := h.sup.Pause
	if req.Body != nil && req.Body.Memory != nil {
		switch *req.Body.Memory {
		case openapi.PauseMemoryRelease:
			pause = h.sup.PauseReleasing
		case openapi.PauseMemoryKeep:
		default:
			return nil, errcode.Invalid("memory", "memory is keep or release, not %q.", *req.Body.Memory)
		}
	}
	st, err := pause(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return openapi.PauseSandbox200JSONResponse(apiSandbox(st)), nil
}

func (h *Handlers) ResumeSandbox(ctx context.Context, req openapi.ResumeSandboxRequestObject) (openapi.ResumeSandboxResponseObject, error) {
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	st, err := h.sup.Resume(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return openapi.ResumeSandbox200JSONResponse(apiSandbox(st)), nil
}

func (h *Handlers) SetSandboxTimeout(ctx context.Context, req openapi.SetSandboxTimeoutRequestObject) (openapi.SetSandboxTimeoutResponseObject, error) {
	if req.Body == nil {
		return nil, errcode.Invalid("timeout_s", "Send the lifetime as {\"timeout_s\": N}; 0 clears it.")
	}
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	st, err := h.sup.SetTimeout(ctx, req.ID, lifetime(req.Body.TimeoutS, req.Body.OnTimeout))
	if err != nil {
		return nil, err
	}
	return openapi.SetSandboxTimeout200JSONResponse(apiSandbox(st)), nil
}

// lifetime maps a request's timeout_s and on_timeout onto a lifetime; nil for 0.
func lifetime(seconds int, on *openapi.OnTimeout) *supervisor.Lifetime {
	if seconds <= 0 {
		return nil
	}
	lt := &supervisor.Lifetime{Timeout: time.Duration(seconds) * time.Second, OnTimeout: supervisor.TimeoutStop}
	if on != nil {
		lt.OnTimeout = supervisor.OnTimeout(*on)
	}
	return lt
}

// WaitSandbox answers once the sandbox is in the state asked for. It subscribes to the event
// bus before it first reads the sandbox, so that no change falls between the read and the
// subscription, and reads the sandbox again only when an event names it: the store is not
// polled. A subscription that the bus drops (it fell behind) is made anew, with a read.
func (h *Handlers) WaitSandbox(ctx context.Context, req openapi.WaitSandboxRequestObject) (openapi.WaitSandboxResponseObject, error) {
	d := defaultWait
	if req.Params.TimeoutMs != nil {
		d = time.Duration(*req.Params.TimeoutMs) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	want := string(req.Params.State)
	for {
		var sub *events.Subscription
		if h.cfg.Events != nil {
			sub = h.cfg.Events.Subscribe(false, 0)
		}
		st, err := h.sup.Status(req.ID)
		switch {
		case errcode.Of(err) == errcode.SandboxNotFound && want == string(openapi.WaitSandboxParamsStateDeleted):
			closeSub(sub)
			return openapi.WaitSandbox204Response{}, nil
		case err != nil:
			closeSub(sub)
			return nil, err
		case string(st.State) == want:
			closeSub(sub)
			return openapi.WaitSandbox200JSONResponse(apiSandbox(st)), nil
		}
		err = nextAbout(ctx, sub, req.ID)
		closeSub(sub)
		switch {
		case errors.Is(err, events.ErrDropped):
			continue
		case errors.Is(err, events.ErrClosed):
			return nil, errcode.New(errcode.Unavailable, "The server is shutting down; wait again once it is back.")
		case errors.Is(err, context.DeadlineExceeded):
			return nil, errcode.New(errcode.WaitTimeout, "Sandbox %s is still %s after %d ms; wait again, or look at its state and logs.", req.ID, st.State, d.Milliseconds())
		case err != nil:
			return nil, err
		}
	}
}

// nextAbout waits for the next event about the sandbox id. Without a bus only ctx ends it.
func nextAbout(ctx context.Context, sub *events.Subscription, id string) error {
	if sub == nil {
		<-ctx.Done()
		return ctx.Err()
	}
	for {
		e, err := sub.Next(ctx)
		if err != nil {
			return err
		}
		if e.Sandbox != nil && *e.Sandbox == id {
			return nil
		}
	}
}

func closeSub(sub *events.Subscription) {
	if sub != nil {
		sub.Close()
	}
}
