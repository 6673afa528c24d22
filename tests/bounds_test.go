package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// The bounds of issue 21 item 3, end to end: what a client holds open is counted until it
// ends, past the bound the server refuses with the documented problem, and the slot is free
// again once what held it ends (read to its end, or dropped by its client).

// infoBounds is /v1/info's limits.bounds.
type infoBounds struct {
	FileOpsPerSandbox int `json:"file_ops_per_sandbox"`
	FileOps           int `json:"file_ops"`
	EventStreams      int `json:"event_streams"`
}

func (d *daemon) bounds() infoBounds {
	d.t.Helper()
	var info struct {
		Limits struct {
			Bounds infoBounds `json:"bounds"`
		} `json:"limits"`
	}
	if err := json.Unmarshal(d.mustStatus(200, "GET", "/v1/info", nil).Body, &info); err != nil {
		d.t.Fatal(err)
	}
	b := info.Limits.Bounds
	if b.FileOpsPerSandbox < 1 || b.FileOps < b.FileOpsPerSandbox || b.EventStreams < 1 {
		d.t.Fatalf("/v1/info shows bounds %+v", b)
	}
	return b
}

// held is a response whose headers arrived and whose body the test has not consumed: the
// server still holds what it admitted for it.
type held struct {
	resp   *http.Response
	cancel context.CancelFunc
}

// drop closes the connection without reading the rest of the body, as a client that goes away.
func (h held) drop() {
	h.cancel()
	h.resp.Body.Close()
}

// hold sends a GET and returns its response once the headers are in, body unread; a status
// other than want fails the test.
func (d *daemon) hold(path string, want int) held {
	d.t.Helper()
	return d.holdFrom(nil, path, want)
}

// fromAddr is a client of the local address ip (an address of lo, 127.0.0.0/8): a client of
// its own to the server's per-client bounds.
func fromAddr(ip string) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
}

