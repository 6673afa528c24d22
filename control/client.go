package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/bothy/bothy/errcode"
)

// Client is bothyd's side of a control connection. It is safe for concurrent use; every
// operation runs on its own stream.
type Client struct {
	sess  *yamux.Session
	hello HelloResponse
	// fds passes descriptors to the agent; nil unless the connection is a unix socket.
	fds *fdSender
	// stdoutPipes says an exec's stdout goes to a pipe passed to the agent
	// (FeatureStdoutPipe).
	stdoutPipes bool
	// frozen, if set, says whether the agent is frozen now (its sandbox paused, or held by a
	// capture's freeze): see [Client.SetFrozenCheck].
	frozen atomic.Pointer[func() bool]
}

// ErrClosed is returned by operations on a client whose connection ended: the sandbox
// stopped, or its agent ended. Callers above the supervisor see not-running (409), as for an
// operation on a stopped sandbox, never an internal failure.
var ErrClosed error = &errcode.Error{Code: errcode.NotRunning,
	Msg: "The sandbox stopped, or its agent ended, during the operation; start it again if it is not running."}

// Dial starts a session over conn and authenticates with capability. It fails, closing conn,
// if the agent does not answer within timeout, refuses the capability, speaks another protocol
// version or lacks one of RequiredFeatures. The client owns conn from then on.
func Dial(conn io.ReadWriteCloser, capability []byte, timeout time.Duration) (*Client, error) {
	return dialWith(conn, capability, timeout, keepAlive)
}

// dialWith is Dial with keepAlive as the keepalive's interval and the session's write timeout
// (a ping's too), which tests shorten.
func dialWith(conn io.ReadWriteCloser, capability []byte, timeout, keepAlive time.Duration) (*Client, error) {
	if timeout <= 0 {
		conn.Close()
		return nil, fmt.Errorf("control: dial timeout must be positive")
	}
	conn, fds := senderConn(conn)
	cfg := yamuxConfig()
	cfg.EnableKeepAlive = false // Client.keepalive instead
	cfg.ConnectionWriteTimeout = keepAlive
	sess, err := yamux.Client(conn, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c := &Client{sess: sess, fds: fds}
	if err := c.doHello(capability, timeout); err != nil {
		sess.Close()
		return nil, err
	}
	c.stdoutPipes = fds != nil && slices.Contains(c.hello.Features, FeatureStdoutPipe)
	go c.keepalive(keepAlive)
	return c, nil
}

// SetFrozenCheck gives the client a way to tell whether the agent is frozen now. A frozen
// agent answers no ping until it is thawed, and without the check the keepalive would take
// that silence for death and end the session, failing every exec that runs through it
// though its sandbox is only paused. frozen is called before and after each ping, from the
// keepalive's goroutine, and by [Client.Frozen]: it must be cheap and safe to call from any
// goroutine.
func (c *Client) SetFrozenCheck(frozen func() bool) { c.frozen.Store(&frozen) }

// Frozen reports what the check of SetFrozenCheck says now: whether the agent is frozen,
// false without a check.
func (c *Client) Frozen() bool { return c.agentFrozen() }

func (c *Client) agentFrozen() bool {
	f := c.frozen.Load()
	return f != nil && (*f)()
}

// keepalive pings the agent every interval and ends the session when a ping goes unanswered
// for the connection write timeout (a killed sandbox, a dead socket), as yamux's own
// keepalive would, except while the agent is frozen: then it does not ping, and a ping that
// went out just before the freeze does not count.
func (c *Client) keepalive(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-c.sess.CloseChan():
			return
		}
		if c.agentFrozen() {
			continue
		}
		if _, err := c.sess.Ping(); err != nil {
			if c.sess.IsClosed() || c.agentFrozen() {
				continue // the loop ends at the close; a freeze began meanwhile
			}
			c.sess.Close()
			return
		}
	}
}

