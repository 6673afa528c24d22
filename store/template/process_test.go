package template

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
)

// Multi-process and crash tests re-execute the test binary: TestMain runs a helper instead of
// the tests when helperEnv names one. The helper's parameters come in helperArgsEnv as JSON.
const (
	helperEnv     = "BOTHY_TEMPLATE_HELPER"
	helperArgsEnv = "BOTHY_TEMPLATE_HELPER_ARGS"
	// crashEnv names a durable step (a Step* constant, "binding:write", "binding:remove", or
	// "capture:progress" for the middle of a copy) at which the helper kills itself with
	// SIGKILL.
	crashEnv = "BOTHY_TEMPLATE_CRASH_AT"
	// exitRefused is the helper's exit status when the operation was refused with a domain
	// error (printed on stdout); any other failure exits 1.
	exitRefused = 3
)

type helperArgs struct {
	Root      string       `json:"root"`
	Name      string       `json:"name"`
	Gen       string       `json:"gen"`
	Sandboxes []string     `json:"sandboxes"`
	Log       string       `json:"log"`
	Src       string       `json:"src"`
	Now       TimeContract `json:"now"`
	// Release makes a clone helper release each lease right after taking it.
	Release bool `json:"release"`
}

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(m.Run())
}

func appendLog(path, line string) {
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		panic(err)
	}
	// One write of a short line with O_APPEND: lines of several processes never interleave.
	if _, err := f.WriteString(line + "\n"); err != nil {
		panic(err)
	}
	f.Close()
}

