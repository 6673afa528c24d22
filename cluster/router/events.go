package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The cluster's event stream (GET /v1/events through the router; docs/cluster.md, "Events
// across the cluster").
//
// Each router follows every node's own stream with one subscription per node (a follower),
// whatever the number of clients, and keeps the last eventHistory events of each node in a
// ring, as a node keeps its own. A client's stream is a position in those rings: for each node,
// the node's own sequence number of the last event the client was sent. The SSE id of each
// event sent is that position, encoded (cursor), so any router replica, which follows the
// same nodes and reads the same sequence numbers from them, resumes the client exactly where
// it was: the events of each node after its position, no more, no fewer. The order between
// nodes is the order in which this router received them, which replicas need not share; the
// position does not depend on it.
const (
	// eventHistory is how many events of each node a router keeps, as many as a node keeps
	// (events.DefaultHistory): a client that comes back within them misses nothing.
	eventHistory = 1024
	// DefaultMaxEventClients bounds the streams a router serves at once; one more is
	// answered 429 limit-reached.
	DefaultMaxEventClients = 256
	// eventHeartbeat is the interval of the ": ping" comments, as on a node.
	eventHeartbeat = 15 * time.Second
	// eventWriteWait bounds one write to a client: a client that stops reading is dropped.
	eventWriteWait = 10 * time.Second
	// nodeSilence is how long a follower waits for anything from a node (its pings come every
	// 15 s) before it takes the connection for dead and connects again: a host that is gone
	// may leave the TCP connection open without a word.
	nodeSilence = 45 * time.Second
	// followRetry is how soon a follower tries a node again after its stream ended.
	followRetry = time.Second
	// maxEventLine bounds one line of a node's stream; a longer event is skipped.
	maxEventLine = 1 << 20
	// maxCursorEntries bounds the nodes a client's Last-Event-ID may name.
	maxCursorEntries = 1024
	// cursorPrefix marks a router's event id; a node's ids are plain integers.
	cursorPrefix = "c1."
)

// nodeEvent is one event of a node, as the node sent it.
type nodeEvent struct {
	seq     int64
	arrival uint64 // the order this router received it in, across nodes
	typ     string
	data    []byte
}

// follower follows one node's stream and holds its last eventHistory events.
type follower struct {
	name string
	key  uint32 // nodeKey(name), the node's name in a cursor
	// ring holds the node's events with seq > from, in order: every one of them the node
	// sent since the follower began, up to the last eventHistory.
	ring []nodeEvent
	from int64
	// latest is the seq of the last event held (from when none is).
	latest int64
	stop   context.CancelFunc
}

// eventHub is the router's followers and the clients' streams over them.
type eventHub struct {
	rt *Router

	mu        sync.Mutex
	followers map[string]*follower
	arrival   uint64
	// changed is closed, and replaced, whenever an event is held or a follower added.
	changed chan struct{}
	clients int
	// closed is closed when the router stops following (Run's context ended), which ends
	// every client's stream so that a shutdown drains them.
	closed    chan struct{}
	closeOnce sync.Once
}

func newEventHub(rt *Router) *eventHub {
	return &eventHub{rt: rt, followers: map[string]*follower{}, changed: make(chan struct{}), closed: make(chan struct{})}
}

// nodeKey names a node in a cursor: 32 bits of FNV-1a of its name, so that a cursor is
// short and every replica computes the same key. Two nodes of one cluster whose names
// collide would share a position; the router logs it (a cluster has tens of nodes, so the
// odds are about one in ten million).
func nodeKey(name string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return h.Sum32()
}

// encodeCursor is the id of a position: its entries in key order, each the key and the seq
// as a varint, in unpadded base64url. The same position gives the same id on every replica.
func encodeCursor(pos map[uint32]int64) string {
	keys := make([]uint32, 0, len(pos))
	for k := range pos {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	buf := make([]byte, 0, len(keys)*8)
	for _, k := range keys {
		buf = binary.BigEndian.AppendUint32(buf, k)
		buf = binary.AppendVarint(buf, pos[k])
	}
	return cursorPrefix + base64.RawURLEncoding.EncodeToString(buf)
}

// decodeCursor reads a position back; ok is false for anything no router sent.
func decodeCursor(id string) (map[uint32]int64, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(id), cursorPrefix)
	if !ok || len(rest) > maxCursorEntries*20 {
		return nil, false
	}
	buf, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return nil, false
	}
	pos := map[uint32]int64{}
	for len(buf) > 0 {
		if len(buf) < 5 || len(pos) >= maxCursorEntries {
			return nil, false
		}
		k := binary.BigEndian.Uint32(buf)
		seq, n := binary.Varint(buf[4:])
		if n <= 0 || seq < 0 {
			return nil, false
		}
		pos[k] = seq
		buf = buf[4+n:]
	}
	return pos, true
}

