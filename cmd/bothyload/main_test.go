package main

import (
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, o options)
	}{
		{name: "defaults", check: func(t *testing.T, o options) {
			if len(o.clients) != 1 || o.clients[0] != 1 || o.mix[0].kind != "lifecycle" || o.duration != 10*time.Second {
				t.Fatalf("%+v", o)
			}
			if !strings.HasPrefix(o.prefix, "load-") || o.expected[0] != "423 sandbox-busy" {
				t.Fatalf("prefix %q, expected %q", o.prefix, o.expected)
			}
		}},
		{name: "list of clients and weighted mix", args: []string{"--clients", "1,2, 32", "--mix", "lifecycle=1,exec=3,clone"}, check: func(t *testing.T, o options) {
			if got := o.clients; len(got) != 3 || got[2] != 32 {
				t.Fatalf("clients %v", got)
			}
			if len(o.mix) != 3 || o.mix[1] != (mixEntry{"exec", 3}) || o.mix[2] != (mixEntry{"clone", 1}) {
				t.Fatalf("mix %+v", o.mix)
			}
		}},
		{name: "cycles", args: []string{"--cycles", "5", "--duration", "0"}, check: func(t *testing.T, o options) {
			if o.cycles != 5 {
				t.Fatalf("cycles %d", o.cycles)
			}
		}},
		{name: "unbounded", args: []string{"--duration", "0"}, wantErr: "must end by itself"},
		{name: "zero clients", args: []string{"--clients", "0"}, wantErr: "--clients"},
		{name: "bad clients", args: []string{"--clients", "1,x"}, wantErr: "--clients"},
		{name: "unknown kind", args: []string{"--mix", "fork"}, wantErr: "unknown kind"},
		{name: "bad weight", args: []string{"--mix", "exec=0"}, wantErr: "weight"},
		{name: "bad prefix", args: []string{"--prefix", "../x"}, wantErr: "--prefix"},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

func TestCheckTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url    string
		remote bool
		ok     bool
	}{
		{"http://127.0.0.1:7780", false, true},
		{"http://[::1]:7780", false, true},
		{"http://localhost:7780", false, true},
		{"http://192.0.2.1:7780", false, false},
		{"http://192.0.2.1:7780", true, true},
		{"ftp://127.0.0.1", false, false},
		{"127.0.0.1:7780", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			if err := checkTarget(tt.url, tt.remote); (err == nil) != tt.ok {
				t.Fatalf("checkTarget(%q, %v) = %v, want ok=%v", tt.url, tt.remote, err, tt.ok)
			}
		})
	}
}

func TestRecorderReport(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	for i := 1; i <= 100; i++ {
		r.ok("exec", time.Duration(i)*time.Millisecond, 0)
	}
	r.ok("stream", 2*time.Second, 1e9)
	r.fail("exec", "423 sandbox-busy")
	r.fail("exec", "423 sandbox-busy")
	r.fail("exec", "transport")
	ops := r.report(10 * time.Second)
	if len(ops) != 2 || ops[0].Op != "exec" || ops[1].Op != "stream" {
		t.Fatalf("ops %+v", ops)
	}
	e := ops[0]
	if e.Count != 100 || e.P50MS != 50 || e.P90MS != 90 || e.P99MS != 99 || e.MaxMS != 100 || e.PerSecond != 10 {
		t.Fatalf("exec %+v", e)
	}
	if e.Errors["423 sandbox-busy"] != 2 || e.Errors["transport"] != 1 {
		t.Fatalf("errors %v", e.Errors)
	}
	// A stream's rate is over the time the streams ran: 1 GB in 2 s.
	if s := ops[1]; s.MBPerSecond != 500 {
		t.Fatalf("stream %+v", s)
	}
}

func TestAPIErrorKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want string
	}{
		{&apiError{Status: 423, Code: "sandbox-busy"}, "423 sandbox-busy"},
		{&apiError{Status: 502}, "502"},
		{&apiError{Err: io.ErrUnexpectedEOF}, "transport"},
		{io.EOF, "other"},
	}
	for _, tt := range tests {
		if got := errKey(tt.err); got != tt.want {
			t.Errorf("errKey(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestProcSampling(t *testing.T) {
	t.Parallel()
	pid := os.Getpid()
	s, err := sampleProc(pid)
	if err != nil || s.RSSKiB <= 0 || s.FDs < 3 {
		t.Fatalf("sampleProc = %+v, %v", s, err)
	}
	before, err := cpuTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Burn CPU until the clock ticks it shows move (they count in 10 ms steps).
	deadline := time.Now().Add(10 * time.Second)
	for {
		after, err := cpuTime(pid)
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cpuTime stayed at %v while this test spun", before)
		}
		for i := 0; i < 1e6; i++ {
			_ = strings.Repeat("x", i%3)
		}
	}
	if _, err := sampleProc(1 << 30); err == nil {
		t.Fatal("sampleProc of a pid that cannot exist succeeded")
	}
}

func TestParseBenchFlags(t *testing.T) {
	t.Parallel()
	o, err := parseBenchFlags([]string{"--cycles", "7", "--stream-vcpus", "1, 2,4", "--idle", "40"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.cycles != 7 || len(o.streamVCPUs) != 3 || o.streamVCPUs[2] != 4 || o.idle != 40 || !strings.HasPrefix(o.prefix, "bench-") {
		t.Fatalf("%+v", o)
	}
	for _, bad := range [][]string{{"--cycles", "0"}, {"--stream-vcpus", "x"}, {"--streams", "-1"}, {"--idle", "-1"}, {"extra"}} {
		if _, err := parseBenchFlags(bad, io.Discard); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestReadToken: without --token-file the token is the one bothyd generated into its state
// root; a missing root token means a server without auth, a missing given file an error.
func TestReadToken(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if tok, err := readToken("", root); err != nil || tok != "" {
		t.Fatalf("no token file: %q, %v", tok, err)
	}
	if err := os.WriteFile(root+"/token", []byte("generated-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := readToken("", root); err != nil || tok != "generated-token-0123456789" {
		t.Fatalf("root token: %q, %v", tok, err)
	}
	given := t.TempDir() + "/given"
	if _, err := readToken(given, root); err == nil {
		t.Fatal("a missing --token-file read as no token")
	}
	if err := os.WriteFile(given, []byte("given-token-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := readToken(given, root); err != nil || tok != "given-token-0123456789" {
		t.Fatalf("given token: %q, %v", tok, err)
	}
}

// TestBenchPIDFlag: --pid must name a live process, as the CPU figures read its /proc.
func TestBenchPIDFlag(t *testing.T) {
	t.Parallel()
	o, err := parseBenchFlags([]string{"--pid", strconv.Itoa(os.Getpid())}, io.Discard)
	if err != nil || o.pid != os.Getpid() {
		t.Fatalf("--pid of this test: %+v, %v", o, err)
	}
	for _, bad := range []string{"-1", strconv.Itoa(1 << 30)} {
		if _, err := parseBenchFlags([]string{"--pid", bad}, io.Discard); err == nil {
			t.Errorf("--pid %s: no error", bad)
		}
	}
}

// TestTreePSS: a child of this test is among its descendants, a grandchild too, and their
// PSS sum is positive; a pid without children has none.
func TestTreePSS(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sh", "-c", "sleep 60 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var pids []int
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if pids, err = descendants(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		if len(pids) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the shell has yet to fork its sleep
	}
	if len(pids) != 1 {
		t.Fatalf("the shell's descendants: %v, want its sleep alone", pids)
	}
	mine, err := descendants(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mine, cmd.Process.Pid) || !slices.Contains(mine, pids[0]) {
		t.Fatalf("this test's descendants %v lack the shell %d or its sleep %d", mine, cmd.Process.Pid, pids[0])
	}
	pss, err := treePSSKiB(os.Getpid())
	if err != nil || pss <= 0 {
		t.Fatalf("treePSSKiB = %d, %v", pss, err)
	}
	if none, err := descendants(pids[0]); err != nil || len(none) != 0 {
		t.Fatalf("the sleep's descendants: %v, %v", none, err)
	}
}

// TestSeriesCPU: with --pid a series reports the CPU this process burnt, and its ratio to
// the bwrap time given it against issue 42's goal; without --pid nothing.
func TestSeriesCPU(t *testing.T) {
	t.Parallel()
	if c, err := (&bench{}).startCPU().end("cycle", 1, true); c != nil || err != nil {
		t.Fatalf("without --pid: %+v, %v", c, err)
	}
	b := &bench{o: benchOptions{pid: os.Getpid()}}
	s := b.startCPU()
	deadline := time.Now().Add(10 * time.Second)
	for {
		now, err := cpuTime(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now > s.startSelf+s.startReaped || time.Now().After(deadline) {
			break
		}
		for i := 0; i < 1e6; i++ {
			_ = strings.Repeat("x", i%3)
		}
	}
	s.bwrap = 2 * time.Second // far above what the loop burnt: the goal is met
	c, err := s.end("cycle", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	if c.MSPerCycle <= 0 || c.ServerMS <= 0 || c.ServerMS+c.ReapedMS != c.MSPerCycle || c.BwrapMS != 1000 || c.XBwrap != c.MSPerCycle/1000 || c.Met == nil || !*c.Met || c.Goal != cpuGoalXBwrap {
		t.Fatalf("%+v", c)
	}
	s.bwrap = time.Microsecond
	if c, err = s.end("cycle", 2, true); err != nil || c.Met == nil || *c.Met {
		t.Fatalf("with a bwrap spawn of 1 µs the goal must be missed: %+v, %v", c, err)
	}
}
