package webhook

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/platform"
)

// Defaults and bounds of Options and of webhooks.
const (
	DefaultRetryBase     = time.Second
	DefaultRetryMax      = 5 * time.Minute
	DefaultMaxAge        = 24 * time.Hour
	DefaultTimeout       = 10 * time.Second
	DefaultMaxPending    = 1000
	DefaultMaxConcurrent = 8
	// MaxWebhooks bounds the webhooks of a server, and so its outboxes and delivery workers.
	MaxWebhooks = 32
	// MaxBodyBytes bounds one delivery's body: an event larger than this is not enqueued
	// (events are small; this is a guard, not a limit anyone meets).
	MaxBodyBytes = 64 << 10
	// MaxURLLength, MinSecretLength and MaxSecretLength bound a create request.
	MaxURLLength    = 2048
	MinSecretLength = 16
	MaxSecretLength = 256
)

// Options configure a Manager.
type Options struct {
	// Root is the state root; the records are in Root/webhooks.
	Root string
	// AllowPrivate lets deliveries reach private, loopback and link-local addresses and the
	// sandbox subnets: the operator's flag --webhook-allow-private, for receivers on the
	// host or its network (and tests).
	AllowPrivate bool
	// DenyPrefixes are refused besides the private ranges: the sandbox subnets.
	DenyPrefixes []netip.Prefix
	// Resolver is the DNS server (host:port) through which receivers' names are resolved:
	// the operator's --webhook-resolver, for a split horizon (and tests, whose generated
	// names must not reach the host's resolvers); empty: the host's resolvers.
	Resolver string
	// EventTypes are the types a webhook may name; nil: any.
	EventTypes []string
	// RetryBase and RetryMax bound the backoff between attempts; MaxAge is how long an event
	// is retried before it is given up; Timeout bounds one attempt, connection included.
	RetryBase, RetryMax, MaxAge, Timeout time.Duration
	// MaxPending bounds each webhook's outbox: an event past it is dropped, and counted.
	MaxPending int
	// MaxConcurrent bounds the deliveries in flight across all webhooks.
	MaxConcurrent int
	Logger        *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Webhook is a webhook as the API shows it: never its secret.
type Webhook struct {
	ID        string
	URL       string
	Events    []string
	CreatedAt time.Time
	Delivery  Delivery
}

// Delivery is a webhook's delivery state.
type Delivery struct {
	// Pending counts the events in its outbox.
	Pending int
	// Delivered, Failed (given up after MaxAge) and Dropped (refused by a full outbox) count
	// events since the webhook was made.
	Delivered, Failed, Dropped int64
	LastAttemptAt              *time.Time
	// LastStatus is the HTTP status of the last attempt's answer, 0 when none came.
	LastStatus int
	// LastError says why the last attempt failed; "" when it succeeded.
	LastError     string
	LastSuccessAt *time.Time
	// NextAttemptAt is when the oldest pending event is tried next; nil when none is pending.
	NextAttemptAt *time.Time
}

// CreateRequest is what a client gives to make a webhook.
type CreateRequest struct {
	// ID, when set, is the webhook's id (wh- and 16 hex digits), which a cluster's router
	// gives so that one webhook has one id on every node; "" makes a new one.
	ID     string
	URL    string
	Events []string
	Secret string
}

// hook is one webhook and its outbox, in memory.
type hook struct {
	rec     hookRecord
	dir     string // its outbox directory
	pending []*entry
	state   deliveryState
	wake    chan struct{} // signalled when an entry is added
	cancel  context.CancelFunc
	done    chan struct{}
	deleted bool
}

// Manager keeps the webhooks of a state root and delivers their events.
type Manager struct {
	o    Options
	dir  string
	lock *os.File
	log  *slog.Logger
	send *sender
	sem  chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	hooks   map[string]*hook
	started bool // Start was called: webhooks made later deliver at once
	closed  bool
}

// Open loads the webhooks of o.Root, taking its lock (one server delivers), and removes what
// interrupted writes and deletes left. Deliveries start with [Manager.Start].
func Open(o Options) (*Manager, error) {
	if o.RetryBase <= 0 {
		o.RetryBase = DefaultRetryBase
	}
	if o.RetryMax <= 0 {
		o.RetryMax = DefaultRetryMax
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPending
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = DefaultMaxConcurrent
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if err := platform.EnsureDir(o.Root, Dir, 0o700); err != nil {
		return nil, fmt.Errorf("webhook: the records directory: %w", err)
	}
	dir := filepath.Join(o.Root, Dir)
	lf, err := platform.OpenFile(filepath.Join(dir, LockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("webhook: the lock: %w", err)
	}
	if ok, err := platform.TryLock(lf); err != nil || !ok {
		lf.Close()
		if err == nil {
			err = errors.New("another process holds it")
		}
		return nil, fmt.Errorf("webhook: the lock %s: %w", filepath.Join(dir, LockName), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{o: o, dir: dir, lock: lf, log: o.Logger, sem: make(chan struct{}, o.MaxConcurrent),
		send: newSender(guard{allowPrivate: o.AllowPrivate, deny: o.DenyPrefixes}, o.Resolver, o.Timeout),
		ctx:  ctx, cancel: cancel, hooks: map[string]*hook{}}
	probs, err := scan(dir, true, m.load)
	if err != nil {
		m.Close()
		return nil, err
	}
	for _, p := range probs {
		if p.Repaired {
			m.log.Info("webhooks: removed what an interrupted write or delete left", "entry", filepath.Join(Dir, p.Entry), "what", p.Detail)
		} else {
			m.log.Warn("webhooks: a record cannot be used; bothyd check reports it", "entry", filepath.Join(Dir, p.Entry), "problem", p.Detail)
		}
	}
	return m, nil
}

// load takes in a webhook found by the start-up scan.
func (m *Manager) load(rec *hookRecord, entries []*entry, st *deliveryState) {
	h := &hook{rec: *rec, dir: filepath.Join(m.dir, rec.ID), pending: entries, wake: make(chan struct{}, 1)}
	if st != nil {
		h.state = *st
	}
	m.hooks[rec.ID] = h
}

// Start starts delivering every webhook's outbox.
func (m *Manager) Start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.started = true
	for _, h := range m.hooks {
		m.startLocked(h)
	}
}

func (m *Manager) startLocked(h *hook) {
	if !m.started || m.closed || h.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(m.ctx)
	h.cancel, h.done = cancel, make(chan struct{})
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(h.done)
		m.run(ctx, h)
	}()
}

// Close stops the deliveries (an attempt in flight is cut off, and tried again after the next
// start) and releases the lock.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
	m.send.close()
	if m.lock != nil {
		m.lock.Close()
	}
}

// Create validates and records a webhook, durably, and starts delivering to it.
func (m *Manager) Create(req CreateRequest) (*Webhook, error) {
	if err := m.validate(req); err != nil {
		return nil, err
	}
	events := slices.Clone(req.Events)
	slices.Sort(events)
	events = slices.Compact(events)
	id := req.ID
	if id == "" {
		id = "wh-" + naming.RandomHex(8)
	}
	rec := hookRecord{Format: hookFormat, ID: id, URL: req.URL, Events: events,
		Secret: req.Secret, CreatedAt: m.o.Now().UTC().Truncate(time.Second)}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errcode.New(errcode.Unavailable, "The server is shutting down; try again once it is back.")
	}
	if had, ok := m.hooks[id]; ok {
		// A create naming an id it made already (a router's retry) answers that webhook;
		// one that differs would silently change what the client's webhook is.
		same := had.rec.URL == rec.URL && slices.Equal(had.rec.Events, rec.Events) &&
			subtle.ConstantTimeCompare([]byte(had.rec.Secret), []byte(rec.Secret)) == 1
		if !same {
			return nil, errcode.New(errcode.WebhookExists, "A webhook %q exists with another URL, event types or secret; delete it first, or create this one without an id.", id)
		}
		w := m.viewLocked(had)
		return &w, nil
	}
	if len(m.hooks) >= MaxWebhooks {
		return nil, errcode.New(errcode.LimitReached, "This server has %d webhooks, as many as allowed; delete one you no longer need.", MaxWebhooks)
	}
	// The record first: a crash after it leaves a webhook whose outbox the start-up makes; a
	// crash before it leaves nothing.
	if err := writeRecord(m.dir, rec.ID+recordExt, &rec); err != nil {
		return nil, errcode.Storage(fmt.Errorf("webhook: recording %s: %w", rec.ID, err), m.o.Root)
	}
	h := &hook{rec: rec, dir: filepath.Join(m.dir, rec.ID), wake: make(chan struct{}, 1)}
	if err := platform.EnsureDir(m.dir, rec.ID, 0o700); err != nil {
		_ = os.Remove(filepath.Join(m.dir, rec.ID+recordExt))
		return nil, errcode.Storage(fmt.Errorf("webhook: the outbox of %s: %w", rec.ID, err), m.o.Root)
	}
	m.hooks[rec.ID] = h
	m.startLocked(h)
	m.log.Info("webhook created", "webhook", rec.ID, "url", redactURL(rec.URL), "events", rec.Events)
	w := m.viewLocked(h)
	return &w, nil
}

func (m *Manager) validate(req CreateRequest) error {
	if req.ID != "" && !validID(req.ID) {
		return errcode.Invalid("id", "A webhook's id is wh- and 16 hexadecimal digits (0-9, a-f); give one such, or none.")
	}
	if len(req.URL) > MaxURLLength {
		return errcode.Invalid("url", "The URL is longer than %d characters; give a shorter one.", MaxURLLength)
	}
	u, err := url.Parse(req.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return errcode.Invalid("url", "The URL must be an absolute http:// or https:// URL with a host.")
	}
	if u.User != nil {
		return errcode.Invalid("url", "The URL must not carry a user or password; the signature authenticates deliveries.")
	}
	if u.Fragment != "" {
		return errcode.Invalid("url", "The URL must not have a fragment (#...); it is never sent.")
	}
	if ip, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err == nil {
		g := guard{allowPrivate: m.o.AllowPrivate, deny: m.o.DenyPrefixes}
		if err := g.check(ip.WithZone("")); err != nil {
			return errcode.Invalid("url", "The URL's address %s is private to this host or its sandboxes, where deliveries never go; give a public receiver (the operator can allow private ones with --webhook-allow-private).", ip)
		}
	}
	if len(req.Events) == 0 {
		return errcode.Invalid("events", "Name at least one event type to deliver (see EventType in /openapi.yaml).")
	}
	for _, t := range req.Events {
		if m.o.EventTypes != nil && !slices.Contains(m.o.EventTypes, t) {
			return errcode.Invalid("events", "%q is not an event type this server sends; see EventType in /openapi.yaml.", t)
		}
	}
	if n := len(req.Secret); n < MinSecretLength || n > MaxSecretLength {
		return errcode.Invalid("secret", "The secret must be %d to %d characters long; use a long random one.", MinSecretLength, MaxSecretLength)
	}
	return nil
}

// validID reports whether id is a webhook id as the server makes them: wh- and 16 lowercase
// hexadecimal digits (it names the webhook's record and outbox in the state root).
func validID(id string) bool {
	hex, ok := strings.CutPrefix(id, "wh-")
	if !ok || len(hex) != 16 {
		return false
	}
	for _, c := range hex {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Get returns the webhook id.
func (m *Manager) Get(id string) (*Webhook, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.hooks[id]
	if !ok {
		return nil, notFound(id)
	}
	w := m.viewLocked(h)
	return &w, nil
}

// List returns every webhook, oldest first.
func (m *Manager) List() []Webhook {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Webhook, 0, len(m.hooks))
	for _, h := range m.hooks {
		out = append(out, m.viewLocked(h))
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Delete removes the webhook id and its outbox: its pending events are not delivered.
func (m *Manager) Delete(id string) error {
	m.mu.Lock()
	h, ok := m.hooks[id]
	if !ok {
		m.mu.Unlock()
		return notFound(id)
	}
	// The record first, durably: a crash after it leaves an outbox without a record, which
	// the start-up removes; the webhook is gone either way.
	if err := removeDurable(m.dir, id+recordExt); err != nil {
		m.mu.Unlock()
		return errcode.Storage(fmt.Errorf("webhook: removing %s: %w", id, err), m.o.Root)
	}
	h.deleted = true
	delete(m.hooks, id)
	cancel, done := h.cancel, h.done
	m.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	if err := os.RemoveAll(h.dir); err != nil {
		m.log.Warn("webhooks: removing a deleted webhook's outbox; the next start-up does", "webhook", id, "err", err)
	}
	m.log.Info("webhook deleted", "webhook", id)
	return nil
}

func notFound(id string) error {
	return errcode.New(errcode.WebhookNotFound, "There is no webhook %q; list them with GET /v1/webhooks.", id)
}

// Enqueue puts e in the outbox of every webhook that asked for its type, durably, before it
// returns: an event whose publication returned is delivered even if the server crashes next.
// A full outbox drops the event for that webhook and counts it (Delivery.Dropped).
func (m *Manager) Enqueue(e openapi.Event) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || len(m.hooks) == 0 {
		return
	}
	var body []byte
	for _, h := range m.hooks {
		if !slices.Contains(h.rec.Events, e.Type) {
			continue
		}
		if body == nil {
			b, err := json.Marshal(e)
			if err != nil || len(b) > MaxBodyBytes {
				m.log.Error("webhooks: an event cannot be delivered", "event", e.Seq, "type", e.Type, "bytes", len(b), "err", err)
				return
			}
			body = b
		}
		if len(h.pending) >= m.o.MaxPending {
			h.state.Dropped++
			m.log.Warn("webhooks: the outbox is full; the event is dropped for this webhook", "webhook", h.rec.ID, "event", e.Seq, "pending", len(h.pending))
			continue
		}
		now := m.o.Now().UTC()
		en := &entry{Format: entryFormat, EventID: e.Seq, Type: e.Type, Body: body, EnqueuedAt: now, NextAt: now}
		if err := writeRecord(h.dir, entryName(e.Seq), en); err != nil {
			h.state.Dropped++
			m.log.Error("webhooks: the event could not be recorded in the outbox; it is not delivered", "webhook", h.rec.ID, "event", e.Seq, "err", err)
			continue
		}
		// The body stays on disk only: pending events cost memory by their count, not their
		// size (it is read again for each attempt).
		h.pending = append(h.pending, &entry{Format: entryFormat, EventID: e.Seq, Type: e.Type, EnqueuedAt: now, NextAt: now})
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
}

// viewLocked is h as the API shows it. The caller holds m.mu.
func (m *Manager) viewLocked(h *hook) Webhook {
	d := Delivery{Pending: len(h.pending), Delivered: h.state.Delivered, Failed: h.state.Failed, Dropped: h.state.Dropped,
		LastAttemptAt: h.state.LastAttemptAt, LastStatus: h.state.LastStatus, LastError: h.state.LastError, LastSuccessAt: h.state.LastSuccessAt}
	if len(h.pending) > 0 {
		t := h.pending[0].NextAt
		d.NextAttemptAt = &t
	}
	return Webhook{ID: h.rec.ID, URL: h.rec.URL, Events: slices.Clone(h.rec.Events), CreatedAt: h.rec.CreatedAt, Delivery: d}
}

// removeDurable removes dir/name and syncs dir.
func removeDurable(dir, name string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return platform.SyncDirPath(dir)
}

// redactURL is u for a log: without its query, which may carry a receiver's token.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	u.RawQuery, u.User, u.Fragment = "", nil, ""
	return u.String()
}
