package store

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"golang.org/x/sys/unix"
)

// attempts counts lock attempts (and records their start times) through the test hook, and
// runs act at a chosen point of the first attempt only.
type attempts struct {
	mu    sync.Mutex
	times []time.Time
	fired bool
}

func (a *attempts) install(s *Store, point string, act func()) {
	s.testHook = func(p string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if p == hookAttempt {
			a.times = append(a.times, time.Now())
		}
		if p == point && !a.fired && act != nil {
			a.fired = true
			act()
		}
	}
}

func (a *attempts) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.times)
}

func TestLockExcludes(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	// A second store on the same root stands for a second process: nothing is shared in memory.
	s2 := openStore(t, s.Root())
	l := lockExisting(t, s, "a")
	if _, err := s2.LockExisting(timeout(t, 80*time.Millisecond), "a"); !errors.Is(err, errcode.TransitionInProgress) {
		t.Fatalf("LockExisting while held = %v; want transition-in-progress", err)
	}
	if _, err := s2.LockForProvision(timeout(t, 80*time.Millisecond), "a"); !errors.Is(err, errcode.TransitionInProgress) {
		t.Fatalf("LockForProvision while held = %v; want transition-in-progress", err)
	}
	// Another sandbox is not affected.
	provision(t, s2, "b")
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatalf("second Unlock = %v; want nil", err)
	}
	l2 := lockExisting(t, s2, "a")
	if l2.ID() != "a" || l2.Dir() != filepath.Join(s.Root(), SandboxesDir, "a") {
		t.Fatalf("ID, Dir = %q, %q", l2.ID(), l2.Dir())
	}
}