func (c *Client) doHello(capability []byte, timeout time.Duration) error {
	st, err := c.sess.OpenStream()
	if err != nil {
		return fmt.Errorf("control: opening the hello stream: %w", err)
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(timeout))
	fw := &frameWriter{w: st}
	if err := writeJSON(fw, FrameHeader, Header{Op: OpHello, Hello: &HelloRequest{Protocol: ProtocolVersion, Capability: capability}}); err != nil {
		return fmt.Errorf("control: sending hello: %w", err)
	}
	t, p, err := ReadFrame(st, nil)
	if err != nil {
		// The agent closes the session on a wrong capability without a word, so that an
		// intruder learns nothing; to us that reads as an ended stream.
		return fmt.Errorf("control: no hello answer (wrong capability, or the agent is not ready): %w", err)
	}
	switch t {
	case FrameResult:
		if err := json.Unmarshal(p, &c.hello); err != nil {
			return fmt.Errorf("control: bad hello answer: %w", err)
		}
	case FrameError:
		return decodeRemoteError(p)
	default:
		return fmt.Errorf("control: unexpected %s frame answering hello", t)
	}
	if c.hello.Protocol != ProtocolVersion {
		return fmt.Errorf("control: the agent speaks protocol %d, want %d", c.hello.Protocol, ProtocolVersion)
	}
	for _, f := range RequiredFeatures {
		if !slices.Contains(c.hello.Features, f) {
			return fmt.Errorf("control: the agent lacks the %q feature", f)
		}
	}
	return nil
}

// Features are the features the agent announced.
func (c *Client) Features() []string { return slices.Clone(c.hello.Features) }

// AgentVersion is the version the agent announced.
func (c *Client) AgentVersion() string { return c.hello.AgentVersion }

// Done is closed when the connection ended (closed by either side, or dead).
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// Close ends the connection. Per the protocol, every workload still running through it is
// killed by the agent.
func (c *Client) Close() error { return c.sess.Close() }

// open opens a stream and sends its header. While ctx is live it may abort the stream: the
// returned stop detaches ctx and reports whether it was still live.
func (c *Client) open(ctx context.Context, hdr Header) (*yamux.Stream, *frameWriter, func() bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, nil, err
	}
	st, err := c.sess.OpenStream()
	if err != nil {
		if c.sess.IsClosed() {
			return nil, nil, nil, ErrClosed
		}
		if errors.Is(err, yamux.ErrRemoteGoAway) {
			// The agent answered a shutdown (a stop) and takes no new operation: the same
			// refusal it sends on a stream opened just before, not a transport failure.
			return nil, nil, nil, ErrShuttingDown.Err()
		}
		return nil, nil, nil, fmt.Errorf("control: opening a stream: %w", err)
	}
	stop := context.AfterFunc(ctx, func() {
		// Closing tells the agent to give up; the deadline frees our own blocked reads and
		// writes even if the agent does not answer.
		st.Close()
		st.SetDeadline(time.Now())
	})
	fw := &frameWriter{w: st}
	if err := writeJSON(fw, FrameHeader, hdr); err != nil {
		stop()
		st.Close()
		return nil, nil, nil, c.streamErr(ctx, err)
	}
	return st, fw, stop, nil
}

// openAnswered opens a stream for hdr and reads the agent's first frame, both within ctx;
// the stream is then the caller's, which ctx's end no longer closes.
func (c *Client) openAnswered(ctx context.Context, hdr Header) (*yamux.Stream, FrameType, []byte, error) {
	st, _, stop, err := c.open(ctx, hdr)
	if err != nil {
		return nil, 0, nil, err
	}
	t, p, err := ReadFrame(st, nil)
	live := stop()
	if err != nil || !live {
		st.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, 0, nil, c.streamErr(ctx, err)
	}
	return st, t, p, nil
}

