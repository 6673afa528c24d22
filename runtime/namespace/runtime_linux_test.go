//go:build linux

package namespace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

func needRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("the namespace runtime needs root; CI runs these tests as root")
	}
}

func newTestRuntime(tb testing.TB) *Runtime {
	tb.Helper()
	needRoot(tb)
	rt, err := New(Config{CgroupParent: testCgroupParent})
	if err != nil {
		tb.Skipf("namespace runtime unavailable here: %v", err)
	}
	return rt
}

// newStateRoot makes a state root with a sandboxes/ directory, remembered for the leak check.
func newStateRoot(tb testing.TB) string {
	root, err := os.MkdirTemp("", "bothyd-ns-test-")
	if err != nil {
		tb.Fatal(err)
	}
	testRoots = append(testRoots, root)
	tb.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.Mkdir(filepath.Join(root, "sandboxes"), 0o700); err != nil {
		tb.Fatal(err)
	}
	return root
}

type sandbox struct {
	rt     *Runtime
	spec   runtime.Spec
	id     platform.ProcessID
	client *control.Client
}

var sandboxSeq int

// startSandbox starts a sandbox and waits until its agent answers.
func startSandbox(tb testing.TB, rt *Runtime, root, name string, res runtime.Resources) *sandbox {
	tb.Helper()
	sandboxSeq++
	id := fmt.Sprintf("%s-%d-%d", name, os.Getpid(), sandboxSeq)
	dir := filepath.Join(root, "sandboxes", id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	spec := runtime.Spec{ID: id, Dir: dir, LaunchID: "launch-" + id, Image: "host",
		Resources: res, Capability: []byte("secret-" + id)}
	pid, err := rt.Start(context.Background(), spec)
	if err != nil {
		tb.Fatal(err)
	}
	s := &sandbox{rt: rt, spec: spec, id: pid}
	tb.Cleanup(func() { s.destroy(tb) })
	if err := s.waitReady(15 * time.Second); err != nil {
		tb.Fatal(err)
	}
	return s
}

func (s *sandbox) log() string {
	b, _ := os.ReadFile(filepath.Join(s.spec.Dir, shim.EntryLog))
	return string(b)
}

// destroy kills the sandbox if it still runs and cleans up after it.
func (s *sandbox) destroy(tb testing.TB) {
	if s.client != nil {
		s.client.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.rt.Kill(ctx, s.spec.Dir, s.id); err != nil {
		tb.Errorf("kill: %v", err)
	}
	if err := s.rt.Cleanup(ctx, s.spec.ID, s.spec.Dir, s.id); err != nil {
		tb.Errorf("cleanup: %v", err)
	}
}

// dial connects to the sandbox's agent.
func (s *sandbox) dial(timeout time.Duration) (*control.Client, error) {
	conn, err := net.DialTimeout("unix", s.rt.ControlPath(s.spec.Dir), timeout)
	if err != nil {
		return nil, err
	}
	return control.Dial(conn, s.spec.Capability, timeout)
}

func (s *sandbox) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := s.dial(time.Second)
		if err == nil {
			s.client = c
			return nil
		}
		if !s.id.Alive() {
			return fmt.Errorf("the shim exited before the agent answered; sandbox.log:\n%s", s.log())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not answer within %v (%v); sandbox.log:\n%s", timeout, err, s.log())
		}
		time.Sleep(time.Millisecond)
	}
}

type execResult struct {
	Output string
	Code   int
	Signal string
}

// sh runs a shell script inside the sandbox as user ("user" or "root").
func (s *sandbox) sh(tb testing.TB, user, script string) execResult {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := s.client.Exec(ctx, control.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, User: user, TimeoutMS: 60000})
	if err != nil {
		tb.Fatalf("exec %q: %v", script, err)
	}
	var out bytes.Buffer
	errc := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(p.Stderr); errc <- b }()
	_, _ = io.Copy(&out, p.Stdout)
	out.Write(<-errc)
	st, err := p.Wait()
	if err != nil {
		tb.Fatalf("exec %q: %v", script, err)
	}
	return execResult{Output: out.String(), Code: st.ExitCode, Signal: st.Signal}
}

