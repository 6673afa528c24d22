package tests

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sleepyJSON is what the sleep tests read of a sandbox.
type sleepyJSON struct {
	State  string `json:"state"`
	Asleep *bool  `json:"asleep"`
}

// createSleepy creates and starts sandbox id with an idle timeout of idleS seconds.
func (d *daemon) createSleepy(id string, idleS int) {
	d.t.Helper()
	body := map[string]any{"id": id, "start": true, "sleep": map[string]any{"idle_timeout_seconds": idleS}}
	decode[sandboxJSON](d.t, d.doJSON("POST", "/v1/sandboxes", body), 201)
	d.t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
	})
}

func (d *daemon) sleepy(id string) sleepyJSON {
	d.t.Helper()
	return decode[sleepyJSON](d.t, d.do("GET", "/v1/sandboxes/"+id, nil, nil), 200)
}

// waitAsleep waits until sandbox id is paused for idleness.
func (d *daemon) waitAsleep(id string) {
	d.t.Helper()
	start := time.Now()
	waitFor(d.t, 60*time.Second, id+" to fall asleep", func() bool {
		s := d.sleepy(id)
		return s.State == "paused" && s.Asleep != nil && *s.Asleep
	})
	d.t.Logf("%s fell asleep after %v", id, time.Since(start).Round(time.Millisecond))
}

