package control

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// bigDir lists a directory of n entries in batches of 256, as the agent does, and counts the
// entries it produced.
type bigDir struct {
	*fakeHandler
	n        int
	produced atomic.Int64
}

func (b *bigDir) List(ctx context.Context, req *FileRequest, emit func([]FileInfo) error) error {
	for i := 0; i < b.n; i += 256 {
		batch := make([]FileInfo, 0, 256)
		for j := i; j < min(i+256, b.n); j++ {
			batch = append(batch, FileInfo{Name: fmt.Sprintf("entry-%06d", j), Type: TypeFile})
		}
		b.produced.Add(int64(len(batch)))
		if err := emit(batch); err != nil {
			return err
		}
	}
	return nil
}

// TestListIsBounded: a listing of a directory far larger than the limit answers the first
// limit entries and says it was cut, and the agent's side stops producing soon after the
// limit instead of listing the whole directory. Before the limit existed, List answered all
// 120 000 entries, every one of them held by the client at once.
func TestListIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		entries   int
		limit     int // 0: List's default
		want      int
		truncated bool
	}{
		{name: "default limit of a huge directory", entries: 120_000, want: DefaultListLimit, truncated: true},
		{name: "limit within a batch", entries: 120_000, limit: 1000, want: 1000, truncated: true},
		{name: "limit at a batch boundary", entries: 120_000, limit: 512, want: 512, truncated: true},
		{name: "exactly the limit", entries: 512, limit: 512, want: 512},
		{name: "under the limit", entries: 300, limit: 512, want: 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := &bigDir{fakeHandler: newFake(), n: tc.entries}
			c, _ := dial(t, h)
			var (
				list      []FileInfo
				truncated bool
				err       error
			)
			if tc.limit == 0 {
				list, err = c.List(ctx, "/big", "")
				truncated = len(list) < tc.entries
			} else {
				list, truncated, err = c.ListLimit(ctx, "/big", "", tc.limit)
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != tc.want || truncated != tc.truncated {
				t.Fatalf("listed %d entries, truncated %v; want %d, %v", len(list), truncated, tc.want, tc.truncated)
			}
			for i, fi := range list {
				if want := fmt.Sprintf("entry-%06d", i); fi.Name != want {
					t.Fatalf("entry %d is %q, want %q", i, fi.Name, want)
				}
			}
			// The handler is stopped at the first batch past the limit.
			if got := h.produced.Load(); got > int64(tc.want+256) {
				t.Fatalf("the handler produced %d entries for a listing of %d", got, tc.want)
			}
		})
	}
	c, _ := dial(t, newFake())
	if _, _, err := c.ListLimit(ctx, "/", "", MaxListLimit+1); err == nil {
		t.Fatal("a limit above MaxListLimit was accepted")
	}
}

// TestListLimitWithHostileAgent: an agent that ignores the limit (it sends frames full of
// tiny entries and never ends) cannot make the client hold more than the limit: the client
// answers with the first limit entries as soon as it has them.
func TestListLimitWithHostileAgent(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	go func() {
		sess, err := yamux.Server(b, yamuxConfig())
		if err != nil {
			return
		}
		defer sess.Close()
		for {
			st, err := sess.Accept()
			if err != nil {
				return
			}
			t, p, err := ReadFrame(st, nil)
			if err != nil || t != FrameHeader {
				return
			}
			hdr, err := DecodeHeader(p)
			if err != nil {
				return
			}
			fw := &frameWriter{w: st}
			if hdr.Op == OpHello {
				writeJSON(fw, FrameResult, HelloResponse{Protocol: ProtocolVersion, Features: RequiredFeatures})
				st.Close()
				continue
			}
			// A frame of nearly MaxFramePayload holding as many empty entries as fit, over
			// and over, until the client gives up.
			batch := []byte("[{}")
			for len(batch)+4 < MaxFramePayload {
				batch = append(batch, ",{}"...)
			}
			batch = append(batch, ']')
			for fw.write(FrameData, batch) == nil {
			}
			return
		}
	}()
	c, err := Dial(a, capability, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	list, truncated, err := c.ListLimit(context.Background(), "/", "", 100)
	if err != nil || len(list) != 100 || !truncated {
		t.Fatalf("a hostile listing: %d entries, truncated %v, %v; want 100, true", len(list), truncated, err)
	}
	// What the agent sends after the client gave up waits in the stream's window (yamux's
	// bound per stream) until the stream is torn down.

	// Names longer than a file system allows are refused, not held.
	if _, _, err := appendBatch(nil, mustJSON(t, []FileInfo{{Name: string(make([]byte, maxNameLen+1))}}), 10); err == nil {
		t.Fatal("a listing with a name longer than NAME_MAX was accepted")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
