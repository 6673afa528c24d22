// Package idempotency keeps the first answer to each create that came with an
// Idempotency-Key, so that a client that repeats the request (after a timeout, a dropped
// connection, a restart of the server) gets that answer again instead of a second sandbox,
// template or pull. Package server's middleware uses it; it knows nothing of HTTP beyond a
// status, a few headers and a body.
//
// # What is kept
//
// A record per key, scope and answer in <root>/idempotency (mode 0700), named by the SHA-256 of
// the client's scope (itself a hash of its credential: the credential is never stored) and
// the key: a client cannot name, read or collide with another credential's records. It holds
// the SHA-256 of the request (method, path, query, body), the answer (status, Content-Type,
// Location, body) and its time. Only successful (2xx) answers are kept: a refused or failed
// create did nothing, and may be repeated with the same key, corrected or not.
//
// A record is written durably (platform.WriteFileDurable) before the answer is sent: an
// answer the client saw is replayed after a crash. A crash while the create runs leaves no
// record, and the repeat runs the create again.
//
// # Bounds
//
// Records live [DefaultTTL] (24 hours). At most [DefaultMaxEntries] records and
// [DefaultMaxBytes] of them are kept: past either, the oldest go first (expired ones first of
// all). An answer larger than [MaxAnswerBytes] is sent but not kept. The start-up removes
// expired records and what interrupted writes left; so does `bothyd check --repair`
// ([Check]), which reports a record that does not read and leaves it to the operator.
//
// # Concurrency
//
// A key whose first request is still running refuses a second at once with
// idempotency-key-in-flight (409) rather than holding it: the client repeats it later and gets
// the first answer. A repeat with another request is idempotency-key-reused (422), whether
// the first is running or done.
package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// Dir is the records' directory in the state root.
const Dir = "idempotency"

// Bounds and defaults.
const (
	DefaultTTL        = 24 * time.Hour
	DefaultMaxEntries = 4096
	DefaultMaxBytes   = 64 << 20
	// MaxAnswerBytes bounds a kept answer's body; a create's answer is a few KiB.
	MaxAnswerBytes = 256 << 10
	// MaxKeyLength bounds an Idempotency-Key.
	MaxKeyLength = 255

	recordFormat = 1
	recordExt    = ".json"
)

// Answer is a kept answer.
type Answer struct {
	Status      int    `json:"status"`
	ContentType string `json:"content_type,omitempty"`
	Location    string `json:"location,omitempty"`
	Body        []byte `json:"body"`
}

type entryRecord struct {
	Format  int       `json:"format"`
	Request string    `json:"request"` // hex SHA-256 of the request
	At      time.Time `json:"at"`
	Answer  Answer    `json:"answer"`
}

type meta struct {
	request string
	at      time.Time
	size    int64
}

// Options configure a Store.
type Options struct {
	TTL        time.Duration
	MaxEntries int
	MaxBytes   int64
	Logger     *slog.Logger
	Now        func() time.Time
}

// Store keeps the answers of one state root. It is safe for concurrent use by one process.
type Store struct {
	dir string
	o   Options

	mu       sync.Mutex
	index    map[string]meta   // by record name
	inflight map[string]string // record name: the request hash of the running first request
	bytes    int64             // of the kept records and of those being written
	writing  int               // records being written by Finish, outside mu

	// writeRecord is platform.WriteFileDurable; a test holds a write in progress with it.
	writeRecord func(dir, name string, data []byte, perm fs.FileMode) error
}

