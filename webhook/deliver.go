package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// The headers of a delivery (docs/webhooks.md).
const (
	HeaderWebhookID = "Bothy-Webhook-Id"
	HeaderEventID   = "Bothy-Event-Id"
	HeaderEventType = "Bothy-Event-Type"
	HeaderAttempt   = "Bothy-Delivery-Attempt"
	HeaderTimestamp = "Bothy-Timestamp"
	HeaderSignature = "Bothy-Signature"
	// SignatureVersion prefixes the signature's hex, so that another scheme can be added
	// beside it later.
	SignatureVersion = "v1"
)

// maxAnswerBytes bounds what is read of a receiver's answer: only its status counts, and the
// rest is read so that the connection can be reused.
const maxAnswerBytes = 4 << 10

// Sign returns the value of the Bothy-Signature header of a delivery of body at timestamp (Unix
// seconds): "v1=" and the hex HMAC-SHA256, keyed with the webhook's secret, of the timestamp
// in decimal, a dot, and the body.
func Sign(secret []byte, timestamp int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(strconv.FormatInt(timestamp, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return SignatureVersion + "=" + hex.EncodeToString(m.Sum(nil))
}

// Verify reports whether signature (a Bothy-Signature header) signs body at timestamp with
// secret: what a receiver written in Go does, besides refusing a timestamp far from its clock.
func Verify(secret []byte, timestamp int64, body []byte, signature string) bool {
	return hmac.Equal([]byte(Sign(secret, timestamp, body)), []byte(signature))
}

// sender makes deliveries through a client that connects only where the guard allows, follows
// no redirect, uses no proxy and bounds every phase.
type sender struct {
	client *http.Client
}

func newSender(g guard, resolver string, timeout time.Duration) *sender {
	dialer := &net.Dialer{Timeout: timeout, Control: g.control}
	if resolver != "" {
		// Names resolve through that server alone; the guard judges the addresses it gives,
		// as it judges the host's resolvers' (on the address connected to).
		dialer.Resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			d := net.Dialer{Timeout: timeout}
			return d.DialContext(ctx, network, resolver)
		}}
	}
	tr := &http.Transport{
		Proxy:                  nil, // never a proxy from the environment: it would bypass the guard
		DialContext:            dialer.DialContext,
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: 16 << 10,
		MaxIdleConns:           MaxWebhooks,
		MaxIdleConnsPerHost:    1,
		MaxConnsPerHost:        DefaultMaxConcurrent,
		IdleConnTimeout:        90 * time.Second,
		ForceAttemptHTTP2:      true,
	}
	return &sender{client: &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // a redirect is an answer, and not a 2xx
		},
	}}
}

func (s *sender) close() { s.client.CloseIdleConnections() }

// deliver makes one attempt; it returns the answer's status (0 when none came) and an error
// for anything but a 2xx.
func (s *sender) deliver(ctx context.Context, h *hookRecord, e *entry, attempt int, now time.Time) (int, error) {
	ts := now.Unix()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(e.Body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "bothyd-webhook/1")
	req.Header.Set(HeaderWebhookID, h.ID)
	req.Header.Set(HeaderEventID, strconv.FormatInt(e.EventID, 10))
	req.Header.Set(HeaderEventType, e.Type)
	req.Header.Set(HeaderAttempt, strconv.Itoa(attempt))
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, Sign([]byte(h.Secret), ts, e.Body))
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, errors.New(describe(err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswerBytes))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("the receiver answered %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// describe is a short reason for a failed attempt, for the API and the log: the URL is the
// client's own, but its query (which may hold a token) is not repeated.
func describe(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, ErrPrivateAddress):
		return "refused to connect: the address is private"
	case errors.As(err, &ne) && ne.Timeout():
		return "the receiver did not answer in time"
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return "cannot connect: " + op.Err.Error()
	}
	return "the request failed"
}