func TestLockWaitsForRelease(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	s2 := openStore(t, s.Root())
	var mu sync.Mutex
	busy, attempts := 0, 0
	s2.testHook = func(p string) {
		mu.Lock()
		defer mu.Unlock()
		switch p {
		case hookBusy:
			busy++
		case hookAttempt:
			attempts++
		}
	}
	released := make(chan struct{})
	// Release once the waiter has found the lock busy: it must get it on a later retry.
	go func() {
		defer close(released)
		for {
			mu.Lock()
			n := busy
			mu.Unlock()
			if n > 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		l.Unlock()
	}()
	l2, err := s2.LockExisting(timeout(t, 10*time.Second), "a")
	if err != nil {
		t.Fatal(err)
	}
	l2.Unlock()
	<-released
	mu.Lock()
	defer mu.Unlock()
	if busy < 1 || attempts < busy+1 {
		t.Fatalf("busy %d times in %d attempts; want a successful retry after finding it busy", busy, attempts)
	}
}

func TestLockNeedsDeadline(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	for name, lock := range map[string]func(context.Context, string) (*Lock, error){
		"provision": s.LockForProvision, "existing": s.LockExisting,
	} {
		_, err := lock(context.Background(), "a")
		var e *errcode.Error
		if !errors.As(err, &e) || e.Code != errcode.InvalidRequest || e.Field != "timeout" {
			t.Errorf("%s without deadline = %v; want invalid-request on timeout", name, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cancel()
		if _, err := lock(ctx, "a"); !errors.Is(err, context.Canceled) {
			t.Errorf("%s with cancelled ctx = %v; want context.Canceled", name, err)
		}
	}
	l := lockExisting(t, s, "a")
	err := l.Deprovision(context.Background())
	if errcode.Of(err) != errcode.InvalidRequest {
		t.Fatalf("Deprovision without deadline = %v; want invalid-request", err)
	}
	if !exists(filepath.Join(l.Dir(), ConfigName)) {
		t.Fatal("Deprovision without deadline removed the configuration record")
	}
}

func TestDeadlineStartsNoNewAttempt(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	lockExisting(t, s, "a")
	s2 := openStore(t, s.Root())
	var a attempts
	a.install(s2, "", nil)
	ctx := timeout(t, 300*time.Millisecond)
	deadline, _ := ctx.Deadline()
	_, err := s2.LockExisting(ctx, "a")
	wantCode(t, err, errcode.TransitionInProgress)
	a.mu.Lock()
	defer a.mu.Unlock()
	// It retries until the deadline, RetryInterval apart: a loaded machine may make the gaps
	// longer (so fewer attempts), never shorter.
	if len(a.times) < 2 {
		t.Fatalf("%d attempt in 300 ms; want retries every %s", len(a.times), RetryInterval)
	}
	for i, at := range a.times {
		if !at.Before(deadline) {
			t.Fatalf("attempt %d started %v after the deadline", i, at.Sub(deadline))
		}
		if i > 0 {
			if gap := at.Sub(a.times[i-1]); gap < RetryInterval-2*time.Millisecond {
				t.Fatalf("attempts %d and %d only %s apart; want %s", i-1, i, gap, RetryInterval)
			}
		}
	}
}

func TestExpiredDeadlineTriesOnce(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	var a attempts
	a.install(s, "", nil)
	l, err := s.LockExisting(ctx, "a")
	if err != nil {
		t.Fatalf("free lock with a passed deadline = %v; want one successful attempt", err)
	}
	_, err = s.LockExisting(ctx, "a")
	wantCode(t, err, errcode.TransitionInProgress)
	l.Unlock()
	if n := a.count(); n != 2 {
		t.Fatalf("%d attempts for two calls; want one each", n)
	}
}

func TestLockExistingNotFound(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	_, err := s.LockExisting(timeout(t, time.Second), "missing")
	wantCode(t, err, errcode.SandboxNotFound)
	if exists(filepath.Join(s.Root(), SandboxesDir, "missing")) {
		t.Fatal("LockExisting created a directory")
	}

	// A directory without a configuration record is not a sandbox; the lock file the attempt
	// made is removed, and the directory with it once empty.
	dir := filepath.Join(s.Root(), SandboxesDir, "empty")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err = s.LockExisting(timeout(t, time.Second), "empty")
	wantCode(t, err, errcode.SandboxNotFound)
	if exists(dir) {
		t.Fatalf("directory left behind: %v", entriesOf(t, dir))
	}

	// With other entries the directory stays, without a lock file.
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sandbox.log"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = s.LockExisting(timeout(t, time.Second), "empty")
	wantCode(t, err, errcode.SandboxNotFound)
	if got := entriesOf(t, dir); len(got) != 1 || got[0] != "sandbox.log" {
		t.Fatalf("directory holds %v; want only sandbox.log", got)
	}
}

// makeSpecial puts a non-regular entry at path; it returns a check that the entry (and the
// link's target) are as they were.
func makeSpecial(t *testing.T, kind, path string) func() {
	t.Helper()
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte(`{"format":1,"id":"a"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var mode fs.FileMode
	switch kind {
	case "symlink":
		mode = fs.ModeSymlink
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
	case "dangling":
		mode = fs.ModeSymlink
		target = filepath.Join(filepath.Dir(target), "never")
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
	case "fifo":
		mode = fs.ModeNamedPipe
		if err := unix.Mkfifo(path, 0o600); err != nil {
			t.Fatal(err)
		}
	case "socket":
		mode = fs.ModeSocket
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		t.Cleanup(func() { ln.Close() })
	case "dir":
		mode = fs.ModeDir
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unknown kind %s", kind)
	}
	return func() {
		t.Helper()
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode().Type() != mode {
			t.Errorf("%s at %s changed: %v, %v", kind, filepath.Base(path), fi, err)
		}
		got, err := os.ReadFile(target)
		switch {
		case kind == "dangling" && !errors.Is(err, fs.ErrNotExist):
			t.Errorf("the dangling link's target was created")
		case kind != "dangling" && (err != nil || string(got) != `{"format":1,"id":"a"}`):
			t.Errorf("link target changed: %q, %v", got, err)
		}
	}
}

var specialKinds = []string{"symlink", "dangling", "fifo", "socket", "dir"}

func TestLockFileNotRegularFailsAtOnce(t *testing.T) {
	t.Parallel()
	for _, kind := range specialKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			provision(t, s, "a")
			lockPath := filepath.Join(s.Root(), SandboxesDir, "a", LockName)
			if err := os.Remove(lockPath); err != nil {
				t.Fatal(err)
			}
			check := makeSpecial(t, kind, lockPath)
			var a attempts
			a.install(s, "", nil)
			for name, lock := range map[string]func(context.Context, string) (*Lock, error){
				"provision": s.LockForProvision, "existing": s.LockExisting,
			} {
				// A long deadline: failing "at once" means one attempt and no wait.
				l, err := lock(timeout(t, time.Minute), "a")
				if err == nil {
					l.Unlock()
					t.Fatalf("%s locked a %s", name, kind)
				}
				if !errors.Is(err, platform.ErrNotRegular) || errcode.Of(err) == errcode.TransitionInProgress {
					t.Fatalf("%s on a %s = %v; want a not-regular refusal", name, kind, err)
				}
			}
			if n := a.count(); n != 2 {
				t.Fatalf("%d attempts for two calls; want one each", n)
			}
			check()
		})
	}
}

func TestLockDetectsReplacedLockFile(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"replaced", "removed"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			provision(t, s, "a")
			lockPath := filepath.Join(s.Root(), SandboxesDir, "a", LockName)
			var a attempts
			// Between the open and the flock, another transition removes or replaces the file: the
			// flock then lands on a file that is no longer the lock.
			a.install(s, hookOpened, func() {
				if err := os.Remove(lockPath); err != nil {
					t.Error(err)
				}
				if how == "replaced" {
					if err := os.WriteFile(lockPath, nil, 0o600); err != nil {
						t.Error(err)
					}
				}
			})
			l, err := s.LockExisting(timeout(t, 5*time.Second), "a")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Unlock()
			if n := a.count(); n != 2 {
				t.Fatalf("%d attempts; want a second one after the identity check failed", n)
			}
			// The lock held is the one at the entry: another attempt must find it busy.
			s2 := openStore(t, s.Root())
			if _, err := s2.LockExisting(timeout(t, 60*time.Millisecond), "a"); !errors.Is(err, errcode.TransitionInProgress) {
				t.Fatalf("second lock = %v; want transition-in-progress", err)
			}
		})
	}
}

func TestProvisionMakesRemovedDirectoryAgain(t *testing.T) {
	t.Parallel()
	for _, point := range []string{hookMkdir, hookDirOpened} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			dir := filepath.Join(s.Root(), SandboxesDir, "a")
			var a attempts
			// A concurrent removal deletes the directory just after the provision made it.
			a.install(s, point, func() {
				if err := os.Remove(dir); err != nil {
					t.Error(err)
				}
			})
			l, err := s.LockForProvision(timeout(t, 5*time.Second), "a")
			if err != nil {
				t.Fatal(err)
			}
			if n := a.count(); n != 2 {
				t.Fatalf("%d attempts; want a second one after the directory vanished", n)
			}
			if err := l.WriteConfig(config("a")); err != nil {
				t.Fatal(err)
			}
			l.Unlock()
			if _, err := s.ReadConfigUnlocked("a"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestLockExistingWaitsThroughRemoval(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	holder := lockExisting(t, s, "a")
	s2, s3 := openStore(t, s.Root()), openStore(t, s.Root())
	var a2, a3 attempts
	a2.install(s2, "", nil)
	a3.install(s3, "", nil)
	type result struct {
		l   *Lock
		err error
	}
	existing, prov := make(chan result, 1), make(chan result, 1)
	go func() { l, err := s2.LockExisting(timeout(t, 10*time.Second), "a"); existing <- result{l, err} }()
	go func() { l, err := s3.LockForProvision(timeout(t, 10*time.Second), "a"); prov <- result{l, err} }()
	// Remove only once both wait on the old lock file.
	for a2.count() < 2 || a3.count() < 2 {
		time.Sleep(time.Millisecond)
	}
	if err := holder.Deprovision(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	p := <-prov
	if p.err != nil {
		t.Fatalf("provision after removal = %v", p.err)
	}
	if has, err := p.l.Provisioned(); err != nil || has {
		t.Fatalf("provision found a configuration record after removal: %v, %v", has, err)
	}
	p.l.Unlock()
	e := <-existing
	// The waiter either saw the removal (not found) or came after the provision's Unlock,
	// which removed the directory again since it wrote no record.
	if e.err == nil {
		e.l.Unlock()
		t.Fatal("LockExisting locked a removed sandbox")
	}
	wantCode(t, e.err, errcode.SandboxNotFound)
	if exists(filepath.Join(s.Root(), SandboxesDir, "a")) {
		t.Fatalf("directory left: %v", entriesOf(t, filepath.Join(s.Root(), SandboxesDir, "a")))
	}
}

func TestProvisionRefusesNonPrivateDirectory(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	dir := filepath.Join(s.Root(), SandboxesDir, "a")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	var a attempts
	a.install(s, "", nil)
	_, err := s.LockForProvision(timeout(t, time.Minute), "a")
	if !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("provision in a 0750 directory = %v; want ErrNotPrivate", err)
	}
	if a.count() != 1 {
		t.Fatal("the refusal was retried")
	}
	if exists(filepath.Join(dir, LockName)) {
		t.Fatal("the refused provision created a lock file")
	}
	if os.Geteuid() == 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := s.LockForProvision(timeout(t, time.Minute), "a"); !errors.Is(err, ErrNotPrivate) {
			t.Fatalf("provision in a directory of another user = %v; want ErrNotPrivate", err)
		}
		if err := os.Chown(dir, 0, 0); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Log("not root: the other-owner case needs root to chown and is skipped")
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := s.LockForProvision(timeout(t, time.Minute), "a")
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock()
}

func TestUnlockRemovesOwnLockFileWithoutConfig(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	sbx := filepath.Join(s.Root(), SandboxesDir)

	// A provision that wrote nothing leaves nothing.
	l, err := s.LockForProvision(timeout(t, time.Second), "a")
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	if exists(filepath.Join(sbx, "a")) {
		t.Fatal("an abandoned provision left its directory")
	}

	// With a configuration record the lock file stays.
	provision(t, s, "b")
	if !exists(filepath.Join(sbx, "b", LockName)) {
		t.Fatal("the lock file of a provisioned sandbox was removed")
	}

	// Other entries keep the directory, but not the lock file.
	l, err = s.LockForProvision(timeout(t, time.Second), "c")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.Dir(), "sandbox.log"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	if got := entriesOf(t, filepath.Join(sbx, "c")); len(got) != 1 || got[0] != "sandbox.log" {
		t.Fatalf("directory holds %v; want only sandbox.log", got)
	}
}

func TestUnlockKeepsALockFileThatIsNotItsOwn(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	l, err := s.LockForProvision(timeout(t, time.Second), "a")
	if err != nil {
		t.Fatal(err)
	}
	// Something replaced the entry: it is not this holder's file, so it must not remove it.
	lockPath := filepath.Join(l.Dir(), LockName)
	other := filepath.Join(l.Dir(), "other")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, lockPath); err != nil {
		t.Fatal(err)
	}
	before, err := os.Lstat(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	after, err := os.Lstat(lockPath)
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the replacement lock file was removed or changed: %v", err)
	}
}

func TestRequireUnprovisioned(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l, err := s.LockForProvision(timeout(t, time.Second), "a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	wantCode(t, l.RequireUnprovisioned(), errcode.AlreadyProvisioned)
	if has, err := l.Provisioned(); !has || err != nil {
		t.Fatalf("Provisioned() = %v, %v", has, err)
	}
}

func TestLockRemovesLeftoverTempsOfLockedRecords(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	dir := filepath.Join(s.Root(), SandboxesDir, "a")
	gone := []string{platform.TempName(ConfigName), platform.TempName(LaunchName), platform.TempName(RuntimeName)}
	// The outcome is staged without the lock, and clone.json belongs to another component.
	kept := []string{platform.TempName(OutcomeName), platform.TempName("clone.json")}
	for _, name := range append(append([]string{}, gone...), kept...) {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	lockExisting(t, s, "a")
	for _, name := range gone {
		if exists(filepath.Join(dir, name)) {
			t.Errorf("leftover %s kept", name)
		}
	}
	for _, name := range kept {
		if !exists(filepath.Join(dir, name)) {
			t.Errorf("%s removed", name)
		}
	}
}

func TestStateDirectoryThatIsALink(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(s.Root(), SandboxesDir, "a")); err != nil {
		t.Fatal(err)
	}
	var a attempts
	a.install(s, "", nil)
	for name, lock := range map[string]func(context.Context, string) (*Lock, error){
		"provision": s.LockForProvision, "existing": s.LockExisting,
	} {
		if l, err := lock(timeout(t, time.Minute), "a"); err == nil {
			l.Unlock()
			t.Fatalf("%s locked through a link", name)
		} else if errcode.Of(err) != errcode.Internal {
			t.Fatalf("%s = %v; want an internal error", name, err)
		}
	}
	if a.count() != 2 {
		t.Fatalf("%d attempts; the refusals must not be retried", a.count())
	}
	if _, err := s.ReadConfigUnlocked("a"); errcode.Of(err) != errcode.Internal {
		t.Fatalf("ReadConfigUnlocked through a link = %v", err)
	}
	if got := entriesOf(t, elsewhere); len(got) != 0 {
		t.Fatalf("the link's target got %v", got)
	}
}