// run keeps a follower for every node that publishes an address, until ctx ends.
func (h *eventHub) run(ctx context.Context) {
	t := time.NewTicker(followRetry)
	defer t.Stop()
	defer h.closeOnce.Do(func() { close(h.closed) })
	for {
		h.sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sync starts a follower for each node new to the router and stops the follower of a node
// whose BothyNode is gone. A node that is lost keeps its follower (and its events): the
// follower tries it again until it is back, and goes on from the last event it had.
func (h *eventHub) sync(ctx context.Context) {
	nodes, err := h.rt.nodes(ctx)
	if err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	added := false
	for name, n := range nodes {
		if _, ok := h.followers[name]; ok || n.obj.Status.Address == "" {
			continue
		}
		key := nodeKey(name)
		for other, f := range h.followers {
			if f.key == key {
				h.rt.log.Error("router: two nodes' names share an event cursor key; their events' positions mix", "node", name, "other", other)
			}
		}
		fctx, stop := context.WithCancel(ctx)
		f := &follower{name: name, key: key, stop: stop}
		h.followers[name] = f
		added = true
		go h.follow(fctx, f)
	}
	for name, f := range h.followers {
		if _, ok := nodes[name]; !ok {
			f.stop()
			delete(h.followers, name)
		}
	}
	if added {
		h.notify()
	}
}

// notify wakes every client stream; h.mu is held.
func (h *eventHub) notify() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// follow reads node f's stream, again and again, until ctx ends: each connection asks for
// the events after the last one held (Last-Event-ID), so a node that restarts or was lost
// and is back sends what the router missed, as far as it keeps it. The first connection asks
// for every event the node keeps.
func (h *eventHub) follow(ctx context.Context, f *follower) {
	for ctx.Err() == nil {
		nodes, err := h.rt.nodes(ctx)
		if n := nodes[f.name]; err == nil && n != nil && n.live {
			if err := h.followOnce(ctx, f, n); err != nil && ctx.Err() == nil {
				h.rt.log.Debug("router: a node's event stream ended", "node", f.name, "err", err)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(followRetry):
		}
	}
}

func (h *eventHub) followOnce(ctx context.Context, f *follower, n *nodeView) error {
	u, err := nodeAddress(n)
	if err != nil {
		return err
	}
	u.Path = "/v1/events"
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil) //nolint:gosec // G704: a node's published address
	if err != nil {
		return err
	}
	h.rt.nodeAuth(req.Header)
	req.Header.Set("Accept", "text/event-stream")
	h.mu.Lock()
	req.Header.Set("Last-Event-ID", strconv.FormatInt(f.latest, 10))
	h.mu.Unlock()
	resp, err := (&http.Client{Transport: h.rt.cfg.Transport}).Do(req) //nolint:gosec // G704: as above
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the node answered %s", resp.Status)
	}
	// A node that says nothing for nodeSilence, pings included, is taken for gone.
	silence := time.AfterFunc(nodeSilence, cancel)
	defer silence.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxEventLine)
	var id, typ string
	var data bytes.Buffer
	for sc.Scan() {
		silence.Reset(nodeSilence)
		line := sc.Text()
		switch {
		case line == "":
			if data.Len() > 0 && id != "" {
				if seq, err := strconv.ParseInt(id, 10, 64); err == nil {
					h.hold(f, seq, typ, bytes.Clone(data.Bytes()))
				}
			}
			id, typ = "", ""
			data.Reset()
		case strings.HasPrefix(line, ":"):
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				id = value
			case "event":
				typ = value
			case "data":
				if data.Len() > 0 {
					data.WriteByte('\n')
				}
				data.WriteString(value)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the node ended the stream")
}

// hold keeps one event of f's node. An event at or before the last one held is one the
// router has (a node replays what it keeps to an id it does not know) and is skipped.
func (h *eventHub) hold(f *follower, seq int64, typ string, data []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if seq <= f.latest {
		return
	}
	h.arrival++
	f.ring = append(f.ring, nodeEvent{seq: seq, arrival: h.arrival, typ: typ, data: data})
	if len(f.ring) > eventHistory {
		f.from = f.ring[0].seq
		f.ring = append(f.ring[:0], f.ring[1:]...)
	}
	f.latest = seq
	h.notify()
}

// admit counts one more client stream, unless there are as many as allowed.
func (h *eventHub) admit() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.clients >= h.rt.cfg.MaxEventClients {
		return false
	}
	h.clients++
	return true
}

func (h *eventHub) leave() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clients--
}

