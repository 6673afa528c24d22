package store

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
)

// The tests here re-execute the test binary: TestMain runs a helper instead of the tests when
// helperEnv names one, so that locks are really held by other processes.
const (
	helperEnv  = "STORE_TEST_HELPER"
	rootEnv    = "STORE_TEST_ROOT"
	idEnv      = "STORE_TEST_ID"
	roundsEnv  = "STORE_TEST_ROUNDS"
	seedEnv    = "STORE_TEST_SEED"
	markersEnv = "STORE_TEST_MARKERS"
)

var (
	raceRounds = flag.Int("race-rounds", envInt("STORE_RACE_ROUNDS", 200),
		"rounds each process of the multi-process race test runs (also STORE_RACE_ROUNDS)")
	raceProcs = flag.Int("race-procs", envInt("STORE_RACE_PROCS", 4),
		"processes racing in the multi-process race test (also STORE_RACE_PROCS)")
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func TestMain(m *testing.M) {
	helper := os.Getenv(helperEnv)
	if helper == "" {
		os.Exit(m.Run())
	}
	var err error
	switch helper {
	case "race":
		err = raceHelper()
	case "hold":
		err = holdHelper()
	case "hammer":
		err = hammerHelper()
	case "pingpong":
		err = pingpongHelper()
	default:
		err = fmt.Errorf("unknown helper %q", helper)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper %s: %v\n", helper, err)
		os.Exit(3)
	}
	os.Exit(0)
}

// declareNames declares what declareAll does, for helpers that have no testing.TB.
func declareNames(s *Store) error {
	for _, name := range []string{"exec.lock", "clone.json", "control.capability", "sandbox.log"} {
		if err := s.Declare(name, EntryFile); err != nil {
			return err
		}
	}
	for _, name := range []string{"control", "upper", "work", "rootfs"} {
		if err := s.Declare(name, EntryDir); err != nil {
			return err
		}
	}
	return nil
}

func helperStore() (*Store, string, error) {
	s, err := Open(os.Getenv(rootEnv))
	if err != nil {
		return nil, "", err
	}
	if err := declareNames(s); err != nil {
		return nil, "", err
	}
	return s, os.Getenv(idEnv), nil
}

// helperCmd prepares a helper process.
func helperCmd(t testing.TB, helper, root, id string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+helper, rootEnv+"="+root, idEnv+"="+id)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// raceCounts is what a race helper reports.
type raceCounts struct {
	Provisioned, AlreadyProvisioned, Locked, NotFound, Removed, ProvisionedAgain int
	// Flocked counts flocks taken, Acquired the locks that passed the identity checks; the
	// difference is how often a waiter locked a lock file that a removal had taken away.
	Flocked, Acquired int
}

// raceHelper runs rounds of random transitions on one id. Every acquisition of the lock —
// including those inside the store, such as a removal's wait — creates a marker file with
// O_EXCL in a directory shared by all processes, and removes it when the lock stops
// excluding others; a second holder at any moment finds the marker and fails.
func raceHelper() error {
	s, id, err := helperStore()
	if err != nil {
		return err
	}
	marker := filepath.Join(os.Getenv(markersEnv), "holder")
	holding := false
	var c raceCounts
	rounds, _ := strconv.Atoi(os.Getenv(roundsEnv))
	seed, _ := strconv.ParseUint(os.Getenv(seedEnv), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 1))
	s.testHook = func(point string) {
		switch point {
		case hookOpened, hookUnlinked:
			// Widen the two windows the protocol must survive: a waiter holding a lock file
			// open while a removal takes it away, and a waiter creating a lock file between a
			// removal's unlink and rmdir.
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
		case hookFlocked:
			c.Flocked++
		case hookLocked:
			c.Acquired++
			f, err := os.OpenFile(marker, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				fmt.Fprintf(os.Stderr, "two holders of the lock at once: %v\n", err)
				os.Exit(4)
			}
			fmt.Fprintf(f, "%d\n", os.Getpid())
			f.Close()
			holding = true
		case hookEnded:
			if holding {
				holding = false
				if err := os.Remove(marker); err != nil {
					fmt.Fprintf(os.Stderr, "the lock marker vanished: %v\n", err)
					os.Exit(4)
				}
			}
		}
	}
	for round := 0; round < rounds; round++ {
		if err := raceRound(s, id, rng.IntN(3), &c); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		// Jitter, so that the processes interleave in ever other ways rather than one of them
		// winning every retry.
		time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
	}
	return json.NewEncoder(os.Stdout).Encode(c)
}