// streamErr explains a failed read or write on a stream: the caller's cancellation, the
// connection's end, or the transport's error.
func (c *Client) streamErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if c.sess.IsClosed() {
		return ErrClosed
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("control: the agent ended the stream early: %w", io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("control: %w", err)
}

func decodeRemoteError(p []byte) error {
	var re RemoteError
	if err := json.Unmarshal(p, &re); err != nil || re.Code == "" {
		return fmt.Errorf("control: malformed error frame from the agent")
	}
	return re.Err()
}

// roundTrip runs an operation whose answer is one result frame (or an error frame).
func (c *Client) roundTrip(ctx context.Context, hdr Header, result any) error {
	st, _, stop, err := c.open(ctx, hdr)
	if err != nil {
		return err
	}
	defer st.Close()
	defer stop()
	t, p, err := ReadFrame(st, nil)
	if err != nil {
		return c.streamErr(ctx, err)
	}
	switch t {
	case FrameResult:
		if result == nil {
			return nil
		}
		if err := json.Unmarshal(p, result); err != nil {
			return fmt.Errorf("control: malformed %s answer: %w", hdr.Op, err)
		}
		return nil
	case FrameError:
		return decodeRemoteError(p)
	}
	return fmt.Errorf("control: unexpected %s frame answering %s", t, hdr.Op)
}

// Stat describes the file at path, as user sees it (a symlink itself, not its target).
func (c *Client) Stat(ctx context.Context, path, user string) (FileInfo, error) {
	var fi FileInfo
	err := c.roundTrip(ctx, Header{Op: OpStat, File: &FileRequest{Path: path, User: user}}, &fi)
	return fi, err
}

// StatDetails is Stat with the file's details (owner, group, symlink target, user
// metadata) where the agent serves FeatureFileMeta; an agent without it answers none.
func (c *Client) StatDetails(ctx context.Context, path, user string) (FileInfo, error) {
	var fi FileInfo
	if err := c.roundTrip(ctx, Header{Op: OpStat, File: &FileRequest{Path: path, User: user, Details: true}}, &fi); err != nil {
		return FileInfo{}, err
	}
	if err := fi.checkDetails(); err != nil {
		return FileInfo{}, fmt.Errorf("control: malformed stat answer: %w", err)
	}
	return fi, nil
}

// Mkdir creates a directory as user; with parents it creates the missing parents too and
// an existing directory is not an error. mode 0 means 0755.
func (c *Client) Mkdir(ctx context.Context, path, user string, mode fs.FileMode, parents bool) error {
	return c.roundTrip(ctx, Header{Op: OpMkdir, File: &FileRequest{Path: path, User: user, Mode: uint32(mode.Perm()), MakeParents: parents}}, nil)
}

// Remove removes a file or an empty directory as user; with recursive, a directory and its
// contents.
func (c *Client) Remove(ctx context.Context, path, user string, recursive bool) error {
	return c.roundTrip(ctx, Header{Op: OpRemove, File: &FileRequest{Path: path, User: user, Recursive: recursive}}, nil)
}

// Stats reports the sandbox's resource usage.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	err := c.roundTrip(ctx, Header{Op: OpStats}, &s)
	return s, err
}

// Shutdown asks the agent to end the sandbox: it sends TERM to every process, waits up to
// grace, kills what is left, answers and exits. Workloads of running execs end with TERM or
// KILL. ctx should allow for grace plus a little.
func (c *Client) Shutdown(ctx context.Context, grace time.Duration) error {
	if grace < 0 {
		return fmt.Errorf("control: negative shutdown grace")
	}
	return c.roundTrip(ctx, Header{Op: OpShutdown, Shutdown: &ShutdownRequest{GraceMS: grace.Milliseconds()}}, nil)
}

// List returns the entries of the directory at path as user sees them, at most
// DefaultListLimit of them (a larger directory's listing is cut there).
func (c *Client) List(ctx context.Context, path, user string) ([]FileInfo, error) {
	infos, _, err := c.ListLimit(ctx, path, user, DefaultListLimit)
	return infos, err
}

// ListLimit returns at most limit (1 to MaxListLimit) entries of the directory at path as
// user sees them, and whether the directory has more. It never holds more than limit
// entries, whatever the agent sends: past the limit it stops reading and ends the stream.
func (c *Client) ListLimit(ctx context.Context, path, user string, limit int) (_ []FileInfo, truncated bool, _ error) {
	return c.list(ctx, FileRequest{Path: path, User: user, Limit: limit})
}

// ListDetails is ListLimit with each entry's details (see StatDetails).
func (c *Client) ListDetails(ctx context.Context, path, user string, limit int) (_ []FileInfo, truncated bool, _ error) {
	return c.list(ctx, FileRequest{Path: path, User: user, Limit: limit, Details: true})
}

