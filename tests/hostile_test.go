package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// The hostile-workload suite: each workload runs in a sandbox of its own while a second,
// well-behaved sandbox keeps answering exec and the server keeps answering /healthz; the
// hostile sandbox must be stopped and deleted cleanly afterwards. Subtests run one after
// another, so that each hostile workload has the machine to itself besides the calm sandbox.

// watchdog execs in the calm sandbox and asks /healthz, over and over, until stopped.
type watchdog struct {
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	rounds   int
	failures []string
	slowest  time.Duration
}

func startWatchdog(d *daemon, calm string) *watchdog {
	w := &watchdog{stop: make(chan struct{}), done: make(chan struct{})}
	httpc := d.checkedClient(&http.Client{Timeout: 60 * time.Second})
	go func() {
		defer close(w.done)
		for {
			begin := time.Now()
			var fail string
			status, body, err := chaosDo(httpc, d.URL, "POST", "/v1/sandboxes/"+calm+"/exec", map[string]any{"command": []string{"echo", "calm"}})
			if err != nil || status != 200 || !bytes.Contains(body, []byte(`"stdout":"calm\n"`)) {
				fail = fmt.Sprintf("exec in the calm sandbox: %d %s %v", status, body, err)
			} else if status, body, err := chaosDo(httpc, d.URL, "GET", "/healthz", nil); err != nil || status != 200 {
				fail = fmt.Sprintf("/healthz: %d %s %v", status, body, err)
			}
			took := time.Since(begin)
			w.mu.Lock()
			w.rounds++
			w.slowest = max(w.slowest, took)
			if fail != "" {
				w.failures = append(w.failures, fail)
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			default:
			}
		}
	}()
	return w
}

// check stops the watchdog and fails the test if the calm sandbox or the server failed to
// answer, or never answered at all.
func (w *watchdog) check(t *testing.T, what string) {
	t.Helper()
	close(w.stop)
	<-w.done
	for _, f := range w.failures {
		t.Errorf("while %s: %s", what, f)
	}
	if w.rounds == 0 {
		t.Errorf("while %s: the watchdog never completed a round", what)
	}
	t.Logf("while %s: the calm sandbox and /healthz answered %d rounds, the slowest in %s", what, w.rounds, w.slowest.Round(time.Millisecond))
}

// hostileSandbox creates and starts a sandbox with the given resources, and returns a
// function that stops (forcibly) and deletes it, failing the test if either fails, and
// checks that none of its runtime processes is left.
func hostileSandbox(t *testing.T, d *daemon, id string, resources map[string]any) func() {
	t.Helper()
	body := map[string]any{"id": id, "start": true}
	if resources != nil {
		body["resources"] = resources
	}
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", body), 201)
	return func() {
		t.Helper()
		if r := d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil); r.Status != 200 && r.Status != 409 {
			t.Errorf("stopping the hostile sandbox %s: %d %s", id, r.Status, r.Body)
		}
		if r := d.doJSON("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Errorf("deleting the hostile sandbox %s: %d %s", id, r.Status, r.Body)
		}
		for dir := range runtimeProcesses(t, d.Root) {
			if filepath.Base(dir) == id {
				t.Errorf("a runtime process of %s is left after its deletion", id)
			}
		}
		if cg, err := platform.OpenCgroup(d.cgroupName(id)); err == nil && cg.Exists() {
			t.Errorf("the cgroup of %s is left after its deletion", id)
		}
	}
}

