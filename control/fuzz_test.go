package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzReadFrame: whatever the bytes, the decoder neither panics nor accepts an oversized or
// unknown frame, and what it accepts re-encodes to the bytes it consumed.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{byte(FrameEOF), 0, 0, 0, 0})
	f.Add([]byte{byte(FrameStdout), 0, 0, 0, 3, 'a', 'b', 'c'})
	f.Add([]byte{byte(FrameHeader), 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 0, 0})
	f.Add([]byte{byte(FrameData), 0, 0, 0, 9, 'x'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			before := r.Len()
			typ, p, err := ReadFrame(r, nil)
			if err != nil {
				if errors.Is(err, io.EOF) && before != 0 {
					t.Fatalf("clean EOF inside a frame")
				}
				return
			}
			if !typ.valid() || len(p) > MaxFramePayload {
				t.Fatalf("accepted type %d with %d bytes", typ, len(p))
			}
			var out bytes.Buffer
			if err := WriteFrame(&out, typ, p); err != nil {
				t.Fatal(err)
			}
			consumed := b[len(b)-before : len(b)-r.Len()]
			if !bytes.Equal(out.Bytes(), consumed) {
				t.Fatalf("re-encoding differs")
			}
		}
	})
}

// FuzzExecHeader: DecodeHeader never panics, and a header it accepts upholds what the agent
// relies on.
func FuzzExecHeader(f *testing.F) {
	f.Add([]byte(`{"op":"exec","exec":{"argv":["sh","-c","echo hi"],"env":["A=b"],"cwd":"/tmp","user":"root","tty":true,"rows":24,"cols":80,"timeout_ms":1000,"stdin":true}}`))
	f.Add([]byte(`{"op":"exec","exec":{"argv":[""]}}`))
	f.Add([]byte(`{"op":"exec","exec":{"argv":["x"],"cwd":"rel"}}`))
	f.Add([]byte(`{"op":"read","file":{"path":"/etc/passwd"}}`))
	f.Add([]byte(`{"op":"hello","hello":{"protocol":1,"capability":"c2VjcmV0"}}`))
	f.Add([]byte(`{"op":"shutdown","shutdown":{"grace_ms":-1}}`))
	f.Add([]byte(`{"op":"nope"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			var re *RemoteError
			if !errors.As(err, &re) || re.Code != CodeInvalidRequest {
				t.Fatalf("error is not an invalid-request RemoteError: %v", err)
			}
			return
		}
		switch h.Op {
		case OpExec:
			e := h.Exec
			if len(e.Argv) == 0 || e.Argv[0] == "" || e.TimeoutMS < 0 {
				t.Fatalf("accepted %+v", e)
			}
			for _, kv := range e.Env {
				if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
					t.Fatalf("accepted env %q", kv)
				}
			}
			if e.Cwd != "" && (e.Cwd[0] != '/' || strings.ContainsRune(e.Cwd, 0)) {
				t.Fatalf("accepted cwd %q", e.Cwd)
			}
		case OpRead, OpWrite, OpList, OpStat, OpMkdir, OpRemove:
			p := h.File.Path
			if p == "" || p[0] != '/' || len(p) > MaxPathLen || strings.ContainsRune(p, 0) {
				t.Fatalf("accepted path %q", p)
			}
		}
		// What was accepted survives a round trip.
		again, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeHeader(again); err != nil {
			t.Fatalf("re-encoded header refused: %v", err)
		}
	})
}