func (s *sandbox) shutdown(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.client.Shutdown(ctx, time.Second); err != nil {
		tb.Fatal(err)
	}
}

func (s *sandbox) waitShimGone(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := waitGone(ctx, s.id); err != nil {
		tb.Fatalf("the shim did not exit: %v\n%s", err, s.log())
	}
}

func (s *sandbox) outcome(tb testing.TB) runtime.Outcome {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(s.spec.Dir, runtime.OutcomeName))
	if err != nil {
		tb.Fatalf("no outcome report: %v\n%s", err, s.log())
	}
	var o runtime.Outcome
	if err := json.Unmarshal(b, &o); err != nil {
		tb.Fatal(err)
	}
	if o.LaunchID != s.spec.LaunchID {
		tb.Fatalf("outcome of launch %q, want %q", o.LaunchID, s.spec.LaunchID)
	}
	return o
}

func (s *sandbox) cgroup(tb testing.TB) *platform.Cgroup {
	cg, err := platform.OpenCgroup(s.rt.cgroupName(s.spec.ID, s.spec.Dir))
	if err != nil {
		tb.Fatal(err)
	}
	return cg
}

func (s *sandbox) initOf(tb testing.TB) platform.ProcessID {
	tb.Helper()
	procs, err := s.rt.Processes(filepath.Dir(filepath.Dir(s.spec.Dir)))
	if err != nil {
		tb.Fatal(err)
	}
	for _, p := range procs {
		if p.Role == "init" && p.Dir == s.spec.Dir {
			return p.ID
		}
	}
	tb.Fatalf("no init found for %s", s.spec.Dir)
	return platform.ProcessID{}
}

