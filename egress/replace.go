package egress

import (
	"bytes"
	"io"
	"strings"
)

// chunkSize is how much a replacer reads from its source at a time; with the longest needle
// less one held back between reads, it bounds the replacer's memory.
const chunkSize = 32 << 10

// pair is one replacement: every Old becomes New.
type pair struct{ Old, New string }

// replacer streams src with every Old of pairs replaced by its New, also where an Old spans two
// reads of src: it holds back, between reads, at most the longest Old less one byte, so it
// buffers no more than chunkSize plus that, whatever the length of the stream.
type replacer struct {
	src   io.Reader
	pairs []pair
	hold  int    // the longest Old less one
	buf   []byte // read from src, not yet scanned
	out   []byte // scanned, not yet returned
	eof   bool
	err   error
}

func newReplacer(src io.Reader, pairs []pair) *replacer {
	r := &replacer{src: src, pairs: pairs}
	for _, p := range pairs {
		r.hold = max(r.hold, len(p.Old)-1)
	}
	return r
}

func (r *replacer) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.eof {
			if len(r.buf) > 0 {
				r.scan(true)
				continue
			}
			return 0, r.err
		}
		var chunk [chunkSize]byte
		n, err := r.src.Read(chunk[:])
		r.buf = append(r.buf, chunk[:n]...)
		if err != nil {
			r.eof = true
			if err != io.EOF {
				r.err = err
			} else {
				r.err = io.EOF
			}
		}
		r.scan(r.eof)
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// scan moves what of buf is settled into out, replaced: everything when final, else all but
// the tail that may be the start of an Old still to come.
func (r *replacer) scan(final bool) {
	for {
		at, which := -1, -1
		for i, p := range r.pairs {
			if j := bytes.Index(r.buf, []byte(p.Old)); j >= 0 && (at < 0 || j < at) {
				at, which = j, i
			}
		}
		if at < 0 {
			break
		}
		r.out = append(r.out, r.buf[:at]...)
		r.out = append(r.out, r.pairs[which].New...)
		r.buf = r.buf[at+len(r.pairs[which].Old):]
	}
	keep := 0
	if !final {
		keep = min(r.hold, len(r.buf))
	}
	r.out = append(r.out, r.buf[:len(r.buf)-keep]...)
	r.buf = append([]byte(nil), r.buf[len(r.buf)-keep:]...)
}

// replaceAll replaces every pair in s.
func replaceAll(s string, pairs []pair) string {
	for _, p := range pairs {
		if strings.Contains(s, p.Old) {
			s = strings.ReplaceAll(s, p.Old, p.New)
		}
	}
	return s
}
