package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
)

// fakeClock is an injectable host clock: a fixed host and boot whose monotonic and UTC
// readings move together unless a test moves one alone.
type fakeClock struct {
	mu  sync.Mutex
	now TimeContract
}

func newClock() *fakeClock {
	return &fakeClock{now: TimeContract{HostID: "host-a", BootID: "boot-1", Clock: ClockBoottime,
		Monotonic: 1000 * time.Second, UTC: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}}
}

func (c *fakeClock) Now() (TimeContract, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now, nil
}

func (c *fakeClock) get() TimeContract { n, _ := c.Now(); return n }

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now.Monotonic += d
	c.now.UTC = c.now.UTC.Add(d)
}

// syncLog records the durable steps of a store, and of the binding functions.
type syncLog struct {
	mu    sync.Mutex
	steps []string
}

func (l *syncLog) add(step string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.steps = append(l.steps, step)
}

func (l *syncLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.steps
	l.steps = nil
	return s
}

type env struct {
	root  string
	s     *Store
	clock *fakeClock
	log   *syncLog
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return openEnv(t, t.TempDir())
}

func openEnv(t testing.TB, root string) *env {
	t.Helper()
	e := &env{root: root, clock: newClock(), log: &syncLog{}}
	s, err := Open(root, Options{Now: e.clock.Now, OnSync: e.log.add})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	e.s = s
	return e
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var testKey = Key{Runtime: "namespace/test", Image: "host", Resources: Resources{VCPUs: 1, MemoryMB: 256, Pids: 64}}

// sandboxDir makes (or returns) the state directory of a sandbox under the env's root.
func (e *env) sandboxDir(t testing.TB, id string) string {
	t.Helper()
	dir := filepath.Join(e.root, "sandboxes", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (e *env) bindingExists() func(string, string) bool {
	return BindingChecker(func(id string) (string, error) { return filepath.Join(e.root, "sandboxes", id), nil })
}

// smallLayer makes a small source layer.
func smallLayer(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "etc", "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "app", "conf"), []byte("x=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// template creates a template with one captured generation and returns its id.
func (e *env) template(t testing.TB, name string) string {
	t.Helper()
	if _, err := e.s.CreateTemplate(ctxT(t), name); err != nil {
		t.Fatal(err)
	}
	return e.capture(t, name)
}

func (e *env) capture(t testing.TB, name string) string {
	t.Helper()
	g, err := e.s.Capture(ctxT(t), name, smallLayer(t), testKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	return g.ID
}

// clone runs the clone protocol of docs/design.md for sandbox id: template lock, checks, lease
// record, clone.json, unlock. (The sandbox's lifecycle lock is the store's business; these
// tests have no sandbox store.)
func (e *env) clone(t testing.TB, name, gen, id string) (*Lease, error) {
	t.Helper()
	dir := e.sandboxDir(t, id)
	tx, err := e.s.Lock(ctxT(t))
	if err != nil {
		return nil, err
	}
	defer tx.Unlock()
	if err := CheckUnbound(dir, id); err != nil {
		return nil, err
	}
	if _, err := tx.Leasable(name, gen, e.clock.get()); err != nil {
		return nil, err
	}
	l, err := tx.WriteLease(name, gen, id)
	if err != nil {
		return nil, err
	}
	if err := WriteBinding(dir, NewBinding(l)); err != nil {
		return nil, err
	}
	return l, nil
}

func (e *env) mustClone(t testing.TB, name, gen, id string) *Lease {
	t.Helper()
	l, err := e.clone(t, name, gen, id)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// release runs the removal side: clone.json first, durably, then the lease record.
func (e *env) release(t testing.TB, id string) {
	t.Helper()
	dir := filepath.Join(e.root, "sandboxes", id)
	b, err := ReadBinding(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := RemoveBinding(dir); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Release(ctxT(t), b.Template, b.Generation, b.Lease); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t testing.TB, err error, code errcode.Code) {
	t.Helper()
	if !errors.Is(err, code) {
		t.Fatalf("error %v; want %s", err, code)
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func contextTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

func contextNoDeadline() context.Context { return context.Background() }
