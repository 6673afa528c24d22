package tests

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// patternReader yields n bytes of a repeating, position-dependent pattern without holding
// them: the test's own memory stays small too.
type patternReader struct{ off, n int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	k := int64(len(b))
	if rest := p.n - p.off; k > rest {
		k = rest
	}
	for i := int64(0); i < k; i++ {
		x := p.off + i
		b[i] = byte(x ^ x>>8 ^ x>>16)
	}
	p.off += k
	return int(k), nil
}

// peakRSS is a process's peak resident set (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}

// TestLargeFileIsStreamed puts a 1 GiB file into a sandbox and reads it back: the content
// arrives intact both ways, and bothyd's peak memory stays far below the file's size.
func TestLargeFileIsStreamed(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	const size = 1 << 30
	d := startDaemon(t)
	// The file is as large as the default disk of a sandbox's own: give it room.
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "big", "start": true, "resources": map[string]any{"disk_mb": 2048}})
	t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/big/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/big", nil)
	})
	before := peakRSS(t, d.Pid())

	want := sha256.New()
	body := io.TeeReader(&patternReader{n: size}, want)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "PUT", d.URL+"/v1/sandboxes/big/files?path=/home/user/big.bin", body)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.ContentLength = size
	authorize(req)
	resp, err := d.checkedClient(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 {
		t.Fatalf("PUT: %d", resp.StatusCode)
	}
	if got := d.exec("big", map[string]any{"command": []string{"stat", "-c", "%s", "/home/user/big.bin"}}); strings.TrimSpace(got.Stdout) != strconv.Itoa(size) {
		t.Fatalf("inside the sandbox the file is %q bytes", got.Stdout)
	}

	req, _ = http.NewRequestWithContext(ctx, "GET", d.URL+"/v1/sandboxes/big/files?path=/home/user/big.bin", nil)
	authorize(req)
	resp, err = d.checkedClient(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != size {
		t.Fatalf("GET: %d, length %d", resp.StatusCode, resp.ContentLength)
	}
	got := sha256.New()
	if n, err := io.Copy(got, resp.Body); err != nil || n != size {
		t.Fatalf("GET body: %d bytes, %v", n, err)
	}
	if string(got.Sum(nil)) != string(want.Sum(nil)) {
		t.Fatal("the file read back differs from the file written")
	}

	// A server that held the file would have grown by about a GiB.
	const allowance = 128 << 20
	if after := peakRSS(t, d.Pid()); after-before > allowance {
		t.Fatalf("bothyd's peak memory grew by %d MiB moving a 1 GiB file", (after-before)>>20)
	} else {
		t.Logf("bothyd's peak memory: %d MiB before, %d MiB after moving 1 GiB each way", before>>20, after>>20)
	}
}

// TestFileReadWhileReplaced: a workload replaces a file by rename over and over (as one
// publishing its progress does) while a client reads it through the API: every response is
// whole, its body as long as its Content-Length and one complete version of the file.
func TestFileReadWhileReplaced(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("publisher", true)
	// Version i is `seq i`: every version has another length, so a length taken from one
	// version and the content of another cannot agree.
	loop := "i=0; while :; do i=$((i+1)); seq $i > /tmp/p; mv /tmp/p /tmp/progress; done"
	res := make(chan response, 1)
	go func() {
		status, body, err := chaosDo(d.checkedClient(&http.Client{Timeout: 2 * time.Minute}), d.URL, "POST", "/v1/sandboxes/publisher/exec",
			map[string]any{"command": []string{"sh", "-c", loop}, "timeout_ms": 60000})
		if err != nil {
			body = []byte(err.Error())
		}
		res <- response{Status: status, Body: body}
	}()
	waitFor(t, 20*time.Second, "the first version", func() bool {
		return d.do("GET", "/v1/sandboxes/publisher/files?path=/tmp/progress", nil, nil).Status == 200
	})
	first, last := 0, 0
	for range 200 {
		r := d.do("GET", "/v1/sandboxes/publisher/files?path=/tmp/progress", nil, nil)
		lines := strings.Split(strings.TrimSuffix(string(r.Body), "\n"), "\n")
		n, err := strconv.Atoi(lines[len(lines)-1])
		var seq strings.Builder
		for i := 1; i <= n; i++ {
			fmt.Fprintf(&seq, "%d\n", i)
		}
		if r.Status != 200 || err != nil || string(r.Body) != seq.String() {
			t.Fatalf("a read while the file is replaced: %d %.200q", r.Status, r.Body)
		}
		if cl := r.Header.Get("Content-Length"); cl != strconv.Itoa(len(r.Body)) {
			t.Fatalf("Content-Length %q for a body of %d bytes", cl, len(r.Body))
		}
		if first == 0 {
			first = n
		}
		last = n
	}
	if last == first {
		t.Fatalf("the file was not replaced while it was read (version %d throughout)", first)
	}
	t.Logf("200 whole reads while the workload published versions %d to %d", first, last)
	if r := d.doJSON("POST", "/v1/sandboxes/publisher/stop?force=true", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	<-res
}