func (c *Client) list(ctx context.Context, req FileRequest) (_ []FileInfo, truncated bool, _ error) {
	limit := req.Limit
	if limit < 1 || limit > MaxListLimit {
		return nil, false, fmt.Errorf("control: listing limit %d is not between 1 and %d", limit, MaxListLimit)
	}
	st, _, stop, err := c.open(ctx, Header{Op: OpList, File: &req})
	if err != nil {
		return nil, false, err
	}
	defer st.Close()
	defer stop()
	var out []FileInfo
	var buf []byte
	for {
		t, p, err := ReadFrame(st, buf)
		if err != nil {
			return nil, false, c.streamErr(ctx, err)
		}
		buf = p[:0]
		switch t {
		case FrameData:
			var full bool
			out, full, err = appendBatch(out, p, limit)
			if err != nil {
				return nil, false, err
			}
			if full {
				// More than asked for: an agent that ignores the limit. Closing the stream
				// (deferred) tells it to stop.
				return out, true, nil
			}
		case FrameEnd:
			var end ListEnd
			if len(p) > 0 {
				if err := json.Unmarshal(p, &end); err != nil {
					return nil, false, fmt.Errorf("control: malformed end of a listing: %w", err)
				}
			}
			return out, end.Truncated, nil
		case FrameError:
			return nil, false, decodeRemoteError(p)
		default:
			return nil, false, fmt.Errorf("control: unexpected %s frame answering list", t)
		}
	}
}

// appendBatch decodes a list batch (a JSON array of FileInfo) entry by entry onto out, and
// stops with full set at an entry beyond limit. Decoding entry by entry keeps a frame of tiny
// entries from making us hold more than limit of them; the name length check bounds what
// each one holds.
func appendBatch(out []FileInfo, p []byte, limit int) (_ []FileInfo, full bool, _ error) {
	dec := json.NewDecoder(bytes.NewReader(p))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, false, fmt.Errorf("control: malformed list batch")
	}
	for dec.More() {
		if len(out) == limit {
			return out, true, nil
		}
		var fi FileInfo
		if err := dec.Decode(&fi); err != nil {
			return nil, false, fmt.Errorf("control: malformed list batch: %w", err)
		}
		if len(fi.Name) > maxNameLen {
			return nil, false, fmt.Errorf("control: malformed list batch: a name of %d bytes", len(fi.Name))
		}
		if err := fi.checkDetails(); err != nil {
			return nil, false, fmt.Errorf("control: malformed list batch: %w", err)
		}
		out = append(out, fi)
	}
	if _, err := dec.Token(); err != nil {
		return nil, false, fmt.Errorf("control: malformed list batch: %w", err)
	}
	return out, false, nil
}

// ReadFile opens the file at path as user and streams its content, exactly size bytes: the
// size the file had when the agent opened it (or UnknownSize: a /proc or /sys file, read to
// its end). Errors the agent finds at opening (not found, a
// directory, permission) are returned here; ctx covers the whole read. The reader fails
// rather than end early if the file shrank while it was read. The caller must Close the
// reader, also to end the read early.
func (c *Client) ReadFile(ctx context.Context, path, user string) (_ io.ReadCloser, size int64, err error) {
	st, _, stop, err := c.open(ctx, Header{Op: OpRead, File: &FileRequest{Path: path, User: user}})
	if err != nil {
		return nil, 0, err
	}
	fr := &fileReader{c: c, ctx: ctx, st: st, stop: stop}
	defer func() {
		if err != nil {
			fr.Close()
		}
	}()
	t, p, err := ReadFrame(st, nil)
	if err != nil {
		return nil, 0, c.streamErr(ctx, err)
	}
	switch t {
	case FrameResult:
		var res ReadResult
		if err := json.Unmarshal(p, &res); err != nil || res.Size < UnknownSize {
			return nil, 0, fmt.Errorf("control: malformed read answer")
		}
		return fr, res.Size, nil
	case FrameError:
		return nil, 0, decodeRemoteError(p)
	}
	return nil, 0, fmt.Errorf("control: unexpected %s frame answering read", t)
}

