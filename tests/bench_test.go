package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// The end-to-end benchmarks drive the real binary through HTTP, like a client would; the
// baselines (bwrap, unshare) run in the same `go test -bench` invocation so that a figure can be
// read as a ratio measured under the same load of the machine. docs/performance.md has the
// commands and the figures.

// benchDaemon starts bothyd for a benchmark at the default log level (the harness logs at
// debug, which would time the logging too).
func benchDaemon(b *testing.B) *daemon {
	b.Helper()
	requireRoot(b)
	d := startDaemon(b, withArgs("--log-level", "info"))
	// The microvm runtime's probe boots a guest right after the start, seconds of both CPUs
	// under emulation: figures taken beside it measure the probe as much as the server.
	waitFor(b, vmDeadline, "the microvm runtime's probe", func() bool { return microvmStatus(b, d).State != "probing" })
	return d
}

// latencies collects one duration per iteration and reports its median and p90 in ms, which on
// a shared machine say more than the mean that ns/op is.
type latencies []time.Duration

// median is the median in seconds.
func (l latencies) median() float64 {
	s := slices.Clone(l)
	slices.Sort(s)
	return s[len(s)/2].Seconds()
}

func (l latencies) report(b *testing.B, prefix string) {
	if len(l) == 0 {
		return
	}
	s := slices.Clone(l)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2].Microseconds())/1000, prefix+"median-ms")
	b.ReportMetric(float64(s[len(s)*9/10].Microseconds())/1000, prefix+"p90-ms")
}

// mustStatus sends a JSON request and fails the benchmark unless the answer has status want.
func (d *daemon) mustStatus(want int, method, path string, body any) response {
	d.t.Helper()
	r := d.doJSON(method, path, body)
	if r.Status != want {
		d.t.Fatalf("%s %s: status %d, want %d: %s", method, path, r.Status, want, r.Body)
	}
	return r
}

