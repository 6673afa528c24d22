package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Pid is bothyd's process id, for reading its /proc entries.
func (d *daemon) Pid() int { return d.cmd.Process.Pid }

// procUsage is a process's resident memory and open descriptors.
type procUsage struct {
	RSSKiB int `json:"rss_kib"`
	FDs    int `json:"fds"`
}

func readProcUsage(t testing.TB, pid int) procUsage {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid)
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var u procUsage
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				u.RSSKiB, _ = strconv.Atoi(f[0])
			}
		}
	}
	fds, err := os.ReadDir(dir + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	u.FDs = len(fds)
	if u.RSSKiB == 0 {
		t.Fatalf("%s/status has no VmRSS", dir)
	}
	return u
}

// loadReport is the part of bothyload's JSON report the test checks.
type loadReport struct {
	Phases []struct {
		Clients int `json:"clients"`
		Cycles  int `json:"cycles"`
		Ops     []struct {
			Op     string         `json:"op"`
			Count  int            `json:"count"`
			Errors map[string]int `json:"errors"`
		} `json:"ops"`
	} `json:"phases"`
	Proc *struct {
		Before, Peak, After procUsage
	} `json:"proc"`
	Unexpected int `json:"unexpected_errors"`
}

// TestLoadReturnsToBaseline runs bothyload against a fresh bothyd: 8 clients for 10 s of
// lifecycle cycles mixed with execs in 4 shared sandboxes (so that clients contend for exec
// admission). No error but the two busy answers may come back (`sandbox-busy`, or
// `transition-in-progress` when the wait for the sandbox's lifecycle lock, which other
// admissions take for a moment, ran out first on a loaded machine), nothing may be left
// behind, and the server's descriptors and resident memory must come back near what they
// were before.
func TestLoadReturnsToBaseline(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("the load run takes about 20 s; skipped in -short mode")
	}
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "bothyload")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/bothy/bothy/cmd/bothyload").CombinedOutput(); err != nil {
		t.Fatalf("building bothyload: %v\n%s", err, out)
	}
	d := startDaemon(t, withArgs("--log-level", "info"))

	// A first sandbox's life warms the server (page-ins, lazily built state, the HTTP
	// connection pool) so that the baseline is a server that has served, not a cold one.
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "warm", "start": true})
	d.execTrue("warm")
	d.dispose("warm")
	before := readProcUsage(t, d.Pid())

	cmd := exec.Command(bin, "--url", d.URL, "--token-file", filepath.Join(d.Root, "token"), "--clients", "8", "--duration", "10s",
		"--mix", "lifecycle=1,exec=3", "--sandboxes", "4", "--wait-ms", "200",
		"--seed", "8", "--prefix", "lt", "--pid", strconv.Itoa(d.Pid()), "--json",
		"--expect", "423 sandbox-busy,423 transition-in-progress")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var rep loadReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("bothyload (%v) printed no report: %v\nstdout %s\nstderr %s", runErr, err, stdout.Bytes(), stderr.Bytes())
	}
	t.Logf("bothyload report:\n%s", stdout.Bytes())
	if runErr != nil {
		t.Fatalf("bothyload: %v\n%s", runErr, stderr.Bytes())
	}

	if len(rep.Phases) != 1 || rep.Proc == nil {
		t.Fatalf("report has %d phases, proc %v", len(rep.Phases), rep.Proc)
	}
	counts := map[string]int{}
	for _, op := range rep.Phases[0].Ops {
		counts[op.Op] = op.Count
		for key, n := range op.Errors {
			// Exec admission under contention may refuse with either busy answer (as
			// --expect says); nothing else is an expected answer to a well-formed request,
			// and a 5xx never is.
			if key != "423 sandbox-busy" && key != "423 transition-in-progress" {
				t.Errorf("%s: %d × %s", op.Op, n, key)
			}
		}
	}
	if rep.Unexpected != 0 {
		t.Errorf("bothyload counted %d unexpected errors", rep.Unexpected)
	}
	if counts["lifecycle"] == 0 || counts["exec"] == 0 {
		t.Fatalf("the load ran %d lifecycle cycles and %d execs; both kinds must run", counts["lifecycle"], counts["exec"])
	}

	// Nothing left behind: no sandbox in the API, no runtime process on the host.
	list := decode[struct {
		Items []sandboxJSON `json:"items"`
	}](t, d.do("GET", "/v1/sandboxes", nil, nil), 200)
	if len(list.Items) != 0 {
		t.Errorf("sandboxes left after the load: %+v", list.Items)
	}
	if procs := runtimeProcesses(t, d.Root); len(procs) != 0 {
		t.Errorf("runtime processes left after the load: %v", procs)
	}

	// Descriptors must come back to the baseline (a few for connections still closing), and
	// resident memory near it: the Go runtime returns freed heap to the OS in the background,
	// so the margin allows for a heap that has not shrunk all the way yet, but not for one that
	// keeps what the load made (every sandbox's session and buffers).
	const fdMargin = 2
	const rssMarginKiB = 12 << 10
	var after procUsage
	deadline := time.Now().Add(30 * time.Second)
	for {
		after = readProcUsage(t, d.Pid())
		if (after.FDs <= before.FDs+fdMargin && after.RSSKiB <= before.RSSKiB+rssMarginKiB) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("bothyd before %+v, peak %+v, after %+v", before, rep.Proc.Peak, after)
	if after.FDs > before.FDs+fdMargin {
		t.Errorf("bothyd holds %d descriptors after the load, %d before", after.FDs, before.FDs)
	}
	if after.RSSKiB > before.RSSKiB+rssMarginKiB {
		t.Errorf("bothyd's RSS is %d KiB after the load, %d KiB before (margin %d KiB)", after.RSSKiB, before.RSSKiB, rssMarginKiB)
	}
}