// browserGet is a GET as a browser sends it, without the API's token (a link needs none).
func (d *daemon) browserGet(path string) response {
	d.t.Helper()
	req, err := http.NewRequest("GET", d.URL+path, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set("User-Agent", "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0")
	req.Header.Set("Accept", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
	req.Header.Set("Accept-Language", "en-GB,en;q=0.5")
	req.Header.Set("Sec-Fetch-Mode", "navigate")
	req.Header.Set("Sec-Fetch-Dest", "document")
	resp, err := d.checkedClient(nil).Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// TestSleepAndWake: a sandbox with a short idle timeout falls asleep (paused, asleep, the
// event sandbox.asleep) while the server in it waits; a browser's GET of a port link wakes it
// (sandbox.awake) and gets the server's answer; asleep again, an exec wakes it; asleep again
// and with bothyd killed and restarted, it is still asleep, a port request wakes it, and it
// falls asleep again under the restarted server, where an explicit resume is its wake too. A
// sandbox whose work keeps a CPU busy does not fall asleep meanwhile.
func TestSleepAndWake(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	ev := d.subscribe("", false)

	// Work inside keeps a sandbox awake (its policy does not ignore work).
	d.createSleepy("busy", 2)
	if got := d.exec("busy", map[string]any{"command": []string{"sh", "-c", "setsid timeout 300 sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &"}}); got.ExitCode != 0 {
		t.Fatalf("starting the burner: %+v", got)
	}

	// The CLI's create sets the policy the API's does.
	d.ctlOK("", "create", "cli", "--idle-timeout", "1h", "--no-wake")
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/cli", nil) })
	type policyJSON struct {
		Sleep *struct {
			IdleTimeoutSeconds int  `json:"idle_timeout_seconds"`
			AutoResume         bool `json:"auto_resume"`
		} `json:"sleep"`
	}
	cli := decode[policyJSON](t, d.do("GET", "/v1/sandboxes/cli", nil, nil), 200)
	if cli.Sleep == nil || cli.Sleep.IdleTimeoutSeconds != 3600 || cli.Sleep.AutoResume {
		t.Errorf("bothy create --idle-timeout 1h --no-wake made the policy %+v", cli.Sleep)
	}

	d.createSleepy("nap", 2)
	d.portService("nap")
	link := decode[linkJSON](t, d.doJSON("POST", "/v1/sandboxes/nap/ports/8000/links", map[string]any{"ttl_s": 600}), 201)

	d.waitAsleep("nap")
	ev.nextOf("sandbox.asleep")

	r := d.browserGet(link.Path + "woken?by=link")
	var e echoed
	if err := json.Unmarshal(r.Body, &e); r.Status != 200 || err != nil || e.Path != "/woken?by=link" {
		t.Fatalf("a browser's GET of the link to the sleeping sandbox: %d %s", r.Status, r.Body)
	}
	if s := d.sleepy("nap"); s.State != "running" || (s.Asleep != nil && *s.Asleep) {
		t.Fatalf("after the link's request the sandbox is %+v, want running and awake", s)
	}
	if got := ev.nextOf("sandbox.awake"); got.Event.Sandbox == nil || *got.Event.Sandbox != "nap" {
		t.Fatalf("the wake's event: %+v", got)
	}

	d.waitAsleep("nap")
	if got := d.exec("nap", map[string]any{"command": []string{"echo", "awake"}}); got.ExitCode != 0 || strings.TrimSpace(got.Stdout) != "awake" {
		t.Fatalf("an exec in the sleeping sandbox: %+v", got)
	}

	d.waitAsleep("nap")
	d.Restart(true)
	if s := d.sleepy("nap"); s.State != "paused" || s.Asleep == nil || !*s.Asleep {
		t.Fatalf("after bothyd was killed and restarted the sleeping sandbox is %+v, want paused and asleep", s)
	}
	r = d.do("GET", "/v1/sandboxes/nap/ports/8000/after-restart", nil, nil)
	if err := json.Unmarshal(r.Body, &e); r.Status != 200 || err != nil || e.Path != "/after-restart" {
		t.Fatalf("a port request to the sleeping sandbox after the restart: %d %s", r.Status, r.Body)
	}
	// The restarted server knows its policy: it falls asleep again.
	d.waitAsleep("nap")
	// An explicit resume of a sleeper (E2B's connect is one) is its wake too.
	ev = d.subscribe("", false)
	d.mustStatus(200, "POST", "/v1/sandboxes/nap/resume", nil)
	if got := ev.nextOf("sandbox.awake"); got.Event.Sandbox == nil || *got.Event.Sandbox != "nap" {
		t.Fatalf("the explicit resume's wake event: %+v", got)
	}

	if s := d.sleepy("busy"); s.State != "running" {
		t.Errorf("the sandbox whose work kept a CPU busy is %+v, want running", s)
	}
}

// BenchmarkWakeLatency times a port request to a paused sandbox whose policy wakes it: from
// the request to the first byte of the service's answer, through the port proxy (the wake,
// a resume, included), against the same request to the sandbox awake and a bare bwrap spawn,
// interleaved in one loop so that the ratio is measured under one load of the machine.
func BenchmarkWakeLatency(b *testing.B) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed (scripts/setup installs bubblewrap); the ratio needs it")
	}
	d := benchDaemon(b)
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "wake", "start": true,
		"sleep": map[string]any{"idle_timeout_seconds": 3600}})
	b.Cleanup(func() { d.dispose("wake") })
	d.portService("wake")
	firstByte := func(path string) time.Duration { return d.firstByte(b, path) }
	var wake, awake, base latencies
	for b.Loop() {
		awake = append(awake, firstByte("/v1/sandboxes/wake/ports/8000/awake"))
		d.mustStatus(200, "POST", "/v1/sandboxes/wake/pause", nil)
		wake = append(wake, firstByte("/v1/sandboxes/wake/ports/8000/woken"))
		t0 := time.Now()
		if out, err := exec.Command(bwrap, bwrapArgs...).CombinedOutput(); err != nil {
			b.Fatalf("bwrap: %v: %s", err, out)
		}
		base = append(base, time.Since(t0))
	}
	wake.report(b, "wake-")
	awake.report(b, "awake-")
	b.ReportMetric(base.median()*1000, "bwrap-median-ms")
	b.ReportMetric(wake.median()/base.median(), "wake/bwrap")
}

