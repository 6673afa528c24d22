package events

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/bothy/bothy/openapi"
)

// Defaults of Options.
const (
	DefaultHistory = 1024
	DefaultBuffer  = 256
)

// ErrClosed ends a subscription whose bus was closed (the server is shutting down).
var ErrClosed = errors.New("events: the bus is closed")

// ErrDropped ends a subscription that fell more than its buffer behind.
var ErrDropped = errors.New("events: the subscriber fell behind and was dropped")

// Options size a Bus.
type Options struct {
	// History is how many of the last events are kept for replay.
	History int
	// Buffer is how many events a subscriber may fall behind before it is dropped.
	Buffer int
	// Now stamps events; time.Now when nil.
	Now func() time.Time
	// SeqDir, when set, is the directory (the state root) of the record of reserved sequence
	// numbers ([SeqName]), so that the numbers of a new process follow those of every earlier
	// one and none is reused: a Last-Event-ID from before a restart never names a new event.
	SeqDir string
	// SeqBlock is how many numbers one durable write reserves; [DefaultSeqBlock] when 0.
	SeqBlock int64
	// OnError is told of a failed reservation; nil drops it.
	OnError func(error)
	// OnPublish, if set, is handed each event as published, numbered and stamped, before any
	// subscriber sees it and under the bus's lock, so in the order of the numbers: the
	// webhooks' outbox records the event there (package webhook). It must not publish.
	OnPublish func(openapi.Event)
}

// Bus fans events out to subscribers. It is safe for concurrent use; a nil *Bus accepts and
// drops every event, so that publishers need not check whether anyone listens.
type Bus struct {
	buffer    int
	now       func() time.Time
	seqDir    string
	seqBlock  int64
	onError   func(error)
	onPublish func(openapi.Event)

	mu       sync.Mutex
	seq      int64
	reserved int64           // the last sequence number reserved durably (see reserve)
	ring     []openapi.Event // the last events, oldest first once full, starting at head
	head     int
	subs     map[*Subscription]struct{}
	closed   bool
	closedC  chan struct{}
}

// New returns an empty bus whose numbers start at 1, whatever Options.SeqDir says: for tests
// and for a server without a state root. A server opens its bus with [Open].
func New(o Options) *Bus {
	o.SeqDir = ""
	b, _ := Open(o)
	return b
}

// Open returns an empty bus. With Options.SeqDir, its numbers start after those reserved by
// earlier processes; an unreadable record is an error, since starting from 0 would reuse them.
func Open(o Options) (*Bus, error) {
	if o.History <= 0 {
		o.History = DefaultHistory
	}
	if o.Buffer <= 0 {
		o.Buffer = DefaultBuffer
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.SeqBlock <= 0 {
		o.SeqBlock = DefaultSeqBlock
	}
	b := &Bus{
		buffer:    o.Buffer,
		now:       o.Now,
		seqDir:    o.SeqDir,
		seqBlock:  o.SeqBlock,
		onError:   o.OnError,
		onPublish: o.OnPublish,
		ring:      make([]openapi.Event, 0, o.History),
		subs:      map[*Subscription]struct{}{},
		closedC:   make(chan struct{}),
	}
	if o.SeqDir != "" {
		reserved, err := readSeq(o.SeqDir)
		if err != nil {
			return nil, err
		}
		b.seq, b.reserved = reserved, reserved
	}
	return b, nil
}

// Publish numbers and stamps e, keeps it for replay and hands it to every subscriber, and
// returns it as sent. It never blocks: a subscriber whose buffer is full is dropped.
func (b *Bus) Publish(e openapi.Event) openapi.Event {
	if b == nil {
		return e
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return e
	}
	b.reserve(b.seq + 1)
	b.seq++
	e.Seq = b.seq
	e.At = b.now().UTC()
	if b.onPublish != nil {
		b.onPublish(e)
	}
	if len(b.ring) < cap(b.ring) {
		b.ring = append(b.ring, e)
	} else {
		b.ring[b.head] = e
		b.head = (b.head + 1) % len(b.ring)
	}
	for s := range b.subs {
		select {
		case s.c <- e:
		default:
			s.end(ErrDropped)
			delete(b.subs, s)
		}
	}
	return e
}

// Seq is the sequence number of the last event published; before the first, 0 or the last
// number an earlier process reserved.
func (b *Bus) Seq() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seq
}

// history returns the kept events in order. The caller holds b.mu.
func (b *Bus) history() []openapi.Event {
	out := make([]openapi.Event, 0, len(b.ring))
	out = append(out, b.ring[b.head:]...)
	return append(out, b.ring[:b.head]...)
}

// Subscribe starts a subscription to the events published from now on. With replay, it first
// delivers the kept events after lastID (see the package doc for ids the ring does not cover).
func (b *Bus) Subscribe(replay bool, lastID int64) *Subscription {
	s := &Subscription{bus: b, c: make(chan openapi.Event, b.buffer), done: make(chan struct{})}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		s.end(ErrClosed)
		return s
	}
	if replay {
		kept := b.history()
		switch {
		case lastID > b.seq:
			// An id this bus never gave (one of another state root, or of a process whose
			// reservation failed): whatever is kept may have been missed.
			s.backlog = kept
		case len(kept) > 0 && lastID < kept[0].Seq-1:
			// Older than the ring: events were lost; send what is kept.
			s.backlog = kept
		default:
			for i, e := range kept {
				if e.Seq > lastID {
					s.backlog = kept[i:]
					break
				}
			}
		}
	}
	b.subs[s] = struct{}{}
	return s
}

// Close ends every subscription with ErrClosed and drops later events. The server calls it
// when a graceful shutdown begins, so that event streams end and the shutdown can finish.
func (b *Bus) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	close(b.closedC)
	for s := range b.subs {
		s.end(ErrClosed)
		delete(b.subs, s)
	}
}

// Subscription is one subscriber's view of the bus. Next must be called from one goroutine.
type Subscription struct {
	bus     *Bus
	backlog []openapi.Event
	c       chan openapi.Event

	once sync.Once
	err  error
	done chan struct{}
}

// end marks the subscription over; its buffered events are still delivered first. The bus's
// lock is held.
func (s *Subscription) end(err error) {
	s.once.Do(func() {
		s.err = err
		close(s.done)
	})
}

// Next returns the next event, waiting for one until ctx ends or the subscription does
// (ErrDropped, ErrClosed).
func (s *Subscription) Next(ctx context.Context) (openapi.Event, error) {
	if len(s.backlog) > 0 {
		e := s.backlog[0]
		s.backlog = s.backlog[1:]
		return e, nil
	}
	select {
	case e := <-s.c:
		return e, nil
	default:
	}
	select {
	case e := <-s.c:
		return e, nil
	case <-s.done:
		// A dropped subscriber's buffered events are delivered before it ends; a closed bus
		// ends at once.
		if errors.Is(s.err, ErrDropped) {
			select {
			case e := <-s.c:
				return e, nil
			default:
			}
		}
		return openapi.Event{}, s.err
	case <-ctx.Done():
		return openapi.Event{}, ctx.Err()
	}
}

// Close ends the subscription; later events are not kept for it.
func (s *Subscription) Close() {
	b := s.bus
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.subs, s)
	s.end(ErrClosed)
}