func raceRound(s *Store, id string, op int, c *raceCounts) error {
	// Generous: in a correct store no wait comes near it, so a timeout is a failure.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if op == 0 {
		l, err := s.LockForProvision(ctx, id)
		if err != nil {
			return fmt.Errorf("provision: %w", err)
		}
		defer l.Unlock()
		has, err := l.Provisioned()
		if err != nil {
			return err
		}
		if has {
			c.AlreadyProvisioned++
			return checkWhole(l)
		}
		// An unprovisioned directory under the lock holds the lock file and nothing else:
		// nothing was left half-removed.
		if got := dirEntries(l.Dir()); !slices.Equal(got, []string{LockName}) {
			return fmt.Errorf("unprovisioned directory holds %v", got)
		}
		if err := os.WriteFile(filepath.Join(l.Dir(), "sandbox.log"), []byte("log"), 0o600); err != nil {
			return err
		}
		if err := os.Mkdir(filepath.Join(l.Dir(), "upper"), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(l.Dir(), "upper", "f"), nil, 0o600); err != nil {
			return err
		}
		if err := l.WriteConfig(config(id)); err != nil {
			return err
		}
		c.Provisioned++
		return nil
	}
	l, err := s.LockExisting(ctx, id)
	if errors.Is(err, errcode.SandboxNotFound) {
		c.NotFound++
		return nil
	}
	if err != nil {
		return fmt.Errorf("lock existing: %w", err)
	}
	defer l.Unlock()
	if err := checkWhole(l); err != nil {
		return err
	}
	if op == 1 {
		c.Locked++
		return nil
	}
	err = l.Deprovision(ctx)
	switch {
	case err == nil:
		c.Removed++
	case errors.Is(err, errcode.ProvisionedAgain):
		c.ProvisionedAgain++
	default:
		return fmt.Errorf("deprovision: %w", err)
	}
	return nil
}

// checkWhole checks, under the lock, that a provisioned sandbox is whole.
func checkWhole(l *Lock) error {
	c, err := l.Config()
	if err != nil {
		return err
	}
	if c.ID != l.ID() {
		return fmt.Errorf("configuration record of %q", c.ID)
	}
	want := []string{ConfigName, LockName, "sandbox.log", "upper"}
	if got := dirEntries(l.Dir()); !slices.Equal(got, want) {
		return fmt.Errorf("provisioned directory holds %v; want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(l.Dir(), "upper", "f")); err != nil {
		return err
	}
	return nil
}

func dirEntries(dir string) []string {
	es, _ := os.ReadDir(dir)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// TestMultiProcessRace races processes doing provision, lock and removal on one id for many
// rounds (-race-rounds, default 200 per process). It checks that there are never two holders,
// that every removal ends in success or provisioned-again, that nothing is left half-removed
// and that no lock file stays in a directory without a configuration record.
func TestMultiProcessRace(t *testing.T) {
	root, markers := t.TempDir(), t.TempDir()
	s := openStore(t, root)
	procs, rounds := *raceProcs, *raceRounds
	t.Logf("%d processes × %d rounds", procs, rounds)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total raceCounts
	)
	for i := 0; i < procs; i++ {
		cmd := helperCmd(t, "race", root, "racer",
			roundsEnv+"="+strconv.Itoa(rounds), seedEnv+"="+strconv.Itoa(i+1), markersEnv+"="+markers)
		var out strings.Builder
		cmd.Stdout = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cmd.Wait(); err != nil {
				t.Errorf("racer %d: %v", i, err)
				return
			}
			var c raceCounts
			if err := json.Unmarshal([]byte(out.String()), &c); err != nil {
				t.Errorf("racer %d: %v in %q", i, err, out.String())
				return
			}
			mu.Lock()
			defer mu.Unlock()
			total.Provisioned += c.Provisioned
			total.AlreadyProvisioned += c.AlreadyProvisioned
			total.Locked += c.Locked
			total.NotFound += c.NotFound
			total.Removed += c.Removed
			total.ProvisionedAgain += c.ProvisionedAgain
			total.Flocked += c.Flocked
			total.Acquired += c.Acquired
		}()
	}
	wg.Wait()
	t.Logf("%+v", total)
	if total.Provisioned == 0 || total.Removed == 0 {
		t.Fatalf("the race exercised too little: %+v", total)
	}
	if got := dirEntries(markers); len(got) != 0 {
		t.Fatalf("lock markers left: %v", got)
	}
	dir := filepath.Join(root, SandboxesDir, "racer")
	if !exists(dir) {
		return
	}
	l, err := s.LockExisting(timeout(t, 5*time.Second), "racer")
	if errors.Is(err, errcode.SandboxNotFound) {
		// Not provisioned: then nothing may remain, not even a lock file.
		if exists(dir) {
			t.Fatalf("an unprovisioned directory was left: %v", dirEntries(dir))
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if err := checkWhole(l); err != nil {
		t.Fatal(err)
	}
}

// holdHelper takes the lock, says so on stdout, and keeps it until stdin closes (or it is
// killed).
func holdHelper() error {
	s, id, err := helperStore()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := s.LockExisting(ctx, id)
	if err != nil {
		return err
	}
	fmt.Println("locked")
	io.Copy(io.Discard, os.Stdin)
	return l.Unlock()
}

// startHolder starts a holdHelper and waits until it holds the lock.
func startHolder(t *testing.T, root, id string) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	cmd := helperCmd(t, "hold", root, id)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("holder said %q, %v", line, err)
	}
	return cmd, stdin
}