func TestIsolation(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	other := startSandbox(t, rt, root, "other", runtime.Resources{})
	s := startSandbox(t, rt, root, "iso", runtime.Resources{})
	// A file of the other sandbox, and the paths of both state directories.
	if r := other.sh(t, "root", "echo other-secret > /home/user/secret"); r.Code != 0 {
		t.Fatalf("write in the other sandbox: %+v", r)
	}

	// The sandbox's own memory limit, where the read-only cgroup mount inside shows it.
	memoryMax := "/sys/fs/cgroup/memory/memory.limit_in_bytes"
	if v, err := platform.CgroupVersion(); err == nil && v == 2 {
		memoryMax = "/sys/fs/cgroup/memory.max"
	}

	cases := []struct {
		name   string
		user   string
		script string
		check  func(out string) bool
	}{
		{"only its own processes", "root", `ls /proc | grep -c '^[0-9]*$'; cat /proc/1/cmdline | tr '\0' ' '`,
			func(out string) bool {
				lines := strings.Split(strings.TrimSpace(out), "\n")
				n, _ := strconv.Atoi(lines[0])
				return n > 0 && n <= 4 && strings.Contains(out, shim.InitCommand)
			}},
		{"no host shadow", "root", `cat /etc/shadow; echo rc=$?`, func(out string) bool { return strings.Contains(out, "rc=1") }},
		{"host root home not visible", "root", `ls -A /root | wc -l`, func(out string) bool { return strings.TrimSpace(out) == "0" }},
		{"state root not visible", "root", fmt.Sprintf(`test -e %s; echo rc=$?`, root), func(out string) bool { return strings.Contains(out, "rc=1") }},
		{"other sandbox not visible", "root", fmt.Sprintf(`cat %s/upper/home/user/secret; grep -rs other-secret /home /root /tmp /var /run /etc /mnt /opt /srv; echo rc=$?`, other.spec.Dir),
			func(out string) bool { return !strings.Contains(out, "other-secret") }},
		{"usr read-only as root", "root", `touch /usr/x; echo rc=$?; touch /bin/x; echo rc=$?`, func(out string) bool { return strings.Count(out, "rc=1") == 2 }},
		{"only loopback", "root", `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`, func(out string) bool { return strings.TrimSpace(out) == "lo" }},
		{"hostname is the id", "root", `cat /proc/sys/kernel/hostname`, func(out string) bool { return strings.TrimSpace(out) == s.spec.ID }},
		{"workload user", "user", `id -u; id -g; pwd; touch /home/user/f && echo wrote`, func(out string) bool {
			return strings.HasPrefix(out, "1000\n1000\n") && strings.Contains(out, "/home/user") && strings.Contains(out, "wrote")
		}},
		{"layout", "user", `stat -c '%n %a %u' /tmp /home/user /root /run/bothyd /usr; readlink /bin; head -c 4 /etc/passwd; touch /tmp/t && echo tmp-ok`, func(out string) bool {
			return strings.Contains(out, "/tmp 1777 0") && strings.Contains(out, "/home/user 755 1000") &&
				strings.Contains(out, "/root 700 0") && strings.Contains(out, "/run/bothyd 700 0") &&
				strings.Contains(out, "usr/bin") && strings.Contains(out, "root") && strings.Contains(out, "tmp-ok")
		}},
		{"user cannot reach the socket", "user", `ls /run/bothyd; echo rc=$?`, func(out string) bool { return strings.Contains(out, "rc=2") }},
		{"user has no capabilities", "user", `grep CapEff /proc/self/status`, func(out string) bool { return strings.Contains(out, "0000000000000000") }},
		{"root capabilities bounded", "root", `grep -E 'CapBnd|NoNewPrivs|Seccomp:' /proc/self/status`, func(out string) bool {
			return !strings.Contains(out, "000001ffffffffff") && strings.Contains(out, "NoNewPrivs:\t1") && strings.Contains(out, "Seccomp:\t2")
		}},
		{"no mount as root", "root", `mkdir -p /tmp/m && mount -t tmpfs x /tmp/m; echo rc=$?`, func(out string) bool { return !strings.Contains(out, "rc=0") }},
		{"devices", "root", `echo hi > /dev/null && head -c 4 /dev/urandom | wc -c && ls /dev/pts/ptmx /dev/shm && readlink /dev/ptmx`, func(out string) bool {
			return strings.Contains(out, "4\n") && strings.Contains(out, "pts/ptmx")
		}},
		{"own cgroup read-only", "root", fmt.Sprintf(`cat %[1]s; echo 1 > %[1]s; echo rc=$?`, memoryMax), func(out string) bool {
			return strings.HasPrefix(out, strconv.Itoa(DefaultResources.MemoryMB<<20)+"\n") && !strings.Contains(out, "rc=0")
		}},
		{"agent unreachable through /proc/1", "root", `echo x >> /proc/1/fd/1; echo rc=$?; cat /proc/1/environ; echo rc=$?; readlink /proc/1/exe; echo rc=$?; head -c1 /proc/1/mem; echo rc=$?`, func(out string) bool {
			return !strings.Contains(out, "rc=0")
		}},
		{"no user namespaces as root", "root", `unshare -U true; echo rc=$?`, func(out string) bool { return !strings.Contains(out, "rc=0") }},
		{"no kernel settings", "root", `echo 1 > /proc/sys/vm/drop_caches; echo rc=$?`, func(out string) bool { return strings.Contains(out, "rc=1") || strings.Contains(out, "rc=2") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := s.sh(t, c.user, c.script)
			if !c.check(r.Output) {
				t.Fatalf("script %q as %s: exit %d, output:\n%s", c.script, c.user, r.Code, r.Output)
			}
		})
	}
}