// run delivers h's outbox, oldest event first, until ctx ends.
func (m *Manager) run(ctx context.Context, h *hook) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		m.mu.Lock()
		var e *entry
		if len(h.pending) > 0 {
			e = h.pending[0]
		}
		m.mu.Unlock()
		if e == nil {
			select {
			case <-h.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		if wait := e.NextAt.Sub(m.o.Now()); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
		select {
		case m.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		full, err := readRecord[entry](h.dir, entryName(e.EventID), entryFormat)
		if err != nil {
			<-m.sem
			m.unreadable(h, e, err)
			continue
		}
		attempt := e.Attempts + 1
		now := m.o.Now()
		status, err := m.send.deliver(ctx, &h.rec, full, attempt, now)
		<-m.sem
		if ctx.Err() != nil {
			return // cut off by a delete or a shutdown: the entry stays for the next start
		}
		m.settle(h, e, full.Body, attempt, now, status, err)
	}
}

// unreadable gives up an outbox entry whose file no longer reads: it is counted as failed and
// left on disk, where bothyd check reports it.
func (m *Manager) unreadable(h *hook, e *entry, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h.deleted || len(h.pending) == 0 || h.pending[0] != e {
		return
	}
	h.pending = h.pending[1:]
	h.state.Failed++
	m.log.Error("webhooks: an outbox entry does not read; it is not delivered", "webhook", h.rec.ID, "event", e.EventID, "err", err)
}

// settle records the outcome of an attempt: a delivered or given-up entry leaves the outbox,
// a failed one waits for its next attempt, durably.
func (m *Manager) settle(h *hook, e *entry, body []byte, attempt int, at time.Time, status int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h.deleted {
		return
	}
	at = at.UTC()
	h.state.LastAttemptAt, h.state.LastStatus = &at, status
	done := err == nil
	if done {
		h.state.Delivered++
		h.state.LastError = ""
		h.state.LastSuccessAt = &at
	} else {
		h.state.LastError = err.Error()
		m.log.Info("webhooks: a delivery failed; it is retried", "webhook", h.rec.ID, "event", e.EventID, "attempt", attempt, "status", status, "reason", h.state.LastError)
		if at.Sub(e.EnqueuedAt) >= m.o.MaxAge {
			h.state.Failed++
			done = true
			m.log.Warn("webhooks: an event was not delivered in time; it is given up", "webhook", h.rec.ID, "event", e.EventID, "attempts", attempt)
		}
	}
	if done {
		// Removed without a sync of the directory: a crash that undoes the removal delivers
		// the event again, which at-least-once allows.
		if rmErr := os.Remove(filepath.Join(h.dir, entryName(e.EventID))); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
			m.log.Warn("webhooks: removing a delivered event from the outbox", "webhook", h.rec.ID, "event", e.EventID, "err", rmErr)
		}
		h.pending = h.pending[1:]
	} else {
		e.Attempts = attempt
		e.NextAt = at.Add(m.backoff(attempt))
		rec := *e
		rec.Body = body
		if werr := writeRecord(h.dir, entryName(e.EventID), &rec); werr != nil {
			m.log.Warn("webhooks: recording a delivery's attempts", "webhook", h.rec.ID, "event", e.EventID, "err", werr)
		}
	}
	h.state.Format = stateFormat
	if werr := writeRecord(h.dir, StateName, &h.state); werr != nil {
		m.log.Warn("webhooks: recording the delivery state", "webhook", h.rec.ID, "err", werr)
	}
}

// backoff is the wait after the attempt-th failed attempt: RetryBase doubled per attempt, up to
// RetryMax, with up to a quarter added at random so that receivers that come back are not
// met by every webhook at once.
func (m *Manager) backoff(attempt int) time.Duration {
	d := m.o.RetryBase
	for i := 1; i < attempt && d < m.o.RetryMax; i++ {
		d *= 2
	}
	d = min(d, m.o.RetryMax)
	return d + time.Duration(rand.Int64N(int64(d)/4+1)) //nolint:gosec // jitter, not a secret
}