func TestLockHeldByAnotherProcess(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	_, stdin := startHolder(t, s.Root(), "a")

	var a attempts
	a.install(s, "", nil)
	ctx := timeout(t, 300*time.Millisecond)
	deadline, _ := ctx.Deadline()
	_, err := s.LockExisting(ctx, "a")
	wantCode(t, err, errcode.TransitionInProgress)
	a.mu.Lock()
	for i, at := range a.times {
		if !at.Before(deadline) {
			t.Errorf("attempt %d started after the deadline", i)
		}
	}
	n := len(a.times)
	a.mu.Unlock()
	// A loaded machine may stretch the gaps between attempts, so only a retry is asked for.
	if n < 2 {
		t.Fatalf("%d attempt in 300 ms; want retries", n)
	}

	// The waiter gets the lock once the other process lets it go.
	done := make(chan error, 1)
	go func() {
		l, err := s.LockExisting(timeout(t, 10*time.Second), "a")
		if err == nil {
			err = l.Unlock()
		}
		done <- err
	}()
	stdin.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestCrashedHolderDoesNotWedgeTheLock(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	cmd, _ := startHolder(t, s.Root(), "a")
	if _, err := s.LockExisting(timeout(t, 60*time.Millisecond), "a"); !errors.Is(err, errcode.TransitionInProgress) {
		t.Fatalf("lock while another process holds it = %v", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	l, err := s.LockExisting(timeout(t, 5*time.Second), "a")
	if err != nil {
		t.Fatalf("lock after the holder died = %v", err)
	}
	l.Unlock()
}

// hammerHelper takes and releases the lock in a loop until stdin closes.
func hammerHelper() error {
	s, id, err := helperStore()
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stop) }()
	fmt.Println("started")
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		l, err := s.LockExisting(ctx, id)
		cancel()
		if err != nil {
			return err
		}
		if err := l.Unlock(); err != nil {
			return err
		}
	}
}

// pingpongHelper takes the lock when told "go" (reporting "waiting" once it found it busy and
// "got" once it holds it), and releases it when told "release". See BenchmarkContendedHandoff.
func pingpongHelper() error {
	s, id, err := helperStore()
	if err != nil {
		return err
	}
	signalled := false
	s.testHook = func(point string) {
		if point == hookBusy && !signalled {
			signalled = true
			fmt.Println("waiting")
		}
	}
	in := bufio.NewReader(os.Stdin)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for {
		if line, err := in.ReadString('\n'); err == io.EOF {
			return nil
		} else if err != nil || line != "go\n" {
			return fmt.Errorf("told %q, %v; want go", line, err)
		}
		signalled = false
		l, err := s.LockExisting(ctx, id)
		if err != nil {
			return err
		}
		if !signalled {
			return errors.New("took the lock without waiting for it")
		}
		fmt.Println("got")
		if line, err := in.ReadString('\n'); err != nil || line != "release\n" {
			return fmt.Errorf("told %q, %v; want release", line, err)
		}
		if err := l.Unlock(); err != nil {
			return err
		}
	}
}