func TestNormalExitOutcome(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "exit", runtime.Resources{})
	s.shutdown(t)
	s.waitShimGone(t)
	o := s.outcome(t)
	if o.Reason != runtime.ReasonExited || o.ExitCode != 0 || o.OOMKilled {
		t.Fatalf("outcome %+v", o)
	}
	if s.cgroup(t).Exists() {
		t.Fatal("cgroup left after the sandbox ended")
	}
}

func TestPidsLimit(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "pids", runtime.Resources{Pids: 40})
	if cg := s.cgroup(t); cg.V2() {
		// The init, which became the agent, is in the agent's child; a workload is in the
		// workloads' child, and its cgroup namespace, rooted at the sandbox's cgroup, shows
		// it there, and the sandbox's own tree (both children) at /sys/fs/cgroup.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", s.initOf(t).Pid))
		if err != nil || !strings.HasSuffix(strings.TrimSpace(string(b)), "/"+platform.V2AgentCgroup) {
			t.Errorf("the agent's cgroup: %q (%v), want the sandbox's %s", b, err, platform.V2AgentCgroup)
		}
		inside := s.sh(t, "root", `cat /proc/self/cgroup; ls /sys/fs/cgroup/agent/cgroup.procs /sys/fs/cgroup/workloads/pids.max`)
		want := "0::/" + platform.V2WorkloadsCgroup + "\n/sys/fs/cgroup/agent/cgroup.procs\n/sys/fs/cgroup/workloads/pids.max\n"
		if inside.Output != want {
			t.Errorf("inside, /proc/self/cgroup and the sandbox's cgroup tree: %q, want %q", inside.Output, want)
		}
	}
	r := s.sh(t, "user", `i=0; while [ $i -lt 200 ]; do sleep 30 >/dev/null 2>&1 & i=$((i+1)); done 2>&1 | tail -n 1; echo done`)
	cg := s.cgroup(t)
	// The workload forks in a child of its own, which refuses the forks past its 40, and the
	// agent's tasks are outside it, so that their allowance is never taken. On cgroup v1 the
	// child is shim.WorkloadCgroup of the pids cgroup, where the agent stays: the sandbox's
	// own pids.events counts its refusals. On v2 the sandbox's cgroup has two children,
	// platform.V2WorkloadsCgroup and platform.V2AgentCgroup, where the agent is (the
	// sandbox's own pids.events is hierarchical from Linux 6.13: the agent's child's counts
	// the agent's alone).
	events := func(sub string) string {
		for _, d := range cg.Dirs() {
			if b, err := os.ReadFile(filepath.Join(d, sub, "pids.events")); err == nil {
				return string(b)
			}
		}
		return ""
	}
	workloads, agentCgroup := shim.WorkloadCgroup, ""
	if cg.V2() {
		workloads, agentCgroup = platform.V2WorkloadsCgroup, platform.V2AgentCgroup
	}
	refused := events(workloads)
	if own := events(agentCgroup); !strings.Contains(own, "max 0") {
		t.Errorf("the agent's cgroup refused forks (pids.events %q): the workload took the agent's allowance", own)
	}
	if !strings.Contains(refused, "max ") || strings.Contains(refused, "max 0") {
		t.Fatalf("pids limit never hit: pids.events %q; output %q", refused, r.Output)
	}
	// The cgroup's limit is the sandbox's 40 plus the agent's allowance; the workload's sleeps
	// have at least their 40 of it.
	pids, err := cg.Pids()
	if err != nil || len(pids) > 40+1+shim.AgentPids {
		t.Fatalf("%d processes in the cgroup (%v), limit 40+%d", len(pids), err, shim.AgentPids)
	}
	// The workload's 40 (and, on v1, the forking thread's place) held the shell, its
	// subshell and tail, which have exited since, and the sleeps.
	if len(pids) < 1+40-3 {
		cur := func(sub string) string {
			for _, d := range cg.Dirs() {
				if b, err := os.ReadFile(filepath.Join(d, sub, "pids.current")); err == nil {
					return strings.TrimSpace(string(b))
				}
			}
			return ""
		}
		var cmds []string
		for _, p := range pids {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
			cmds = append(cmds, strings.ReplaceAll(string(b), "\x00", " "))
		}
		t.Fatalf("%d processes in the cgroup (pids.current %s, the workloads' %s): the workload did not get its 40 beside the agent: %q", len(pids), cur(""), cur(workloads), cmds)
	}
}