// dispose stops a sandbox (forcibly) and deletes it.
func (d *daemon) dispose(id string) {
	d.t.Helper()
	d.mustStatus(200, "POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
	d.mustStatus(204, "DELETE", "/v1/sandboxes/"+id, nil)
}

// execTrue runs `true` buffered and fails unless it exits 0.
func (d *daemon) execTrue(id string) {
	d.t.Helper()
	got := decode[execJSON](d.t, d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": []string{"true"}}), 200)
	if got.ExitCode != 0 || got.Signal != nil {
		d.t.Fatalf("true: %+v", got)
	}
}

// BenchmarkLifecycle is one sandbox's whole life through HTTP: create, start, the first exec
// (of true), stop, delete. The aim (issue 5) is a median of at most 15 ms.
func BenchmarkLifecycle(b *testing.B) {
	d := benchDaemon(b)
	var lat latencies
	stepNames := []string{"create", "start", "exec", "stop", "delete"}
	steps := make([]latencies, len(stepNames))
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("life%d", i)
		t0 := time.Now()
		last := t0
		lap := func(step int) {
			now := time.Now()
			steps[step] = append(steps[step], now.Sub(last))
			last = now
		}
		d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": id})
		lap(0)
		d.mustStatus(200, "POST", "/v1/sandboxes/"+id+"/start", nil)
		lap(1)
		d.execTrue(id)
		lap(2)
		d.mustStatus(200, "POST", "/v1/sandboxes/"+id+"/stop", nil)
		lap(3)
		d.mustStatus(204, "DELETE", "/v1/sandboxes/"+id, nil)
		lap(4)
		lat = append(lat, time.Since(t0))
	}
	lat.report(b, "")
	// Each step's median says where a cycle spends its time.
	for i, name := range stepNames {
		b.ReportMetric(steps[i].median()*1000, name+"-median-ms")
	}
}

// BenchmarkLifecycleClients runs lifecycle cycles from 1 to 32 concurrent clients and reports
// cycles per second (aim, issue 5: at least 100/s on 2 cores). The b.N cycles of a
// sub-benchmark are shared out among its clients.
func BenchmarkLifecycleClients(b *testing.B) {
	d := benchDaemon(b)
	// Unchecked on purpose: a benchmark, whose figure must not include the contract check;
	// the same requests are checked by the e2e tests that make them through d.do.
	httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for _, clients := range []int{1, 2, 4, 8, 16, 32} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			var next atomic.Int64
			var mu sync.Mutex
			var firstErr error
			var wg sync.WaitGroup
			b.ResetTimer()
			t0 := time.Now()
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						n := next.Add(1)
						if n > int64(b.N) {
							return
						}
						if err := lifecycleCycle(httpc, d.URL, fmt.Sprintf("cc%d-%d-%d", clients, c, n)); err != nil {
							mu.Lock()
							firstErr = cmpOr(firstErr, err)
							mu.Unlock()
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(t0)
			b.StopTimer()
			if firstErr != nil {
				b.Fatal(firstErr)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
		})
	}
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// lifecycleCycle is BenchmarkLifecycle's cycle for a goroutine: it returns errors instead of
// failing the benchmark.
func lifecycleCycle(httpc *http.Client, base, id string) error {
	steps := []struct {
		method, path string
		body         any
		want         int
	}{
		{"POST", "/v1/sandboxes", map[string]any{"id": id}, 201},
		{"POST", "/v1/sandboxes/" + id + "/start", nil, 200},
		{"POST", "/v1/sandboxes/" + id + "/exec", map[string]any{"command": []string{"true"}}, 200},
		{"POST", "/v1/sandboxes/" + id + "/stop", nil, 200},
		{"DELETE", "/v1/sandboxes/" + id, nil, 204},
	}
	for _, s := range steps {
		var body io.Reader
		if s.body != nil {
			j, _ := json.Marshal(s.body)
			body = bytes.NewReader(j)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		req, err := http.NewRequestWithContext(ctx, s.method, base+s.path, body)
		if err != nil {
			cancel()
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		authorize(req)
		resp, err := httpc.Do(req)
		if err != nil {
			cancel()
			return err
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != s.want {
			return fmt.Errorf("%s %s: status %d, want %d: %s", s.method, s.path, resp.StatusCode, s.want, out)
		}
		if strings.HasSuffix(s.path, "/exec") && !bytes.Contains(out, []byte(`"exit_code":0`)) {
			return fmt.Errorf("true in %s did not exit 0: %s", id, out)
		}
	}
	return nil
}

// BenchmarkExecTrue is a buffered exec round trip of `true` through HTTP in a running sandbox
// (aim, issue 5: median at most 3 ms).
func BenchmarkExecTrue(b *testing.B) {
	d := benchDaemon(b)
	d.create("ex", true)
	d.execTrue("ex") // the first exec pays for page-ins; time the steady state
	var lat latencies
	for b.Loop() {
		t0 := time.Now()
		d.execTrue("ex")
		lat = append(lat, time.Since(t0))
	}
	lat.report(b, "")
}

// BenchmarkStreamThroughput reads a workload's stdout of 256 MiB over the exec websocket (aim,
// issue 5: at least 1 GB/s; the issue names 1 GiB, 256 MiB keeps an iteration short on this
// machine and the rate is the same figure).
func BenchmarkStreamThroughput(b *testing.B) {
	const size = 256 << 20
	d := benchDaemon(b)
	d.create("st", true)
	u := strings.Replace(d.URL, "http://", "ws://", 1) + "/v1/sandboxes/st/exec/stream?" +
		url.Values{"command": {"head", "-c", "256M", "/dev/zero"}}.Encode()
	dialer := websocket.Dialer{ReadBufferSize: 64 << 10}
	b.SetBytes(size)
	for b.Loop() {
		conn, _, err := dialer.Dial(u, http.Header{"Authorization": {"Bearer " + d.Token}})
		if err != nil {
			b.Fatal(err)
		}
		n, code, err := drainStream(conn)
		conn.Close()
		if err != nil || code != 0 || n != size {
			b.Fatalf("streamed %d bytes, exit %d, %v", n, code, err)
		}
	}
}

// drainStream reads an exec websocket to its normal close, counting stdout bytes without
// keeping them.
func drainStream(conn *websocket.Conn) (int64, int, error) {
	var n int64
	code := -1
	var first [1]byte
	for {
		kind, r, err := conn.NextReader()
		if err != nil {
			if websocket.IsCloseError(err, websocket.CloseNormalClosure) && code >= 0 {
				return n, code, nil
			}
			return n, code, err
		}
		switch kind {
		case websocket.BinaryMessage:
			if _, err := io.ReadFull(r, first[:]); err != nil {
				return n, code, err
			}
			m, err := io.Copy(io.Discard, r)
			if err != nil {
				return n, code, err
			}
			if first[0] == 1 {
				n += m
			}
		case websocket.TextMessage:
			var e wsExit
			if err := json.NewDecoder(r).Decode(&e); err != nil {
				return n, code, err
			}
			code = e.ExitCode
		}
	}
}

// prepareGeneration captures a template whose generation holds size bytes of data in the
// user's home.
func (d *daemon) prepareGeneration(name string, size int64) {
	d.t.Helper()
	src := name + "-src"
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": src, "start": true})
	got := decode[execJSON](d.t, d.doJSON("POST", "/v1/sandboxes/"+src+"/exec", map[string]any{
		"command": []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero > /home/user/blob && sync", size)}, "timeout_ms": 600000}), 200)
	if got.ExitCode != 0 {
		d.t.Fatalf("writing the generation's data: %+v", got)
	}
	d.mustStatus(200, "POST", "/v1/sandboxes/"+src+"/stop", nil)
	d.mustStatus(201, "POST", "/v1/templates", map[string]any{"name": name})
	g := decode[generationJSON](d.t, d.doJSON("POST", "/v1/templates/"+name+"/generations", map[string]any{"sandbox": src}), 201)
	if g.SizeBytes < size {
		d.t.Fatalf("generation %+v is smaller than the %d bytes written", g, size)
	}
}

// benchCreateStart times POST /v1/sandboxes with start=true, with body's other fields; stop
// and delete are outside the timer.
func benchCreateStart(b *testing.B, d *daemon, body map[string]any) {
	var lat latencies
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("cs%d", i)
		req := map[string]any{"id": id, "start": true}
		for k, v := range body {
			req[k] = v
		}
		t0 := time.Now()
		d.mustStatus(201, "POST", "/v1/sandboxes", req)
		lat = append(lat, time.Since(t0))
		b.StopTimer()
		d.dispose(id)
		b.StartTimer()
	}
	lat.report(b, "")
}

// BenchmarkCreateStart is a plain create+start: the baseline of BenchmarkCloneStart.
func BenchmarkCreateStart(b *testing.B) {
	d := benchDaemon(b)
	benchCreateStart(b, d, nil)
}

// BenchmarkCreateStartDisk is a create+start of a sandbox with a disk of its own (64 MiB): its
// first start makes the file system (mke2fs) and mounts it through a loop device. Compare with
// BenchmarkCreateStart in the same run.
func BenchmarkCreateStartDisk(b *testing.B) {
	d := benchDaemon(b)
	benchCreateStart(b, d, map[string]any{"resources": map[string]any{"disk_mb": 64}})
}

// BenchmarkCloneStart is a clone of a template (1 MiB generation) and its start in one call
// (aim, issue 6: at most 1.5× BenchmarkCreateStart).
func BenchmarkCloneStart(b *testing.B) {
	d := benchDaemon(b)
	d.prepareGeneration("tpl", 1<<20)
	benchCreateStart(b, d, map[string]any{"template": "tpl"})
}

// benchClone times a clone (create from the template, not started) and then its start,
// separately; ns/op is both.
func benchClone(b *testing.B, size int64) {
	d := benchDaemon(b)
	d.prepareGeneration("tpl", size)
	var clone, start latencies
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("cl%d", i)
		t0 := time.Now()
		d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": id, "template": "tpl"})
		t1 := time.Now()
		d.mustStatus(200, "POST", "/v1/sandboxes/"+id+"/start", nil)
		clone, start = append(clone, t1.Sub(t0)), append(start, time.Since(t1))
		b.StopTimer()
		d.dispose(id)
		b.StartTimer()
	}
	clone.report(b, "clone-")
	start.report(b, "start-")
}

// BenchmarkClone1MiB and BenchmarkClone1GiB clone generations of very different sizes (aim,
// issue 6: the same within noise, since a clone's root is an overlay over the generation).
func BenchmarkClone1MiB(b *testing.B) { benchClone(b, 1<<20) }
func BenchmarkClone1GiB(b *testing.B) { benchClone(b, 1<<30) }

// BenchmarkCloneSizes clones from a 1 MiB and a 1 GiB generation of one server in alternating
// order, so that both sizes see the same machine (page cache, writeback, other load): the
// separate benchmarks above cannot promise that on a shared machine. It reports each size's
// clone and start medians and the ratios large/small.
func BenchmarkCloneSizes(b *testing.B) {
	d := benchDaemon(b)
	sizes := []struct {
		name string
		size int64
	}{{"1MiB", 1 << 20}, {"1GiB", 1 << 30}}
	for _, s := range sizes {
		d.prepareGeneration("tpl-"+strings.ToLower(s.name), s.size)
	}
	clone := map[string]latencies{}
	start := map[string]latencies{}
	for i := 0; b.Loop(); i++ {
		for j := range sizes {
			s := sizes[(i+j)%len(sizes)]
			id := fmt.Sprintf("cz%d-%d", i, j)
			t0 := time.Now()
			d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": id, "template": "tpl-" + strings.ToLower(s.name)})
			t1 := time.Now()
			d.mustStatus(200, "POST", "/v1/sandboxes/"+id+"/start", nil)
			clone[s.name] = append(clone[s.name], t1.Sub(t0))
			start[s.name] = append(start[s.name], time.Since(t1))
			b.StopTimer()
			d.dispose(id)
			b.StartTimer()
		}
	}
	for _, s := range sizes {
		clone[s.name].report(b, "clone-"+s.name+"-")
		start[s.name].report(b, "start-"+s.name+"-")
	}
	b.ReportMetric(clone["1GiB"].median()/clone["1MiB"].median(), "clone-1GiB/1MiB")
	b.ReportMetric(start["1GiB"].median()/start["1MiB"].median(), "start-1GiB/1MiB")
}

// BenchmarkCapture captures a stopped sandbox whose writable layer holds 256 MiB, and in the
// same iteration copies that layer with `cp -a` (the baseline of issue 6), and reports both
// rates. A capture is durable (each file and directory synced before it is indexed); cp -a
// syncs nothing, so the baseline is the faster side of a fair comparison. 256 MiB rather than
// 1 GiB keeps an iteration at seconds on this machine; the rate is the figure.
func BenchmarkCapture(b *testing.B) {
	const size = 256 << 20
	d := benchDaemon(b)
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "cap", "start": true})
	got := decode[execJSON](b, d.doJSON("POST", "/v1/sandboxes/cap/exec", map[string]any{
		"command": []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /home/user/blob && sync", size)}, "timeout_ms": 600000}), 200)
	if got.ExitCode != 0 {
		b.Fatalf("writing the layer's data: %+v", got)
	}
	d.mustStatus(200, "POST", "/v1/sandboxes/cap/stop", nil)
	d.mustStatus(201, "POST", "/v1/templates", map[string]any{"name": "cap"})
	layer := d.Root + "/sandboxes/cap/upper"
	dst := b.TempDir()
	var capture, cp latencies
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		g := decode[generationJSON](b, d.doJSON("POST", "/v1/templates/cap/generations", map[string]any{"sandbox": "cap"}), 201)
		t1 := time.Now()
		target := fmt.Sprintf("%s/copy%d", dst, i)
		if out, err := exec.Command("cp", "-a", layer, target).CombinedOutput(); err != nil {
			b.Fatalf("cp -a: %v: %s", err, out)
		}
		capture, cp = append(capture, t1.Sub(t0)), append(cp, time.Since(t1))
		b.StopTimer()
		if g.SizeBytes < size {
			b.Fatalf("generation %+v is smaller than the %d bytes written", g, size)
		}
		d.mustStatus(204, "DELETE", "/v1/templates/cap/generations/"+g.ID, nil)
		if out, err := exec.Command("rm", "-rf", target).CombinedOutput(); err != nil {
			b.Fatalf("rm: %v: %s", err, out)
		}
		b.StartTimer()
	}
	b.ReportMetric(size/1e6/capture.median(), "capture-MB/s")
	b.ReportMetric(size/1e6/cp.median(), "cp-a-MB/s")
	b.ReportMetric(capture.median()/cp.median(), "capture/cp-a")
}

// BenchmarkReadmeCycle is issue 17's measurement: bothyd as the README starts it (`go run
// ./cmd/bothyd`, the binary alone, without bothyd-runtime beside it), a full cycle (create
// with start, exec `true`, forced stop, delete), and a bare bwrap spawn, interleaved in one loop
// so that every figure and ratio is measured under the same load of the machine. Two servers run
// side by side: default (what a user gets: the runtime bothyd builds from its source) and self
// (--runtime-binary self: what they got before, every sandbox process the server binary).
// disk=none runs both with --default-disk-mb 0 (bwrap has no disk of its own). Goals:
// create+start at most 1.5x bwrap, stop 2x, the cycle 3x.
func BenchmarkReadmeCycle(b *testing.B) {
	requireRoot(b)
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed (scripts/setup installs bubblewrap); the ratios need it")
	}
	bin := readmeBinary(b)
	for _, disk := range []struct {
		name string
		args []string
	}{{"disk=default", nil}, {"disk=none", []string{"--default-disk-mb", "0"}}} {
		b.Run(disk.name, func(b *testing.B) {
			servers := []struct {
				name string
				d    *daemon
			}{
				{"default", startDaemon(b, withBinary(bin), withArgs(append([]string{"--log-level", "info"}, disk.args...)...))},
				{"self", startDaemon(b, withBinary(bin), withArgs(append([]string{"--log-level", "info", "--runtime-binary", "self"}, disk.args...)...))},
			}
			stepNames := []string{"create+start", "exec", "stop", "delete", "cycle"}
			lat := make([][]latencies, len(servers))
			for i := range lat {
				lat[i] = make([]latencies, len(stepNames))
			}
			var base latencies
			for i := 0; b.Loop(); i++ {
				for s, srv := range servers {
					readmeCycle(srv.d, fmt.Sprintf("readme%d", i), lat[s])
				}
				t0 := time.Now()
				if out, err := exec.Command(bwrap, bwrapArgs...).CombinedOutput(); err != nil {
					b.Fatalf("bwrap: %v: %s", err, out)
				}
				base = append(base, time.Since(t0))
			}
			b.ReportMetric(base.median()*1000, "bwrap-median-ms")
			for s, srv := range servers {
				for j, name := range stepNames {
					b.ReportMetric(lat[s][j].median()*1000, srv.name+"-"+name+"-ms")
				}
				for _, j := range []int{0, 2, 4} {
					b.ReportMetric(lat[s][j].median()/base.median(), srv.name+"-"+stepNames[j]+"/bwrap")
				}
			}
		})
	}
}

// readmeCycle is one full cycle of sandbox id on d, each step's duration appended to steps
// (create+start, exec, stop, delete, then the whole cycle).
func readmeCycle(d *daemon, id string, steps []latencies) {
	t0 := time.Now()
	last := t0
	lap := func(step int) {
		now := time.Now()
		steps[step] = append(steps[step], now.Sub(last))
		last = now
	}
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": id, "start": true})
	lap(0)
	d.execTrue(id)
	lap(1)
	d.mustStatus(200, "POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
	lap(2)
	d.mustStatus(204, "DELETE", "/v1/sandboxes/"+id, nil)
	lap(3)
	steps[4] = append(steps[4], time.Since(t0))
}

// bwrapArgs is the bare bubblewrap sandbox the issues compare a start with.
var bwrapArgs = []string{"--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
	"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "true"}

// BenchmarkBaselineBwrap spawns `true` in a bare bubblewrap sandbox: the floor of a start.
func BenchmarkBaselineBwrap(b *testing.B) {
	requireRoot(b)
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed (scripts/setup installs bubblewrap); skipping the baseline")
	}
	benchSpawn(b, bwrap, bwrapArgs...)
}

// BenchmarkBaselineUnshare spawns `true` in new namespaces with util-linux's unshare.
func BenchmarkBaselineUnshare(b *testing.B) {
	requireRoot(b)
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		b.Skip("unshare (util-linux) is not installed; skipping the baseline")
	}
	benchSpawn(b, unshare, "-m", "-p", "-u", "-i", "-n", "-f", "--mount-proc", "true")
}

func benchSpawn(b *testing.B, prog string, args ...string) {
	var lat latencies
	for b.Loop() {
		t0 := time.Now()
		if out, err := exec.Command(prog, args...).CombinedOutput(); err != nil {
			b.Fatalf("%s: %v: %s", prog, err, out)
		}
		lat = append(lat, time.Since(t0))
	}
	lat.report(b, "")
}

// BenchmarkPauseResume times POST /pause and POST /resume of a running sandbox (issue 13):
// each freezes or thaws every process of the sandbox's cgroup, after its record is written
// durably.
func BenchmarkPauseResume(b *testing.B) {
	d := benchDaemon(b)
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "nap", "start": true})
	var pause, resume latencies
	for b.Loop() {
		t0 := time.Now()
		d.mustStatus(200, "POST", "/v1/sandboxes/nap/pause", nil)
		t1 := time.Now()
		d.mustStatus(200, "POST", "/v1/sandboxes/nap/resume", nil)
		pause, resume = append(pause, t1.Sub(t0)), append(resume, time.Since(t1))
	}
	pause.report(b, "pause-")
	resume.report(b, "resume-")
}

// benchRunningCapture captures a running sandbox whose writable layer holds size bytes, and
// reports the freeze each capture reports (capture_pause_ms) besides the whole capture's time.
// disk says the sandbox has a disk of its own (the server's default on a host with loop
// devices), whose capture snapshots the disk image while frozen; without, the copy itself
// runs frozen.
func benchRunningCapture(b *testing.B, size int64, disk bool) {
	if disk && disksUnsupported() != "" {
		b.Skipf("%s here: sandboxes cannot have disks of their own", disksUnsupported())
	}
	d := benchDaemon(b)
	body := map[string]any{"id": "live", "start": true, "resources": map[string]any{"disk_mb": 0}}
	if disk {
		body["resources"] = map[string]any{"disk_mb": 4096}
	}
	d.mustStatus(201, "POST", "/v1/sandboxes", body)
	got := decode[execJSON](b, d.doJSON("POST", "/v1/sandboxes/live/exec", map[string]any{
		"command": []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /home/user/blob && sync", size)}, "timeout_ms": 600000}), 200)
	if got.ExitCode != 0 {
		b.Fatalf("writing the layer's data: %+v", got)
	}
	d.mustStatus(201, "POST", "/v1/templates", map[string]any{"name": "live"})
	var frozen, capture latencies
	for b.Loop() {
		t0 := time.Now()
		var g struct {
			ID             string `json:"id"`
			CapturePauseMS int64  `json:"capture_pause_ms"`
		}
		if err := json.Unmarshal(d.mustStatus(201, "POST", "/v1/templates/live/generations?timeout=600000", map[string]any{"sandbox": "live"}).Body, &g); err != nil || g.CapturePauseMS < 1 {
			b.Fatalf("capture of a running sandbox: %+v (%v)", g, err)
		}
		capture = append(capture, time.Since(t0))
		frozen = append(frozen, time.Duration(g.CapturePauseMS)*time.Millisecond)
		b.StopTimer()
		d.mustStatus(204, "DELETE", "/v1/templates/live/generations/"+g.ID, nil)
		b.StartTimer()
	}
	frozen.report(b, "frozen-")
	capture.report(b, "capture-")
}

func BenchmarkRunningCapture10MiB(b *testing.B)     { benchRunningCapture(b, 10<<20, false) }
func BenchmarkRunningCapture1GiB(b *testing.B)      { benchRunningCapture(b, 1<<30, false) }
func BenchmarkRunningCaptureDisk10MiB(b *testing.B) { benchRunningCapture(b, 10<<20, true) }
func BenchmarkRunningCaptureDisk1GiB(b *testing.B)  { benchRunningCapture(b, 1<<30, true) }

// BenchmarkStartCosts is issue 12's figure: what the user namespace and the default disk bound
// cost a start. One loop interleaves, in rotating order so that none always runs first, a
// create+start through HTTP of:
//
//   - default: what every sandbox gets (a user namespace, the default 1 GiB disk of its own);
//   - nodisk: the same server, `"disk_mb": 0` (a user namespace, no disk);
//   - hostids: a second server with --user-namespaces=false, `"disk_mb": 0` (neither);
//   - and a bare bwrap spawn, the floor of a start.
//
// It reports each median and the ratios default/nodisk (the disk's cost), nodisk/hostids (the
// user namespace's) and each against bwrap; the stop and delete of each sandbox are outside the
// timer. docs/performance.md ("What isolation costs a start") has the command and the table.
func BenchmarkStartCosts(b *testing.B) {
	requireRoot(b)
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed (scripts/setup installs bubblewrap); the ratios need it")
	}
	userns := benchDaemon(b)
	hostIDs := startDaemon(b, withArgs("--log-level", "info", "--user-namespaces=false"))
	noDisk := map[string]any{"resources": map[string]any{"disk_mb": 0}}
	variants := []struct {
		name string
		d    *daemon
		body map[string]any
	}{
		{"default", userns, nil},
		{"nodisk", userns, noDisk},
		{"hostids", hostIDs, noDisk},
		{"bwrap", nil, nil},
	}
	lat := make(map[string]latencies, len(variants))
	for i := 0; b.Loop(); i++ {
		for j := range variants {
			v := variants[(i+j)%len(variants)]
			if v.d == nil {
				t0 := time.Now()
				if out, err := exec.Command(bwrap, bwrapArgs...).CombinedOutput(); err != nil {
					b.Fatalf("bwrap: %v: %s", err, out)
				}
				lat[v.name] = append(lat[v.name], time.Since(t0))
				continue
			}
			id := fmt.Sprintf("sc%d-%s", i, v.name)
			req := map[string]any{"id": id, "start": true}
			for k, x := range v.body {
				req[k] = x
			}
			t0 := time.Now()
			r := v.d.mustStatus(201, "POST", "/v1/sandboxes", req)
			lat[v.name] = append(lat[v.name], time.Since(t0))
			b.StopTimer()
			// The variant must be what it claims: a disk exactly where one was asked for.
			var sb struct {
				Resources struct {
					DiskMB int `json:"disk_mb"`
				} `json:"resources"`
			}
			if err := json.Unmarshal(r.Body, &sb); err != nil {
				b.Fatalf("create %s: %v: %s", id, err, r.Body)
			}
			if hasDisk := sb.Resources.DiskMB > 0; hasDisk != (v.body == nil) {
				b.Fatalf("create %s (%s): disk_mb %d: %s", id, v.name, sb.Resources.DiskMB, r.Body)
			}
			v.d.dispose(id)
			b.StartTimer()
		}
	}
	for _, v := range variants {
		b.ReportMetric(lat[v.name].median()*1000, v.name+"-median-ms")
	}
	b.ReportMetric(lat["default"].median()/lat["nodisk"].median(), "default/nodisk")
	b.ReportMetric(lat["nodisk"].median()/lat["hostids"].median(), "nodisk/hostids")
	for _, name := range []string{"default", "nodisk", "hostids"} {
		b.ReportMetric(lat[name].median()/lat["bwrap"].median(), name+"/bwrap")
	}
}
