package bothy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// EventStream follows /v1/events. Read it from one goroutine with [EventStream.Next]; close it
// when done.
type EventStream struct {
	body io.ReadCloser
	r    *bufio.Reader
	// LastID is the id of the last event read, for a reconnect that resumes after it.
	LastID string
}

// Events subscribes to the lifecycle events from now on, or, with since (an event's id), to
// those after it that the server still holds first.
func (c *Client) Events(ctx context.Context, since string) (*EventStream, error) {
	h := http.Header{"Accept": {"text/event-stream"}}
	if since != "" {
		h.Set("Last-Event-ID", since)
	}
	body, err := c.stream(ctx, request{method: http.MethodGet, path: "/v1/events", header: h})
	if err != nil {
		return nil, err
	}
	return &EventStream{body: body, r: bufio.NewReaderSize(body, 64<<10)}, nil
}

// Next returns the next event; it blocks until one comes, the context of [Client.Events] is
// done, or the server ends the stream (io.EOF).
func (s *EventStream) Next() (Event, error) {
	var data strings.Builder
	var id string
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" {
				return Event{}, io.EOF
			}
			return Event{}, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if data.Len() == 0 {
				continue
			}
			var ev Event
			if err := json.Unmarshal([]byte(data.String()), &ev); err != nil {
				return Event{}, fmt.Errorf("bothyd: an event does not decode: %w", err)
			}
			if id != "" {
				s.LastID = id
			}
			return ev, nil
		case strings.HasPrefix(line, ":"):
			// A comment: the server's keep-alive ping.
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "data":
				if data.Len() > 0 {
					data.WriteByte('\n')
				}
				data.WriteString(value)
			case "id":
				id = value
			}
		}
	}
}

// Close ends the subscription.
func (s *EventStream) Close() error { return s.body.Close() }

// StateDeleted is the state [Client.Wait] waits for to see a sandbox gone.
const StateDeleted SandboxState = "deleted"

// Wait returns the sandbox as soon as it is in state (at once if it already is), or an error
// matching [ErrWaitTimeout] after timeout (0: a minute). Waiting for [StateDeleted] returns
// nil, nil once the sandbox is gone; for any other state a sandbox that is gone is
// [ErrSandboxNotFound].
func (c *Client) Wait(ctx context.Context, id string, state SandboxState, timeout time.Duration) (*Sandbox, error) {
	if timeout <= 0 {
		timeout = time.Minute
	}
	q := url.Values{"state": {string(state)}, "timeout_ms": {millis(timeout)}}
	var sb Sandbox
	// The server holds the request up to timeout; give the answer a little longer to come.
	cctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	status, err := c.call(cctx, request{method: http.MethodGet, path: sandboxPath(id, "/wait"), query: q}, &sb, http.StatusOK, http.StatusNoContent)
	switch {
	case err == nil && status == http.StatusNoContent:
		return nil, nil
	case err == nil:
		return &sb, nil
	case IsUnsupported(err):
		return c.waitByEvents(ctx, id, state, timeout)
	default:
		return nil, err
	}
}

// waitByEvents waits for a state by following the event stream, for a server without
// GET /wait. It subscribes before it reads the sandbox, so that a change between the read
// and the subscription cannot be missed.
func (c *Client) waitByEvents(ctx context.Context, id string, state SandboxState, timeout time.Duration) (*Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	events, err := c.Events(ctx, "")
	if err != nil {
		return nil, err
	}
	defer events.Close()
	timedOut := func(err error) error {
		if ctx.Err() != nil {
			return &APIError{Status: http.StatusRequestTimeout, Code: ErrWaitTimeout,
				Detail: fmt.Sprintf("Sandbox %s was not %s within %s.", id, state, timeout)}
		}
		return err
	}
	for {
		sb, err := c.Get(ctx, id)
		switch {
		case err != nil && state == StateDeleted && IsCode(err, ErrSandboxNotFound):
			return nil, nil
		case err != nil:
			return nil, timedOut(err)
		case sb.State == state:
			return sb, nil
		}
		// Read events until one says this sandbox changed, then look again: an event's state
		// is the state it entered, but the sandbox may have moved on since.
		for {
			ev, err := events.Next()
			if err != nil {
				return nil, timedOut(err)
			}
			if ev.Sandbox != nil && *ev.Sandbox == id {
				break
			}
		}
	}
}

// FormatEvent is an event on one line, as `bothy events` prints it.
func FormatEvent(ev Event) string {
	var b strings.Builder
	b.WriteString(ev.At.Local().Format(time.RFC3339))
	b.WriteString(" ")
	b.WriteString(strconv.FormatInt(ev.Seq, 10))
	b.WriteString(" ")
	b.WriteString(string(ev.Type))
	for _, kv := range []struct {
		k string
		v *string
	}{{"sandbox", ev.Sandbox}, {"template", ev.Template}, {"generation", ev.Generation}, {"lease", ev.Lease}} {
		if kv.v != nil {
			fmt.Fprintf(&b, " %s=%s", kv.k, *kv.v)
		}
	}
	if ev.State != nil {
		fmt.Fprintf(&b, " state=%s", *ev.State)
	}
	return b.String()
}