// ValidKey reports whether key may be an Idempotency-Key: 1 to MaxKeyLength printable ASCII
// characters.
func ValidKey(key string) bool {
	if key == "" || len(key) > MaxKeyLength {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

// Scope is the scope of a credential: records of one scope are out of reach of another.
func Scope(credential string) string {
	sum := sha256.Sum256([]byte("bothyd idempotency scope\x00" + credential))
	return hex.EncodeToString(sum[:])
}

// RequestHash is the fingerprint of a request: another method, path, query or body is another
// request.
func RequestHash(method, target string, body []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", method, target)
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// Open loads the records of root, removing expired ones and leftovers of interrupted writes.
func Open(root string, o Options) (*Store, error) {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if err := platform.EnsureDir(root, Dir, 0o700); err != nil {
		return nil, fmt.Errorf("idempotency: the records directory: %w", err)
	}
	s := &Store{dir: filepath.Join(root, Dir), o: o, index: map[string]meta{}, inflight: map[string]string{},
		writeRecord: platform.WriteFileDurable}
	d, err := platform.OpenDir(s.dir)
	if err != nil {
		return nil, err
	}
	names, err := platform.ReadDirNames(d)
	d.Close()
	if err != nil {
		return nil, err
	}
	now := o.Now()
	for _, name := range names {
		path := filepath.Join(s.dir, name)
		if _, ok := platform.IsTempName(name); ok {
			_ = os.Remove(path)
			continue
		}
		if !validName(name) {
			continue // not ours; left alone
		}
		rec, size, err := s.read(name)
		if err != nil {
			// Left for the operator (bothyd check reports it); its key is new again, and a
			// new answer of that key replaces it.
			o.Logger.Warn("idempotency: a kept answer does not read; bothyd check reports it", "record", name, "err", err)
			continue
		}
		if now.Sub(rec.At) >= o.TTL {
			_ = os.Remove(path)
			continue
		}
		s.index[name] = meta{request: rec.Request, at: rec.At, size: size}
		s.bytes += size
	}
	s.mu.Lock()
	s.evictLocked(0, 0)
	s.mu.Unlock()
	return s, nil
}

func validName(name string) bool {
	hexName, ok := strings.CutSuffix(name, recordExt)
	if !ok || len(hexName) != 64 {
		return false
	}
	_, err := hex.DecodeString(hexName)
	return err == nil
}

func recordName(scope, key string) string {
	sum := sha256.Sum256([]byte(scope + "\x00" + key))
	return hex.EncodeToString(sum[:]) + recordExt
}

func (s *Store) read(name string) (*entryRecord, int64, error) {
	data, err := platform.ReadFile(filepath.Join(s.dir, name), MaxAnswerBytes*2+record.MaxSize)
	if err != nil {
		return nil, 0, err
	}
	var rec entryRecord
	if err := record.Decode(name, data, recordFormat, &rec); err != nil {
		return nil, 0, err
	}
	return &rec, int64(len(data)), nil
}

// ErrNotKept is returned by Finish for an answer that is not kept (too large).
var ErrNotKept = errors.New("idempotency: the answer is too large to keep")

// Begin starts the request of key in scope, whose fingerprint is request. It returns the kept
// answer of an earlier request of the same key (replay); or an error, idempotency-key-reused
// when that request was another, idempotency-key-in-flight when it still runs; or neither,
// and then the caller runs the request and calls [Store.Finish] with its answer, whatever
// happens.
func (s *Store) Begin(scope, key, request string) (*Answer, error) {
	name := recordName(scope, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if running, ok := s.inflight[name]; ok {
		if running != request {
			return nil, reused()
		}
		return nil, errcode.New(errcode.IdempotencyKeyInFlight,
			"The request that first used this Idempotency-Key is still being answered; repeat this one in a moment to get its answer.")
	}
	if m, ok := s.index[name]; ok {
		if s.o.Now().Sub(m.at) < s.o.TTL {
			if m.request != request {
				return nil, reused()
			}
			rec, _, err := s.read(name)
			if err == nil {
				return &rec.Answer, nil
			}
			s.o.Logger.Warn("idempotency: a kept answer does not read; the request runs again", "err", err)
		}
		s.dropLocked(name)
	}
	s.inflight[name] = request
	return nil, nil
}

func reused() error {
	return errcode.New(errcode.IdempotencyKeyReused,
		"This Idempotency-Key was first used with another request (another method, path or body); use a new key for a new request.")
}

// Finish ends the request Begin let run. A successful (2xx) answer is kept, durably, before
// Finish returns; nil, or another answer, keeps nothing, so the key may be used again.
//
// The durable write (two fsyncs) runs outside the store's mutex, so that creates with keys do
// not queue behind one another's disk; the key stays in flight until the write is done, so a
// repeat meanwhile is told to retry rather than run twice, and its size is reserved in the
// bounds.
func (s *Store) Finish(scope, key string, a *Answer) error {
	name := recordName(scope, key)
	s.mu.Lock()
	request, ok := s.inflight[name]
	if !ok || a == nil || a.Status < 200 || a.Status > 299 || len(a.Body) > MaxAnswerBytes {
		delete(s.inflight, name)
		s.mu.Unlock()
		if ok && a != nil && len(a.Body) > MaxAnswerBytes {
			return ErrNotKept
		}
		return nil
	}
	rec := entryRecord{Format: recordFormat, Request: request, At: s.o.Now().UTC(), Answer: *a}
	data, err := record.Encode(&rec)
	if err != nil {
		delete(s.inflight, name)
		s.mu.Unlock()
		return err
	}
	size := int64(len(data))
	s.evictLocked(1, size)
	s.writing++
	s.bytes += size
	s.mu.Unlock()

	werr := s.writeRecord(s.dir, name, data, record.Perm)

	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inflight, name)
	s.writing--
	if werr != nil {
		s.bytes -= size
		return fmt.Errorf("idempotency: keeping an answer: %w", werr)
	}
	s.index[name] = meta{request: request, at: rec.At, size: size}
	return nil
}

// evictLocked removes expired records, then the oldest, until n more records of size bytes in
// all fit.
func (s *Store) evictLocked(n int, size int64) {
	now := s.o.Now()
	for name, m := range s.index {
		if now.Sub(m.at) >= s.o.TTL {
			s.dropLocked(name)
		}
	}
	if len(s.index)+s.writing+n <= s.o.MaxEntries && s.bytes+size <= s.o.MaxBytes {
		return
	}
	names := make([]string, 0, len(s.index))
	for name := range s.index {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int { return s.index[a].at.Compare(s.index[b].at) })
	for _, name := range names {
		if len(s.index)+s.writing+n <= s.o.MaxEntries && s.bytes+size <= s.o.MaxBytes {
			return
		}
		s.dropLocked(name)
	}
}

func (s *Store) dropLocked(name string) {
	if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.o.Logger.Warn("idempotency: removing a record", "err", err)
	}
	s.bytes -= s.index[name].size
	delete(s.index, name)
}

// Len is how many answers are kept.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.index)
}

// The kinds of problem [Check] reports.
const (
	// Leftover is a temporary file of an interrupted write, or an expired record; repair
	// removes it.
	Leftover = "idempotency-leftover"
	// BadRecord is a record that does not read; it is left to the operator.
	BadRecord = "idempotency-bad-record"
)

// Problem is one finding of [Check]; Entry is relative to the state root.
type Problem struct {
	Kind, Entry, Detail string
	Repaired            bool
}

// tempGrace is how old a temporary file must be before Check calls it left over: a younger
// one may be a running server's write in flight.
const tempGrace = time.Minute

// Check judges the kept answers of root and, with repair, removes temporary files and expired
// records. It is safe beside a running server: a record it removes is one that server would
// not replay, and it leaves young temporary files alone.
func Check(root string, repair bool, now time.Time) ([]Problem, error) {
	dir := filepath.Join(root, Dir)
	names, err := platform.ListDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := &Store{dir: dir}
	var probs []Problem
	add := func(kind, name, detail string, fix bool) {
		p := Problem{Kind: kind, Entry: filepath.Join(Dir, name), Detail: detail}
		if fix && repair {
			if err := os.Remove(filepath.Join(dir, name)); err == nil || errors.Is(err, fs.ErrNotExist) {
				p.Repaired = true
			}
		}
		probs = append(probs, p)
	}
	for _, name := range names {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		if _, ok := platform.IsTempName(name); ok && fi.Mode().IsRegular() {
			if now.Sub(fi.ModTime()) >= tempGrace {
				add(Leftover, name, "a temporary file of an interrupted write", true)
			}
			continue
		}
		if !validName(name) || !fi.Mode().IsRegular() {
			add(BadRecord, name, "bothyd never makes this name here; it is left alone", false)
			continue
		}
		rec, _, err := s.read(name)
		switch {
		case err != nil:
			add(BadRecord, name, fmt.Sprintf("a kept answer does not read: %v; its key is answered afresh, and the file is left for you to look at", err), false)
		case now.Sub(rec.At) >= DefaultTTL:
			add(Leftover, name, "an expired answer, which a running server removes when it next keeps one", true)
		}
	}
	return probs, nil
}