func TestMemoryLimitOOM(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "oom", runtime.Resources{MemoryMB: 64})
	// tail buffers a line without end in memory, so it grows until the limit stops it.
	r := s.sh(t, "user", `head -c 400000000 /dev/zero | tail -n 1 >/dev/null; echo rc=$?`)
	if strings.Contains(r.Output, "rc=0") {
		t.Fatalf("a 400 MB hog survived a 64 MB limit: %q", r.Output)
	}
	ctxs, cancels := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancels()
	if st, err := s.client.Stats(ctxs); err != nil {
		t.Fatalf("stats after OOM: %v", err)
	} else {
		t.Logf("stats after OOM: %+v", st)
	}
	// The sandbox lives on after the OOM kill of one of its processes.
	if r := s.sh(t, "root", `echo alive`); strings.TrimSpace(r.Output) != "alive" {
		t.Fatalf("sandbox after OOM: %+v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := rt.Kill(ctx, s.spec.Dir, s.id); err != nil {
		t.Fatal(err)
	}
	if o := s.outcome(t); !o.OOMKilled {
		t.Fatalf("outcome %+v does not report the OOM kill", o)
	}
}

func TestKillInit(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "kill", runtime.Resources{})
	init := s.initOf(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := rt.Kill(ctx, s.spec.Dir, s.id); err != nil {
		t.Fatal(err)
	}
	if s.id.Alive() || init.Alive() {
		t.Fatal("shim or init alive after Kill")
	}
	o := s.outcome(t)
	if o.Reason != runtime.ReasonSignaled || o.Signal != "SIGKILL" || o.ExitCode != -1 {
		t.Fatalf("outcome %+v, want killed by SIGKILL", o)
	}
	if s.cgroup(t).Exists() {
		t.Fatal("cgroup left after Kill")
	}
	// Killing again is not an error.
	if err := rt.Kill(ctx, s.spec.Dir, s.id); err != nil {
		t.Fatal(err)
	}
}

func TestShimKilledTakesInitAlong(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "orphan", runtime.Resources{})
	init := s.initOf(t)
	if err := platform.SignalVerified(s.id, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.waitShimGone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := waitGone(ctx, init); err != nil {
		t.Fatalf("the init outlived its shim: %v", err)
	}
	if err := rt.Cleanup(ctx, s.spec.ID, s.spec.Dir, s.id); err != nil {
		t.Fatal(err)
	}
	if s.cgroup(t).Exists() {
		t.Fatal("cgroup left after Cleanup")
	}
	if _, err := os.Stat(filepath.Join(s.spec.Dir, runtime.OutcomeName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a killed shim wrote an outcome report? %v", err)
	}
}

func TestCleanupRefusesLive(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "live", runtime.Resources{})
	if err := rt.Cleanup(context.Background(), s.spec.ID, s.spec.Dir, s.id); err == nil {
		t.Fatal("Cleanup of a live sandbox succeeded")
	}
	if r := s.sh(t, "root", "echo ok"); strings.TrimSpace(r.Output) != "ok" {
		t.Fatalf("sandbox harmed by a refused Cleanup: %+v", r)
	}
}

