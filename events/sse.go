package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Defaults of the SSE handler.
const (
	// DefaultHeartbeat is how often an idle stream gets a comment line, so that proxies and
	// browsers keep it open; the contract promises one every 15 seconds.
	DefaultHeartbeat = 15 * time.Second
	// writeWait bounds one write: a client that stops reading is dropped rather than holding
	// the handler forever.
	writeWait = 10 * time.Second
	// retryMillis tells EventSource how soon to reconnect after a stream ends.
	retryMillis = 2000
)

// Handler serves GET /v1/events from a Bus.
type Handler struct {
	Bus *Bus
	// Heartbeat is the interval of ": ping" comments; DefaultHeartbeat when zero.
	Heartbeat time.Duration
	Logger    *slog.Logger
}

// ServeEvents streams events as text/event-stream until the client goes away, the subscriber
// is dropped for falling behind, or the bus closes. A Last-Event-ID header (sent by
// EventSource when it reconnects) first replays what the client missed. Its signature is the
// server's HandlerFunc; it never fails before writing, so it always returns nil.
func (h *Handler) ServeEvents(w http.ResponseWriter, r *http.Request) error {
	log := h.Logger
	if log == nil {
		log = slog.Default()
	}
	// Only ids this server sent are meaningful; anything else (the contract has no error for
	// it) is ignored, and the stream starts from now, as for a first connection.
	replay, lastID := false, int64(0)
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n >= 0 {
			replay, lastID = true, n
		} else {
			log.Debug("event stream: ignoring a Last-Event-ID this server did not send", "last_event_id", v)
		}
	}
	rc := http.NewResponseController(w)
	sub := h.Bus.Subscribe(replay, lastID)
	defer sub.Close()

	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Accel-Buffering", "no") // tell a buffering reverse proxy to pass events on at once
	w.WriteHeader(http.StatusOK)

	heartbeat := h.Heartbeat
	if heartbeat <= 0 {
		heartbeat = DefaultHeartbeat
	}
	var buf bytes.Buffer
	write := func() bool {
		_ = rc.SetWriteDeadline(time.Now().Add(writeWait))
		_, err := w.Write(buf.Bytes())
		buf.Reset()
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			log.Debug("event stream: client gone", "err", err)
			return false
		}
		return true
	}
	// The retry hint and an opening comment go out at once, so that the client sees the
	// stream open (and knows it is subscribed) before the first event.
	buf.WriteString("retry: " + strconv.Itoa(retryMillis) + "\n: connected\n\n")
	if !write() {
		return nil
	}

	ctx := r.Context()
	for {
		// Wait for the next event; an idle interval sends a heartbeat instead.
		wctx, cancel := context.WithTimeout(ctx, heartbeat)
		e, err := sub.Next(wctx)
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			buf.WriteString(": ping\n\n")
			if !write() {
				return nil
			}
			continue
		case errors.Is(err, ErrDropped):
			log.Info("event stream: the subscriber fell behind and was dropped; it reconnects with Last-Event-ID")
			return nil
		default:
			return nil // the client went away, or the server is shutting down
		}
		data, err := json.Marshal(e)
		if err != nil {
			log.Error("event stream: encoding an event", "err", err)
			continue
		}
		buf.WriteString("id: " + strconv.FormatInt(e.Seq, 10) + "\n")
		buf.WriteString("event: " + string(e.Type) + "\n")
		buf.WriteString("data: ")
		buf.Write(data)
		buf.WriteString("\n\n")
		if !write() {
			return nil
		}
	}
}