// startPosition is where a client's stream begins: the client's Last-Event-ID, when it is a
// router's id (a node it names nothing for: all that is kept of it); else "now" — each node's
// latest event held — as a node starts a client whose id it did not send.
func (h *eventHub) startPosition(lastEventID string) map[uint32]int64 {
	pos, resumed := decodeCursor(lastEventID)
	if !resumed {
		pos = map[uint32]int64{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range h.followers {
		if _, ok := pos[f.key]; !ok {
			if resumed {
				pos[f.key] = f.from
			} else {
				pos[f.key] = f.latest
			}
		}
	}
	return pos
}

// take writes to buf the next events after pos (at most 64), in the order the router received
// them, advancing pos. It returns the channel that is closed at the next change, and whether
// the client fell behind: events after its position have left a ring (first: the stream's
// first take, where an old position is taken from what is kept, as a node replays an id
// older than its ring).
func (h *eventHub) take(pos map[uint32]int64, first bool, buf *bytes.Buffer) (changed <-chan struct{}, dropped bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for n := 0; n < 64; n++ {
		var next *nodeEvent
		var from *follower
		for _, f := range h.followers {
			p, ok := pos[f.key]
			if !ok {
				// A node that joined since the stream began: all that is kept of it.
				p = f.from
			}
			if p < f.from {
				if !first {
					return h.changed, true
				}
				p = f.from
			}
			pos[f.key] = p
			i := sort.Search(len(f.ring), func(i int) bool { return f.ring[i].seq > p })
			if i < len(f.ring) && (next == nil || f.ring[i].arrival < next.arrival) {
				next, from = &f.ring[i], f
			}
		}
		if next == nil {
			break
		}
		pos[from.key] = next.seq
		buf.WriteString("id: " + encodeCursor(pos) + "\n")
		if next.typ != "" {
			buf.WriteString("event: " + next.typ + "\n")
		}
		buf.WriteString("data: ")
		buf.Write(next.data)
		buf.WriteString("\n\n")
	}
	return h.changed, false
}

// serveEvents streams the cluster's events to one client.
func (rt *Router) serveEvents(w http.ResponseWriter, req *http.Request) {
	h := rt.events
	if !h.admit() {
		problem(w, http.StatusTooManyRequests, "limit-reached", fmt.Sprintf("The router serves at most %d event streams at once; close one, or try again later.", rt.cfg.MaxEventClients))
		return
	}
	defer h.leave()
	pos := h.startPosition(req.Header.Get("Last-Event-ID"))

	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var buf bytes.Buffer
	write := func() bool {
		_ = rc.SetWriteDeadline(time.Now().Add(eventWriteWait))
		_, err := w.Write(buf.Bytes())
		buf.Reset()
		if err == nil {
			err = rc.Flush()
		}
		return err == nil
	}
	buf.WriteString("retry: 2000\n: connected\n\n")
	if !write() {
		return
	}
	ctx := req.Context()
	heartbeat := time.NewTimer(eventHeartbeat)
	defer heartbeat.Stop()
	for first := true; ; first = false {
		changed, dropped := h.take(pos, first, &buf)
		if dropped {
			rt.log.Info("router: an event stream fell behind and was dropped; it reconnects with Last-Event-ID")
			return
		}
		if buf.Len() > 0 {
			if !write() {
				return
			}
			heartbeat.Reset(eventHeartbeat)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-h.closed:
			return
		case <-changed:
		case <-heartbeat.C:
			buf.WriteString(": ping\n\n")
			if !write() {
				return
			}
			heartbeat.Reset(eventHeartbeat)
		}
	}
}