// holdFrom is hold with the client base (nil: the daemon's own).
func (d *daemon) holdFrom(base *http.Client, path string, want int) held {
	d.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", d.URL+path, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.Token)
	// A connection of its own: a held body keeps its connection busy.
	resp, err := d.checkedClient(base).Do(req)
	if err != nil {
		cancel()
		d.t.Fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != want {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		d.t.Fatalf("GET %s: status %d, want %d: %s", path, resp.StatusCode, want, b)
	}
	return held{resp: resp, cancel: cancel}
}

// TestBoundsFileOps: a sandbox's file operations are bounded while their bodies are unsent.
// Reads of a file far larger than the sockets buffer, whose bodies the test does not read,
// each hold a slot; past the per-sandbox bound every file operation on that sandbox answers
// 423 sandbox-busy, while another sandbox's still work. A read drained to its end frees its
// slot, and reads whose clients went away free theirs, so the whole bound is available again.
func TestBoundsFileOps(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	bound := d.bounds().FileOpsPerSandbox
	d.create("slow", true)
	d.create("other", true)
	// 64 MiB: more than a loopback connection's buffers (a few MiB each way) and the control
	// stream's can take, so that a read whose body is not consumed cannot finish.
	const size = 64 << 20
	got := decode[execJSON](t, d.doJSON("POST", "/v1/sandboxes/slow/exec", map[string]any{
		"command": []string{"sh", "-c", "head -c 67108864 /dev/zero > /home/user/big && echo small > /home/user/small"}, "timeout_ms": 120000}), 200)
	if got.ExitCode != 0 {
		t.Fatalf("writing the file: %+v", got)
	}

	const big = "/v1/sandboxes/slow/files?path=/home/user/big"
	readers := make([]held, 0, bound)
	for range bound {
		readers = append(readers, d.hold(big, 200))
	}
	t.Cleanup(func() {
		for _, r := range readers {
			r.drop()
		}
	})
	// Past the bound: reads, lists, writes and removes of this sandbox are refused.
	p := wantProblem(t, d.do("GET", "/v1/sandboxes/slow/files?path=/home/user/small", nil, nil), 423, "sandbox-busy")
	t.Logf("past the bound: %s", p.Detail)
	wantProblem(t, d.do("GET", "/v1/sandboxes/slow/files/list?path=/home/user", nil, nil), 423, "sandbox-busy")
	wantProblem(t, d.do("PUT", "/v1/sandboxes/slow/files?path=/home/user/new", nil, http.Header{"Content-Type": {"application/octet-stream"}}), 423, "sandbox-busy")
	wantProblem(t, d.do("DELETE", "/v1/sandboxes/slow/files?path=/home/user/small", nil, nil), 423, "sandbox-busy")
	// The bound is per sandbox.
	if r := d.do("GET", "/v1/sandboxes/other/files/list?path=/home/user", nil, nil); r.Status != 200 {
		t.Fatalf("another sandbox's list while the first is at its bound: %d %s", r.Status, r.Body)
	}

	// One reader finishes: its body read to the end frees its slot.
	n, err := io.Copy(io.Discard, readers[0].resp.Body)
	if err != nil || n != size {
		t.Fatalf("draining a held read: %d bytes, %v; want %d", n, err, size)
	}
	readers[0].drop()
	readers = readers[1:]
	waitFor(t, 10*time.Second, "the drained read's slot to be free", func() bool {
		return d.do("GET", "/v1/sandboxes/slow/files?path=/home/user/small", nil, nil).Status == 200
	})
	// That was one slot: taking it leaves the sandbox at its bound again.
	readers = append(readers, d.hold(big, 200))
	wantProblem(t, d.do("GET", "/v1/sandboxes/slow/files?path=/home/user/small", nil, nil), 423, "sandbox-busy")

	// The clients go away without reading: every slot comes back, the whole bound of them.
	for _, r := range readers {
		r.drop()
	}
	readers = readers[:0]
	waitFor(t, 20*time.Second, "the dropped reads' slots to be free", func() bool {
		return d.do("GET", "/v1/sandboxes/slow/files?path=/home/user/small", nil, nil).Status == 200
	})
	for range bound {
		readers = append(readers, d.hold(big, 200))
	}
	wantProblem(t, d.do("GET", "/v1/sandboxes/slow/files?path=/home/user/small", nil, nil), 423, "sandbox-busy")
}

// TestBoundsEventStreams: the open /v1/events streams are bounded server-wide; past the bound
// a stream is refused 429 limit-reached (before it opens), and closing one lets the next in.
// The streams come from several clients (addresses of lo), since one client holds at most
// server.MaxStreamsPerClient.
func TestBoundsEventStreams(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	bound := d.bounds().EventStreams
	streams := make([]held, 0, bound)
	t.Cleanup(func() {
		for _, s := range streams {
			s.drop()
		}
	})
	for i := range bound {
		s := d.holdFrom(fromAddr(fmt.Sprintf("127.0.0.%d", 10+i/16)), "/v1/events", 200)
		if ct := s.resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("an admitted event stream has Content-Type %q", ct)
		}
		streams = append(streams, s)
	}
	p := wantProblem(t, d.do("GET", "/v1/events", nil, nil), 429, "limit-reached")
	t.Logf("past the bound: %s", p.Detail)
	// Other requests are not affected by the streams' bound.
	d.mustStatus(200, "GET", "/v1/info", nil)

	streams[0].drop()
	streams = streams[1:]
	var next held
	waitFor(t, 10*time.Second, "a closed stream's slot to be free", func() bool {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", d.URL+"/v1/events", nil)
		req.Header.Set("Authorization", "Bearer "+d.Token)
		resp, err := d.checkedClient(nil).Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			resp.Body.Close()
			cancel()
			return false
		}
		next = held{resp: resp, cancel: cancel}
		return true
	})
	streams = append(streams, next)
	// The one slot freed is taken again.
	wantProblem(t, d.do("GET", "/v1/events", nil, nil), 429, "limit-reached")
}