func crashAt(step string) {
	if step == os.Getenv(crashEnv) {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

func runHelper(mode string) int {
	var a helperArgs
	if err := json.Unmarshal([]byte(os.Getenv(helperArgsEnv)), &a); err != nil {
		fmt.Println(err)
		return 1
	}
	hook := func(step string) { crashAt(step) }
	testBindingHook.Store(&hook)
	var onSync func(string)
	switch mode {
	case "tombstone":
		onSync = func(step string) {
			if step == StepTombstone {
				appendLog(a.Log, "tombstone-durable")
			}
			crashAt(step)
		}
	case "retire":
		onSync = func(step string) {
			if step == StepRetirePayload {
				// The payload is gone: no binding may name this generation now.
				for _, b := range bindingsOf(a.Root, a.Name, a.Gen) {
					appendLog(a.Log, "VIOLATION binding of "+b)
				}
			}
			crashAt(step)
		}
	default:
		onSync = crashAt
	}
	s, err := Open(a.Root, Options{OnSync: onSync, Now: func() (TimeContract, error) { return a.Now, nil }})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fail := func(err error) int {
		fmt.Println(err)
		if errcode.Of(err) != "" && errcode.Of(err) != errcode.Internal {
			return exitRefused
		}
		return 1
	}
	bindingExists := BindingChecker(func(id string) (string, error) { return filepath.Join(a.Root, "sandboxes", id), nil })
	switch mode {
	case "clone":
		for _, id := range a.Sandboxes {
			l, err := helperClone(ctx, s, a, id)
			if err != nil {
				return fail(err)
			}
			if a.Release {
				if err := helperRelease(ctx, s, a.Root, id); err != nil {
					return fail(err)
				}
				appendLog(a.Log, "release "+id+" "+l.ID)
			}
		}
	case "release":
		for _, id := range a.Sandboxes {
			if err := helperRelease(ctx, s, a.Root, id); err != nil {
				return fail(err)
			}
			appendLog(a.Log, "release "+id)
		}
	case "tombstone":
		if _, err := s.Tombstone(ctx, a.Name, a.Gen); err != nil {
			return fail(err)
		}
	case "retire":
		for {
			out, err := s.Retire(ctx, a.Name, a.Gen, false, bindingExists)
			if err == nil && out == Retired {
				appendLog(a.Log, "retired")
				return 0
			}
			if errcode.Of(err) != errcode.GenerationLeased {
				return fail(err)
			}
			// Leases remain: wait for the releases, bounded by ctx.
			select {
			case <-ctx.Done():
				return fail(err)
			case <-time.After(5 * time.Millisecond):
			}
		}
	case "retire-once":
		if _, err := s.Retire(ctx, a.Name, a.Gen, false, bindingExists); err != nil {
			return fail(err)
		}
	case "capture":
		g, err := s.Capture(ctx, a.Name, a.Src, testKey, func(copied, total int64) {
			if copied > 0 && copied < total {
				crashAt("capture:progress")
			}
		})
		if err != nil {
			return fail(err)
		}
		fmt.Println(g.ID)
	default:
		fmt.Println("unknown helper", mode)
		return 1
	}
	return 0
}

func helperClone(ctx context.Context, s *Store, a helperArgs, id string) (*Lease, error) {
	dir := filepath.Join(a.Root, "sandboxes", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	tx, err := s.Lock(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Unlock()
	if err := CheckUnbound(dir, id); err != nil {
		return nil, err
	}
	if _, err := tx.Leasable(a.Name, a.Gen, a.Now); err != nil {
		return nil, err
	}
	l, err := tx.WriteLease(a.Name, a.Gen, id)
	if err != nil {
		return nil, err
	}
	// Logged while the lock is held, so the log's order is the lock's order.
	appendLog(a.Log, "lease "+id+" "+l.ID)
	if err := WriteBinding(dir, NewBinding(l)); err != nil {
		return nil, err
	}
	return l, nil
}

func helperRelease(ctx context.Context, s *Store, root, id string) error {
	dir := filepath.Join(root, "sandboxes", id)
	b, err := ReadBinding(dir)
	if err != nil {
		return err
	}
	if err := RemoveBinding(dir); err != nil {
		return err
	}
	return s.Release(ctx, b.Template, b.Generation, b.Lease)
}

// bindingsOf lists the sandboxes whose clone.json names the generation.
func bindingsOf(root, name, gen string) []string {
	entries, _ := os.ReadDir(filepath.Join(root, "sandboxes"))
	var out []string
	for _, e := range entries {
		b, err := ReadBinding(filepath.Join(root, "sandboxes", e.Name()))
		if err == nil && b.Template == name && b.Generation == gen {
			out = append(out, e.Name())
		}
	}
	return out
}

// helper starts a helper process.
func (e *env) helper(t testing.TB, mode string, a helperArgs, crash string) *exec.Cmd {
	t.Helper()
	a.Root = e.root
	a.Now = e.clock.get()
	args, _ := json.Marshal(a)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperArgsEnv+"="+string(args), crashEnv+"="+crash)
	cmd.Stdout = &strings.Builder{}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// wait waits for a helper and returns its exit status (-1 when killed by SIGKILL).
func wait(t testing.TB, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return -1
		}
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

func output(cmd *exec.Cmd) string { return cmd.Stdout.(*strings.Builder).String() }

func readLog(t testing.TB, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + "-" + strconv.Itoa(i)
	}
	return out
}

func TestProcessesLeaseOneGeneration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	log := filepath.Join(t.TempDir(), "log")
	const procs, each = 6, 3
	var cmds []*exec.Cmd
	for p := range procs {
		cmds = append(cmds, e.helper(t, "clone", helperArgs{Name: "py", Gen: gen, Sandboxes: ids(fmt.Sprintf("p%d", p), each), Log: log}, ""))
	}
	for _, c := range cmds {
		if st := wait(t, c); st != 0 {
			t.Fatalf("clone helper exited %d: %s", st, output(c))
		}
	}
	leases, err := e.s.Leases("py", gen)
	if err != nil || len(leases) != procs*each {
		t.Fatalf("%d leases, %v", len(leases), err)
	}
	if lines := readLog(t, log); len(lines) != procs*each {
		t.Fatalf("log %v", lines)
	}
	for _, l := range leases {
		b, err := ReadBinding(filepath.Join(e.root, "sandboxes", l.Sandbox))
		if err != nil || b.Lease != l.ID {
			t.Fatalf("lease %+v: binding %+v, %v", l, b, err)
		}
	}
}

func TestProcessesTombstoneRacesLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	log := filepath.Join(t.TempDir(), "log")
	var cmds []*exec.Cmd
	for p := range 4 {
		cmds = append(cmds, e.helper(t, "clone", helperArgs{Name: "py", Gen: gen, Sandboxes: ids(fmt.Sprintf("p%d", p), 25), Log: log}, ""))
	}
	// Tombstone once leasing is under way, so that it lands among the acquisitions.
	waitFor(t, func() bool { return len(readLog(t, log)) >= 2 })
	tomb := e.helper(t, "tombstone", helperArgs{Name: "py", Gen: gen, Log: log}, "")
	if st := wait(t, tomb); st != 0 {
		t.Fatalf("tombstone exited %d: %s", st, output(tomb))
	}
	for _, c := range cmds {
		st := wait(t, c)
		if st != 0 && !(st == exitRefused && strings.Contains(output(c), string(errcode.TemplateTombstoned))) {
			t.Fatalf("clone helper exited %d: %s", st, output(c))
		}
	}
	lines := readLog(t, log)
	durable := -1
	leased := 0
	for i, line := range lines {
		switch {
		case line == "tombstone-durable":
			durable = i
		case strings.HasPrefix(line, "lease "):
			if durable >= 0 {
				t.Fatalf("a lease was written after the tombstone was durable: %v", lines[durable:])
			}
			leased++
		}
	}
	if durable < 0 {
		t.Fatal("no tombstone in the log")
	}
	leases, _ := e.s.Leases("py", gen)
	if len(leases) != leased {
		t.Fatalf("%d lease records, %d logged", len(leases), leased)
	}
	if leased == 100 {
		t.Log("the tombstone came after every acquisition; the race was not exercised this time")
	}
}

func TestProcessesRetireRacesLeasesAndReleases(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	log := filepath.Join(t.TempDir(), "log")
	for _, id := range ids("r", 4) {
		e.mustClone(t, "py", gen, id)
	}
	var cmds []*exec.Cmd
	for p := range 3 {
		cmds = append(cmds, e.helper(t, "clone", helperArgs{Name: "py", Gen: gen, Sandboxes: ids(fmt.Sprintf("p%d", p), 20), Log: log, Release: true}, ""))
	}
	waitFor(t, func() bool { return len(readLog(t, log)) >= 2 })
	retire := e.helper(t, "retire", helperArgs{Name: "py", Gen: gen, Log: log}, "")
	rel := e.helper(t, "release", helperArgs{Sandboxes: ids("r", 4), Log: log}, "")
	for _, c := range append(cmds, rel, retire) {
		st := wait(t, c)
		refused := st == exitRefused && (strings.Contains(output(c), string(errcode.TemplateTombstoned)) || strings.Contains(output(c), string(errcode.GenerationNotFound)))
		if st != 0 && !refused {
			t.Fatalf("helper %s exited %d: %s", c.Env[len(c.Env)-3], st, output(c))
		}
	}
	lines := readLog(t, log)
	for _, line := range lines {
		if strings.HasPrefix(line, "VIOLATION") {
			t.Fatalf("retirement deleted a generation that a binding names: %s", line)
		}
	}
	if lines[len(lines)-1] != "retired" && !contains(lines, "retired") {
		t.Fatalf("no retirement: %v", lines)
	}
	if b := bindingsOf(e.root, "py", gen); len(b) != 0 {
		t.Fatalf("bindings name the retired generation: %v", b)
	}
	if exists(filepath.Join(e.s.Path(), "py", gen)) {
		t.Fatal("generation remains")
	}
}

func contains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}

// waitFor waits for cond, polling, up to 20 s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 20 s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