func TestSpecValidation(t *testing.T) {
	rt := newTestRuntime(t)
	t.Parallel()
	good := runtime.Spec{ID: "a", Dir: "/tmp/x", LaunchID: "l", Capability: []byte("c")}
	cases := []struct {
		name   string
		modify func(*runtime.Spec)
	}{
		{"bad id", func(s *runtime.Spec) { s.ID = "../x" }},
		{"relative dir", func(s *runtime.Spec) { s.Dir = "x" }},
		{"no capability", func(s *runtime.Spec) { s.Capability = nil }},
		{"lower with colon", func(s *runtime.Spec) { s.Lowers = []string{"/a:b"} }},
		{"unclean image dir", func(s *runtime.Spec) { s.ImageDir = "/a/../b" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := good
			c.modify(&s)
			if _, err := rt.Start(context.Background(), s); err == nil {
				t.Fatal("Start accepted a bad spec")
			}
		})
	}
}

// copyFile copies a host file into an image directory, following links.
func copyFile(tb testing.TB, src, dst string, perm os.FileMode) {
	tb.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		tb.Skipf("cannot build a test image: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(dst, b, perm); err != nil {
		tb.Fatal(err)
	}
}

func TestImageAndLayers(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	// A minimal image: dash and the C library, and a marker; a layer above it with another.
	img := filepath.Join(root, "images", "mini")
	copyFile(t, "/usr/bin/dash", filepath.Join(img, "bin/sh"), 0o755)
	copyFile(t, "/lib/x86_64-linux-gnu/libc.so.6", filepath.Join(img, "lib/x86_64-linux-gnu/libc.so.6"), 0o755)
	copyFile(t, "/lib64/ld-linux-x86-64.so.2", filepath.Join(img, "lib64/ld-linux-x86-64.so.2"), 0o755)
	if err := os.MkdirAll(filepath.Join(img, "root"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(img, "image-marker"), []byte("from the image\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(root, "layer")
	if err := os.MkdirAll(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer, "image-marker"), []byte("from the layer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sandboxSeq++
	id := fmt.Sprintf("img-%d-%d", os.Getpid(), sandboxSeq)
	dir := filepath.Join(root, "sandboxes", id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	spec := runtime.Spec{ID: id, Dir: dir, LaunchID: "l-" + id, Image: "mini", ImageDir: img,
		Lowers: []string{layer}, Capability: []byte("cap-" + id)}
	pid, err := rt.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	s := &sandbox{rt: rt, spec: spec, id: pid}
	t.Cleanup(func() { s.destroy(t) })
	if err := s.waitReady(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	r := s.sh(t, "root", `read l < /image-marker; echo "$l"; test -e /usr/bin; echo usr=$?; echo x > /new && echo wrote`)
	if !strings.Contains(r.Output, "from the layer") || !strings.Contains(r.Output, "usr=1") || !strings.Contains(r.Output, "wrote") {
		t.Fatalf("inside the image: %+v", r)
	}
	// Writes land in the sandbox's upper layer, never in the image or the layer.
	if _, err := os.Stat(filepath.Join(img, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sandbox wrote into its image: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, shim.EntryUpper, "new")); err != nil {
		t.Fatalf("the write is not in the upper layer: %v", err)
	}
}

func TestShimForwardsTerm(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "term", runtime.Resources{})
	if err := platform.SignalVerified(s.id, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.waitShimGone(t)
	// The agent shut the sandbox down and exited: a clean exit, recorded by the shim.
	if o := s.outcome(t); o.Reason != runtime.ReasonExited {
		t.Fatalf("outcome %+v after TERM to the shim, want a recorded exit", o)
	}
	if s.cgroup(t).Exists() {
		t.Fatal("cgroup left after a TERM to the shim")
	}
}

func TestTTY(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "tty", runtime.Resources{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := s.client.Exec(ctx, control.ExecRequest{Argv: []string{"/bin/sh", "-c", "tty; stty size"}, TTY: true, Rows: 30, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, p.Stderr) }()
	out, _ := io.ReadAll(p.Stdout)
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "/dev/pts/") || !strings.Contains(string(out), "30 100") {
		t.Fatalf("a tty exec saw %q, want a /dev/pts terminal of 30x100", out)
	}
}