type fileReader struct {
	c    *Client
	ctx  context.Context
	st   *yamux.Stream
	stop func() bool
	buf  []byte
	rest []byte
	err  error
	once sync.Once
}

// next reads one frame into rest, or sets err.
func (r *fileReader) next() error {
	t, p, err := ReadFrame(r.st, r.buf)
	if err != nil {
		r.err = r.c.streamErr(r.ctx, err)
		return r.err
	}
	r.buf = p[:0]
	switch t {
	case FrameData:
		r.rest = p
	case FrameEnd:
		r.err = io.EOF
	case FrameError:
		r.err = decodeRemoteError(p)
		return r.err
	default:
		r.err = fmt.Errorf("control: unexpected %s frame in a file read", t)
		return r.err
	}
	return nil
}

func (r *fileReader) Read(p []byte) (int, error) {
	for len(r.rest) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		_ = r.next() // sets r.err, read above
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

func (r *fileReader) Close() error {
	r.once.Do(func() {
		r.stop()
		r.st.Close()
	})
	return nil
}

// WriteRequest says where and how WriteFile stores a file.
type WriteRequest struct {
	Path string
	User string
	// Mode is the new file's permission bits; 0 means 0644.
	Mode fs.FileMode
	// MakeParents creates missing parent directories (mode 0755, owned by User).
	MakeParents bool
	// Metadata is the user metadata the new file gets (see FileRequest.Metadata); it needs
	// an agent that serves FeatureFileMeta.
	Metadata map[string]string
}

// WriteFile streams r into a file: the agent writes a temporary file next to the target and
// renames it into place only when everything arrived, so the path holds either the old or the
// complete new content. It returns the size written.
func (c *Client) WriteFile(ctx context.Context, req WriteRequest, r io.Reader) (int64, error) {
	if len(req.Metadata) > 0 && !slices.Contains(c.hello.Features, FeatureFileMeta) {
		return 0, errcode.New(errcode.NotImplemented,
			"The sandbox's agent (%s) stores no file metadata; restart the sandbox with this bothyd.", c.hello.AgentVersion)
	}
	st, fw, stop, err := c.open(ctx, Header{Op: OpWrite, File: &FileRequest{
		Path: req.Path, User: req.User, Mode: uint32(req.Mode.Perm()), MakeParents: req.MakeParents, Metadata: req.Metadata}})
	if err != nil {
		return 0, err
	}
	defer st.Close()
	defer stop()

	// The agent may refuse before it read everything (a permission error at open); then it
	// answers at once and stops reading, and our writes must not wait for window forever.
	type answer struct {
		t   FrameType
		p   []byte
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		t, p, err := ReadFrame(st, nil)
		if err == nil && t == FrameError {
			st.SetWriteDeadline(time.Now())
		}
		answered <- answer{t, p, err}
	}()

	buf := make([]byte, frameHeaderSize+chunkSize)
	var sendErr error
	for sendErr == nil {
		n, rerr := r.Read(buf[frameHeaderSize:])
		if n > 0 {
			if err := fw.writePrepared(FrameData, buf[:frameHeaderSize+n]); err != nil {
				sendErr = err
				break
			}
		}
		if rerr == io.EOF {
			sendErr = fw.write(FrameEnd, nil)
			break
		}
		if rerr != nil {
			// Closing without the end frame makes the agent discard the partial file.
			st.Close()
			st.SetReadDeadline(time.Now())
			<-answered
			return 0, fmt.Errorf("control: reading the data to write: %w", rerr)
		}
	}
	a := <-answered
	if a.err != nil {
		return 0, c.streamErr(ctx, a.err)
	}
	switch a.t {
	case FrameError:
		return 0, decodeRemoteError(a.p)
	case FrameResult:
		if sendErr != nil {
			return 0, c.streamErr(ctx, sendErr)
		}
		var wr WriteResult
		if err := json.Unmarshal(a.p, &wr); err != nil {
			return 0, fmt.Errorf("control: malformed write answer: %w", err)
		}
		return wr.Size, nil
	}
	return 0, fmt.Errorf("control: unexpected %s frame answering write", a.t)
}