// cgroupFile reads a file of the sandbox's cgroup from the host (the first of its
// directories that has it: on cgroup v1 each controller has its own).
func cgroupFile(t *testing.T, d *daemon, id, name string) string {
	t.Helper()
	cg, err := platform.OpenCgroup(d.cgroupName(id))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range cg.Dirs() {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

// workloadsLayout is where a sandbox's workloads run, on this host's cgroup version, relative
// to the sandbox's cgroup.
type workloadsLayout struct {
	// dir is the workloads' child cgroup.
	dir string
	// forkingThread is 1 where the agent's forking thread counts in the workloads' limit
	// (v1, where it moves there to fork), 0 where the workload is cloned straight in (v2).
	forkingThread int
	// agentEvents is the pids.events that counts the forks refused to the agent's own
	// tasks: on v1 the sandbox's pids cgroup (where the agent is; its events are its own),
	// on v2 the agent's child (the sandbox's own pids.events is hierarchical from Linux 6.13).
	agentEvents string
}

// workloadsCgroup is the layout of the workloads' cgroup on this host.
func workloadsCgroup(t *testing.T) workloadsLayout {
	t.Helper()
	v, err := platform.CgroupVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v == 2 {
		return workloadsLayout{dir: platform.V2WorkloadsCgroup, agentEvents: platform.V2AgentCgroup + "/pids.events"}
	}
	return workloadsLayout{dir: shim.WorkloadCgroup, forkingThread: 1, agentEvents: "pids.events"}
}

// keyed reads the number after key in a "key value" cgroup file.
func keyed(content, key string) int64 {
	for _, line := range strings.Split(content, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return -1
}

// rssKiB reads a process's resident set size.
func rssKiB(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

func TestHostileWorkloads(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withArgs("--log-level", "info"))
	prefix := fmt.Sprintf("hostile%04x", uint16(time.Now().UnixNano()))
	calm := prefix + "-calm"
	d.create(calm, true)
	// Subtests run one after another: each hostile workload has the machine to itself
	// besides the calm sandbox.

	t.Run("fills its disk", func(t *testing.T) {
		requireLoopDevices(t)
		d := d.in(t)
		id := prefix + "-disk"
		const diskMiB, fillMiB = 64, 512
		defer hostileSandbox(t, d, id, map[string]any{"disk_mb": diskMiB})()
		w := startWatchdog(d, calm)
		got := d.exec(id, map[string]any{
			"command":    []string{"sh", "-c", fmt.Sprintf("dd if=/dev/zero of=/home/user/fill bs=1M count=%d 2>&1; stat -c %%s /home/user/fill", fillMiB)},
			"timeout_ms": 120000,
		})
		w.check(t, "the sandbox filled its disk")
		if !strings.Contains(got.Stdout, "No space left") {
			t.Fatalf("a sandbox with a disk of %d MiB wrote %d MiB without running out of space: %+v", diskMiB, fillMiB, got)
		}
		lines := strings.Split(strings.TrimSpace(got.Stdout), "\n")
		if size, err := strconv.ParseInt(lines[len(lines)-1], 10, 64); err != nil || size > diskMiB<<20 {
			t.Fatalf("the filler holds %q bytes, more than the %d MiB disk", lines[len(lines)-1], diskMiB)
		}
		// The sandbox itself still works, and has its space back.
		if got := d.exec(id, map[string]any{"command": []string{"sh", "-c", "rm /home/user/fill && echo x > /home/user/after && cat /home/user/after"}}); got.Stdout != "x\n" {
			t.Fatalf("writing after the filler is gone: %+v", got)
		}
	})

	t.Run("forks without end", func(t *testing.T) {
		d := d.in(t)
		id := prefix + "-forks"
		defer hostileSandbox(t, d, id, map[string]any{"pids": 128})()
		// The cgroup allows the workload's 128 and the agent's allowance.
		limit := 128 + shim.AgentPids
		if max := cgroupFile(t, d, id, "pids.max"); max != strconv.Itoa(limit) {
			t.Fatalf("pids.max of the sandbox is %q, want %d", max, limit)
		}
		w := startWatchdog(d, calm)
		res := make(chan response, 1)
		go func() {
			// Not d.doJSON: a failure here must not end the test from another goroutine.
			status, body, err := chaosDo(d.checkedClient(&http.Client{Timeout: 2 * time.Minute}), d.URL, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
				"command":    []string{"sh", "-c", "b() { b | b & }; b; wait"},
				"timeout_ms": 4000,
			})
			if err != nil {
				body = []byte(err.Error())
			}
			res <- response{Status: status, Body: body}
		}()
		// The workload forks in a cgroup of its own, where the refusals are counted: the
		// agent's allowance stays its own. On cgroup v1 that is the child "workload" of the
		// pids cgroup, limited to the workload's 128 and the agent's forking thread, which
		// the agent's own tasks are outside; on v2 the child "workloads", limited to 128,
		// beside "agent", where the agent is (platform.Cgroup.SplitV2).
		w1 := workloadsCgroup(t)
		if max := cgroupFile(t, d, id, w1.dir+"/pids.max"); max != strconv.Itoa(128+w1.forkingThread) {
			t.Errorf("the workloads' cgroup has pids.max %q, want %d", max, 128+w1.forkingThread)
		}
		// The pids controller counts every fork it refused: the bomb hit the limit.
		waitFor(t, 30*time.Second, "a fork refused at the pids limit", func() bool {
			return keyed(cgroupFile(t, d, id, w1.dir+"/pids.events"), "max") > 0
		})
		cur, _ := strconv.Atoi(cgroupFile(t, d, id, "pids.current"))
		if cur > limit {
			t.Errorf("pids.current %d exceeds the limit %d", cur, limit)
		}
		if n := keyed(cgroupFile(t, d, id, w1.agentEvents), "max"); n > 0 {
			t.Errorf("the agent's cgroup (%s) refused %d forks: the workload took the agent's allowance", w1.agentEvents, n)
		}
		r := <-res
		w.check(t, "the sandbox forked without end")
		if r.Status != 200 {
			t.Fatalf("the fork bomb's exec answered %d: %s", r.Status, r.Body)
		}
		// The bomb either runs until its timeout or collapses on its failed forks; either way
		// its exec answers.
		got := decode[execJSON](t, r, 200)
		t.Logf("the fork bomb's exec: exit %d, timed out %v, %d bytes of stderr", got.ExitCode, got.TimedOut, len(got.Stderr))
	})

	t.Run("allocates without end", func(t *testing.T) {
		d := d.in(t)
		id := prefix + "-mem"
		defer hostileSandbox(t, d, id, map[string]any{"memory_mb": 128})()
		w := startWatchdog(d, calm)
		got := d.exec(id, map[string]any{
			"command":    []string{"perl", "-e", `my @a; push @a, "x" x (1<<20) while 1`},
			"timeout_ms": 60000,
		})
		w.check(t, "the sandbox allocated without end")
		if got.TimedOut || got.Signal == nil || *got.Signal != "SIGKILL" {
			t.Fatalf("the allocator was not killed: %+v", got)
		}
		if n := keyed(cgroupFile(t, d, id, "memory.oom_control")+"\n"+cgroupFile(t, d, id, "memory.events"), "oom_kill"); n < 1 {
			t.Errorf("the sandbox's cgroup counts %d OOM kills, want at least 1", n)
		}
		sb := decode[sandboxJSON](t, d.do("GET", "/v1/sandboxes/"+id, nil, nil), 200)
		switch {
		case sb.State == "running":
			// The OOM killer took the allocator, not the agent: the sandbox goes on.
			if got := d.exec(id, map[string]any{"command": []string{"true"}}); got.ExitCode != 0 {
				t.Fatalf("exec after the OOM kill: %+v", got)
			}
		case sb.LastExit == nil || sb.LastExit.Reason != "oom":
			t.Fatalf("the sandbox ended, but not as oom: %+v", sb)
		}
	})

	t.Run("floods stdout", func(t *testing.T) {
		d := d.in(t)
		id := prefix + "-flood"
		defer hostileSandbox(t, d, id, nil)()
		pid := d.cmd.Process.Pid
		before := rssKiB(t, pid)
		w := startWatchdog(d, calm)
		got := d.exec(id, map[string]any{"command": []string{"head", "-c", "256M", "/dev/zero"}, "timeout_ms": 120000})
		if !got.StdoutTruncated || len(got.Stdout) != 1<<20 || got.ExitCode != 0 {
			t.Fatalf("a 256 MiB flood through buffered exec: exit %d, %d bytes kept, truncated %v", got.ExitCode, len(got.Stdout), got.StdoutTruncated)
		}
		if grew := rssKiB(t, pid) - before; grew > 64<<10 {
			t.Errorf("bothyd's RSS grew by %d KiB over a 256 MiB flood", grew)
		}

		// A websocket client that does not read holds the workload back: what the workload
		// wrote can run ahead of what the client read only by the buffers in between.
		const chunks, chunk = 256, 256 << 10 // 64 MiB
		q := url.Values{"command": {"sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do head -c %d /dev/zero; i=$((i+1)); echo $i > /tmp/p; mv /tmp/p /tmp/progress; done", chunks, chunk)}, "timeout_ms": {"120000"}}
		s, resp, err := d.dialStream(id, q)
		if err != nil {
			t.Fatalf("dial: %v %v", err, resp)
		}
		defer s.conn.Close()
		produced := func() int64 {
			r := d.do("GET", "/v1/sandboxes/"+id+"/files?path=/tmp/progress", nil, nil)
			n, _ := strconv.ParseInt(strings.TrimSpace(string(r.Body)), 10, 64)
			return n * chunk
		}
		waitFor(t, 20*time.Second, "the flood to start", func() bool { return produced() > 0 })
		const slack = 16 << 20 // pipes, the control session's window, websocket and TCP buffers
		var read, lead int64
		for i := 0; ; i++ {
			if i%64 == 0 {
				// A slow client: it pauses now and then; the workload must wait for it.
				time.Sleep(50 * time.Millisecond)
				p := produced()
				lead = max(lead, p-read)
				if p-read > slack {
					t.Fatalf("the workload wrote %d MiB while the client had read %d MiB: no back-pressure", p>>20, read>>20)
				}
			}
			_ = s.conn.SetReadDeadline(time.Now().Add(60 * time.Second))
			kind, data, err := s.conn.ReadMessage()
			if err != nil {
				if !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
					t.Fatalf("the stream ended with %v after %d bytes", err, read)
				}
				break
			}
			if kind == websocket.BinaryMessage && len(data) > 0 && data[0] == 1 {
				read += int64(len(data) - 1)
			}
		}
		w.check(t, "the sandbox flooded stdout")
		t.Logf("the workload ran at most %d KiB ahead of the slow websocket client", lead>>10)
		if read != chunks*chunk {
			t.Fatalf("the slow client read %d bytes, want %d", read, chunks*chunk)
		}
		if grew := rssKiB(t, pid) - before; grew > 64<<10 {
			t.Errorf("bothyd's RSS grew by %d KiB over the floods", grew)
		}
	})

	t.Run("holds files open", func(t *testing.T) {
		d := d.in(t)
		id := prefix + "-files"
		defer hostileSandbox(t, d, id, nil)()
		limit := strings.TrimSpace(d.exec(id, map[string]any{"command": []string{"sh", "-c", "ulimit -n"}}).Stdout)
		w := startWatchdog(d, calm)
		res := make(chan error, 1)
		go func() {
			// Not d.doJSON: a failure here must not end the test from another goroutine.
			_, _, err := chaosDo(d.checkedClient(&http.Client{Timeout: 5 * time.Minute}), d.URL, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
				// Open as many files as the limit allows, unlink them, and hold them.
				"command":    []string{"perl", "-e", `my @h; for my $i (1..20000) { open(my $f, ">", "/tmp/f$i") or last; print $f "x"; unlink "/tmp/f$i"; push @h, $f } close(pop @h); open(my $m, ">", "/tmp/holding") or die; print $m scalar(@h); close $m; sleep 600`},
				"timeout_ms": 600000,
			})
			res <- err
		}()
		waitFor(t, 60*time.Second, "the files to be held", func() bool {
			return d.do("GET", "/v1/sandboxes/"+id+"/files?path=/tmp/holding", nil, nil).Status == 200
		})
		held := string(d.do("GET", "/v1/sandboxes/"+id+"/files?path=/tmp/holding", nil, nil).Body)
		w.check(t, "the sandbox held files open")
		t.Logf("the workload holds %s files open (of 20000 tried; its descriptor limit is %s)", held, limit)
		// Stopping ends the holder; its exec ends with the sandbox (answering what it may:
		// see TestExecRacingStopIsNotInternal), and deletion removes the unlinked files' layer.
		if r := d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil); r.Status != 200 {
			t.Fatalf("force-stopping the holder: %d %s", r.Status, r.Body)
		}
		select {
		case <-res:
		case <-time.After(60 * time.Second):
			t.Fatalf("the holder's exec did not end within 60s of its sandbox's stop")
		}
	})

	t.Run("kills its own agent", func(t *testing.T) {
		d := d.in(t)
		id := prefix + "-killer"
		defer hostileSandbox(t, d, id, nil)()
		w := startWatchdog(d, calm)
		// As root inside, every signal a hostile root can send at the agent (PID 1 of the
		// pid namespace), then at every other process. The kernel drops signals to a
		// namespace's init that it has no handler for (KILL, STOP among them); the agent's own
		// handlers decide the rest. Each either leaves the agent serving or ends the sandbox
		// cleanly, with its last exit recorded, and then it starts again.
		for _, sig := range []string{"KILL", "STOP", "SEGV", "BUS", "ABRT", "QUIT", "HUP", "USR1", "PIPE", "INT", "TERM"} {
			r := d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
				"user": "root", "command": []string{"sh", "-c", "kill -" + sig + " 1; kill -CONT 1; echo sent"}, "timeout_ms": 10000,
			})
			if r.Status >= 500 && r.Status != 504 {
				t.Logf("SIG%s: the attacker's exec answered %d (its sandbox ended under it)", sig, r.Status)
			}
			// Settled: the agent answers an exec, or the sandbox reads as stopped. (A dying
			// agent's sandbox may read as running for a moment.)
			var sb sandboxJSON
			serving := false
			waitFor(t, 20*time.Second, "the sandbox to settle after SIG"+sig, func() bool {
				r := d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": []string{"echo", "still here"}, "timeout_ms": 10000})
				if r.Status == 200 && strings.Contains(string(r.Body), `"stdout":"still here\n"`) {
					serving = true
					return true
				}
				sb = decode[sandboxJSON](t, d.do("GET", "/v1/sandboxes/"+id, nil, nil), 200)
				return sb.State == "stopped"
			})
			if serving {
				continue
			}
			reason, code := "", -1
			if sb.LastExit != nil {
				reason = sb.LastExit.Reason
				if sb.LastExit.Code != nil {
					code = *sb.LastExit.Code
				}
			}
			t.Logf("SIG%s from a root workload ends the sandbox: last_exit %s, code %d", sig, reason, code)
			// A sandbox whose runtime process is still finishing up reads as stopped while a
			// start still answers already-running (reported); wait for the start to be taken.
			waitFor(t, 20*time.Second, "a start after SIG"+sig, func() bool {
				r := d.doJSON("POST", "/v1/sandboxes/"+id+"/start", nil)
				if r.Status != 200 && !(r.Status == 409 && strings.Contains(string(r.Body), "already-running")) {
					t.Fatalf("starting again after SIG%s: %d %s", sig, r.Status, r.Body)
				}
				return r.Status == 200
			})
		}
		got := d.exec(id, map[string]any{
			"user": "root", "command": []string{"sh", "-c", "sleep 600 & kill -9 -1; echo survived"}, "timeout_ms": 30000,
		})
		if got.Stdout != "survived\n" {
			t.Errorf("kill -9 -1: %+v", got)
		}
		if got := d.exec(id, map[string]any{"command": []string{"echo", "still here"}}); got.Stdout != "still here\n" {
			t.Fatalf("exec after kill -9 -1: %+v", got)
		}
		w.check(t, "the sandbox attacked its agent")
	})

	t.Run("attacks its agent as root", func(t *testing.T) {
		d := d.in(t)
		id := prefix + "-agent"
		defer hostileSandbox(t, d, id, nil)()
		w := startWatchdog(d, calm)
		// Every signal root can send PID 1 but TERM and INT (shutdown) leaves the agent
		// serving: without the agent's handlers QUIT and ABRT dump its stacks and end the
		// sandbox, SEGV and the like sent with kill crash it, HUP ends it. 32 to 34 have no
		// handler, so the kernel drops them for a namespace's init.
		for _, sig := range []string{"QUIT", "SEGV", "ABRT", "HUP", "USR1", "USR2", "BUS", "FPE", "ILL", "TRAP", "SYS", "ALRM", "TSTP", "TTIN", "TTOU", "PIPE", "WINCH", "CONT", "32", "33", "34", "40", "64"} {
			if got := d.exec(id, map[string]any{"user": "root", "command": []string{"sh", "-c", "kill -" + sig + " 1 && echo sent"}, "timeout_ms": 10000}); got.Stdout != "sent\n" {
				t.Fatalf("kill -%s 1 as root: %+v", sig, got)
			}
			r := d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": []string{"echo", "still here"}, "timeout_ms": 10000})
			if r.Status != 200 || !strings.Contains(string(r.Body), `"stdout":"still here\n"`) {
				t.Fatalf("after kill -%s 1 the agent does not serve: %d %s", sig, r.Status, r.Body)
			}
		}

		// What a workload makes is not world-writable: root's directory cannot be taken
		// over by the user.
		if got := d.exec(id, map[string]any{"user": "root", "command": []string{"sh", "-c", "mkdir /opt/made && : > /opt/made/f && stat -c %a /opt/made /opt/made/f && umask"}}); got.Stdout != "755\n644\n0022\n" {
			t.Fatalf("modes of what root made, and its umask: %+v", got)
		}
		if got := d.exec(id, map[string]any{"command": []string{"sh", "-c", "mkdir mine && : > mine/f && stat -c %a mine mine/f"}}); got.Stdout != "755\n644\n" {
			t.Fatalf("modes of what the user made: %+v", got)
		}

		// Listing refuses what reading refuses: the agent's own descriptors.
		for _, p := range []string{"/proc/self/fd", "/proc/1/fd", "/proc/self"} {
			if r := d.do("GET", "/v1/sandboxes/"+id+"/files/list?path="+url.QueryEscape(p), nil, nil); r.Status == 200 || r.Status >= 500 {
				t.Errorf("listing %s: %d %s", p, r.Status, r.Body)
			}
		}

		// A huge directory's listing costs bothyd no more than the listing's cap.
		if got := d.exec(id, map[string]any{"command": []string{"perl", "-e", `mkdir "/tmp/big" or die; for my $i (1..120000) { open(my $f, ">", "/tmp/big/entry-$i") or die; close $f } print "made\n"`}, "timeout_ms": 300000}); got.Stdout != "made\n" {
			t.Fatalf("making 120 000 files: %+v", got)
		}
		pid := d.cmd.Process.Pid
		before := rssKiB(t, pid)
		for range 3 {
			list := decode[struct {
				Items []json.RawMessage `json:"items"`
			}](t, d.do("GET", "/v1/sandboxes/"+id+"/files/list?path=/tmp/big", nil, nil), 200)
			if len(list.Items) != 10000 {
				t.Fatalf("a listing of 120 000 entries answered %d items, want the cap of 10000", len(list.Items))
			}
		}
		if grew := rssKiB(t, pid) - before; grew > 64<<10 {
			t.Errorf("bothyd's RSS grew by %d KiB over three listings of 120 000 entries", grew)
		}
		w.check(t, "the sandbox attacked its agent as root")
	})

	t.Run("makes a tree 22 000 deep", func(t *testing.T) {
		d := d.in(t)
		id := prefix + "-deep"
		// The deletion at the end removes the sandbox's layer with the deep tree in it: it
		// must answer 204, not 500 "too many open files".
		defer hostileSandbox(t, d, id, nil)()
		w := startWatchdog(d, calm)
		deep := map[string]any{"command": []string{"perl", "-e", `for (1..22000) { mkdir "d" or die "mkdir: $!"; chdir "d" or die "chdir: $!" } print "made\n"`}, "timeout_ms": 300000}
		if got := d.exec(id, deep); got.Stdout != "made\n" {
			t.Fatalf("making the deep tree: %+v", got)
		}
		// The files API removes it.
		if r := d.do("DELETE", "/v1/sandboxes/"+id+"/files?path=/home/user/d&recursive=true", nil, nil); r.Status != 204 {
			t.Fatalf("removing a tree 22 000 deep through the files API: %d %.300s", r.Status, r.Body)
		}
		if got := d.exec(id, map[string]any{"command": []string{"sh", "-c", "test -e /home/user/d || echo gone"}}); got.Stdout != "gone\n" {
			t.Fatalf("after its removal the deep tree is still there: %+v", got)
		}
		// Made again, it goes with the sandbox.
		if got := d.exec(id, deep); got.Stdout != "made\n" {
			t.Fatalf("making the deep tree again: %+v", got)
		}
		w.check(t, "the sandbox made a tree 22 000 deep")
	})

	// The server answered throughout, and the state root is consistent.
	mustCheckClean(t, d.Root, "after the hostile workloads")
}