// TestMicroVMSleepsReleased: a microVM with a sleep policy sleeps with its memory released
// (QEMU ended, its state saved, the shim alone left), and an exec wakes it: answered at once
// if the restore is quick, else 503 sandbox-waking with Retry-After until it is done.
func TestMicroVMSleepsReleased(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	newestCloudKernel(t)
	d := startVMDaemon(t, vm)
	const id = "vmnap"
	d.createVM(map[string]any{"id": id, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256},
		"sleep": map[string]any{"idle_timeout_seconds": 3}})
	waitFor(t, vmDeadline, "the microVM to fall asleep", func() bool {
		s := d.sleepy(id)
		return s.State == "paused" && s.Asleep != nil && *s.Asleep
	})
	dir := filepath.Join(d.Root, "sandboxes", id)
	// The sandbox reads paused once its record is written; the release (the state saved,
	// QEMU ended) follows.
	waitFor(t, vmDeadline, "the sleeping microVM's memory to be released and its QEMU to end", func() bool {
		if _, err := os.Stat(filepath.Join(dir, "memory", "memory.state")); err != nil {
			return false
		}
		procs, err := vm.Processes(d.Root)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range procs {
			if p.Dir == dir {
				n++
			}
		}
		return n == 1
	})
	d.wantOnlyShim(vm, dir)

	var woke execJSON
	waking := 0
	waitFor(t, vmDeadline, "an exec to wake the microVM", func() bool {
		r := d.vmDo("POST", "/v1/sandboxes/"+id+"/exec", jsonBody(t, map[string]any{"command": []string{"echo", "awake"}}))
		if r.Status == http.StatusServiceUnavailable {
			wantProblem(t, r, 503, "sandbox-waking")
			if r.Header.Get("Retry-After") == "" {
				t.Fatal("sandbox-waking without Retry-After")
			}
			waking++
			return false
		}
		woke = decode[execJSON](t, r, 200)
		return true
	})
	if strings.TrimSpace(woke.Stdout) != "awake" {
		t.Fatalf("the exec that woke the microVM: %+v", woke)
	}
	t.Logf("the wake answered sandbox-waking %d times first", waking)
	if _, err := os.Stat(filepath.Join(dir, "memory")); err == nil {
		t.Fatal("the released memory is still there after the wake")
	}
}

// BenchmarkWakeLatencyMicroVM is BenchmarkWakeLatency for a microVM, whose sleep releases its
// memory: each iteration pauses it as a sleep does (memory released, QEMU ended) and times a
// GET through the port proxy to busybox httpd in the guest, from the request to the first
// byte (the restore of the VM included), beside the same GET awake, a pause that keeps the
// memory, and a bare bwrap spawn.
func BenchmarkWakeLatencyMicroVM(b *testing.B) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed (scripts/setup installs bubblewrap); the ratio needs it")
	}
	if _, err := os.Stat("/usr/bin/busybox"); err != nil {
		b.Skip("the guest's web server is the host's /usr/bin/busybox, which is missing")
	}
	requireRoot(b)
	vm := requireMicroVM(b)
	d := startVMDaemon(b, vm, withArgs("--log-level", "info"))
	b.Logf("microvm accelerator: %s", microvmStatus(b, d).Accelerator)
	const id = "vmwake"
	d.createVM(map[string]any{"id": id, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256},
		"sleep": map[string]any{"idle_timeout_seconds": 3600}})
	d.vmExec(id, "sh", "-c", "mkdir -p /tmp/www && echo ok > /tmp/www/index.html && setsid /usr/bin/busybox httpd -p 127.0.0.1:8000 -h /tmp/www </dev/null >/dev/null 2>&1 &")
	waitFor(b, vmDeadline, "busybox httpd in the microVM to answer through the proxy", func() bool {
		return d.do("GET", "/v1/sandboxes/"+id+"/ports/8000/", nil, nil).Status == 200
	})
	firstByte := func() time.Duration { return d.firstByte(b, "/v1/sandboxes/"+id+"/ports/8000/") }
	var released, kept, awake, base latencies
	for b.Loop() {
		awake = append(awake, firstByte())
		d.mustStatus(200, "POST", "/v1/sandboxes/"+id+"/pause", map[string]any{})
		kept = append(kept, firstByte())
		d.mustStatus(200, "POST", "/v1/sandboxes/"+id+"/pause?timeout=600000", map[string]any{"memory": "release"})
		released = append(released, firstByte())
		t0 := time.Now()
		if out, err := exec.Command(bwrap, bwrapArgs...).CombinedOutput(); err != nil {
			b.Fatalf("bwrap: %v: %s", err, out)
		}
		base = append(base, time.Since(t0))
	}
	released.report(b, "wake-released-")
	kept.report(b, "wake-kept-")
	awake.report(b, "awake-")
	b.ReportMetric(base.median()*1000, "bwrap-median-ms")
	b.ReportMetric(released.median()/base.median(), "wake-released/bwrap")
	b.ReportMetric(kept.median()/base.median(), "wake-kept/bwrap")
}

// firstByte GETs path and returns the time to the answer's first byte; the answer must be 200.
func (d *daemon) firstByte(b *testing.B, path string) time.Duration {
	b.Helper()
	var first time.Time
	req, err := http.NewRequest("GET", d.URL+path, nil)
	if err != nil {
		b.Fatal(err)
	}
	authorize(req)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotFirstResponseByte: func() { first = time.Now() },
	}))
	t0 := time.Now()
	resp, err := d.checkedClient(nil).Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	return first.Sub(t0)
}
