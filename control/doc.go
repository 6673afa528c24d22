// Package control is the control protocol between bothyd and the agent inside a sandbox, both
// ends of it: [Dial] and [Client] for bothyd, [Serve] and [Handler] for the agent. It knows
// frames, streams and messages, and nothing of processes or files: the agent package does the
// work behind Handler. Any io.ReadWriteCloser carries it (a microVM's virtio serial port as
// well as a unix socket): it needs no unix-socket feature. One is used where both ends have it:
// over a unix socket, bothyd passes an exec's stdout pipe to the agent ([FeatureStdoutPipe]),
// and without it everything works the same, only with stdout in frames. It is shared by both
// sides and imports no host-side package of bothyd.
// docs/design.md says where it sits between the supervisor and the agent.
//
// # Session
//
// One connection carries one hashicorp/yamux session. The client (bothyd) opens every
// stream; the agent never does. Each stream is one operation. Per-stream flow control is
// yamux's window (1 MiB): a side that stops reading stops the other side's writes, so neither
// end buffers more than a window per stream, however much a workload prints. Keepalives find
// a peer that vanished without closing the connection: every 15 s each end pings, and a ping
// unanswered for 15 s ends the session. The client's keepalive is its own (Client.keepalive,
// not yamux's), because a paused sandbox's agent is frozen and answers nothing until it is
// thawed: while the check given with Client.SetFrozenCheck says the agent is frozen, the
// client does not ping, so the session, and every exec running through it, outlives a
// pause of any length.
//
// # Frames
//
// Inside a stream everything is framed:
//
//	+--------+----------------------+-------------------+
//	| type   | length (big-endian)  | payload           |
//	| 1 byte | 4 bytes              | length bytes      |
//	+--------+----------------------+-------------------+
//
// A payload is at most [MaxFramePayload] (1 MiB); a reader refuses a larger length, or an
// unknown type, before reading the payload and drops the stream. The types ([FrameType]) are:
// header, result, error, started and exit, resize and signal (JSON payloads); stdin, stdout,
// stderr and data (raw bytes; data is JSON for list); eof and end (empty).
//
// # Operations
//
// The first frame of every stream is a header: JSON {"op": ..., plus the request of that
// op}. After the header:
//
//   - hello ({protocol, capability}): must be the first stream of a connection. The agent
//     compares the capability in constant time and, if it is wrong or if any other operation
//     comes first, closes the whole session without a word. It answers a result
//     {protocol, features, agent_version}, or an error protocol-mismatch.
//   - exec ([ExecRequest]; an absent umask means [DefaultUmask]): the agent answers started
//     {pid} (or error: the workload did not start), then stdout/stderr frames, and last exit
//     ([ExitStatus]) or error. With stdout_pipe ([FeatureStdoutPipe]) the workload's stdout is
//     the pipe passed with the request and only stderr comes in frames. The client may
//     send stdin frames (if it asked for stdin), eof (stdin closed), resize and signal at any
//     time before the exit.
//   - read: a result {size} (of the file as opened), exactly size bytes in data frames, then
//     end; or error (before the result, or part way: the file shrank or could not be read).
//     A file that grows while it is read is read up to the size it had when opened. A size
//     of -1 (a /proc or /sys file) means data frames until the file's end.
//   - write ({path, mode, make_parents}): the client sends data frames, then end; the agent
//     answers a result {size} or an error. The agent may answer an error early and stop
//     reading; the client stops sending then.
//   - list ({limit}; 0 means [DefaultListLimit]): data frames each holding a JSON array of
//     [FileInfo], no more than limit entries in all, then end, whose payload is empty or a
//     JSON [ListEnd] ({"truncated": true} when the directory has more than limit entries);
//     or error. [Serve] enforces the limit whatever the [Handler] emits, and the client stops
//     reading at it whatever the agent sends, so neither side holds more.
//   - stat, mkdir, remove, stats, shutdown ({grace_ms}): one result (or error).
//   - file details (feature "file-meta", [FeatureFileMeta]): with details set, stat and list
//     answer each entry's owner and group (named from the sandbox's /etc/passwd and
//     /etc/group), a symlink's target and its user metadata; a write's metadata is stored
//     with the new file as [MetadataXattrPrefix] extended attributes, bounded by
//     [ValidateMetadata] both ways; a watch's refuse_network refuses a network or FUSE file
//     system. An agent without the feature ignores these fields.
//   - dial ({port}; feature "dial"): the agent connects to 127.0.0.1:port in the sandbox's
//     network namespace and answers a result {} or an error (port-refused: nothing listens).
//     After the result the stream carries raw bytes both ways, unframed: what the client
//     writes goes to the service, what the service sends comes back. The service's end of
//     its output is the agent's close of its side; the client's close of its side ends the
//     connection to the service whole (a client that closed reads nothing more). The
//     address is fixed: dial reaches the sandbox's own services, never another host.
//   - watch ([WatchRequest]; feature "watch"): see [OpWatch].
//   - proc-start, proc-attach, proc-list, proc-input ([ProcRequest]; feature "procs"): the
//     tracked processes, which outlive their client and its connection; see [OpProcStart].
//   - network ([NetworkRequest] {address, gateway}; feature "network"): a microVM guest's
//     agent gives its eth0 the address and routes through the gateway; one result (or
//     error). A namespace sandbox's agent does not serve it (its eth0 is configured from the
//     host).
//
// Errors are [RemoteError] {code, message}; the client returns them wrapped in an
// [*errcode.Error] (file-not-found is [errcode.FileNotFound], a refused request is
// [errcode.InvalidRequest]), so callers switch with errors.Is. Internal failures of the agent
// reach the client as "internal" with a generic message; details stay in the agent's log.
//
// # Who closes what
//
// The agent writes the final frame of an operation (exit, end, result or error) and then
// closes its side. The client closes its side after it read the final frame. Closing is a
// half-close (a yamux FIN), so each side still reads what the other sent before it.
//
// The client must not close its side before the final frame unless it gives up on the
// operation: the agent reads any close (or stray frame, or the session's end) before the
// final frame as "the client is gone". For exec that is the protocol's rule:
//
//	A stream closed by the client before the exit frame, or a connection that ends, kills the
//	workload (its process group; with a tty its whole session). Nothing survives its client.
//
// So a caller that wants a workload to outlive a dropped websocket must keep the exec's stream
// open itself; [Process.Close] and [Client.Close] are the ways to kill. For read, list and the
// other one-shot operations the same rule cancels the operation; for write, a stream that
// ends before the end frame leaves no file behind.
//
// Stdin is the one place where the agent's reading of a stream waits for the workload: it
// queues at most a few stdin frames the workload has not read, then stops reading the
// stream until it does. Resize, signal and close frames sent behind unread stdin wait with
// it; the timeout and the connection's end still kill the workload. A resize sent while stdin
// is open is handed over in its place among the stdin bytes ([ExecStream.OnResize]), so a
// command typed after a resize runs at the new size.
//
// After answering shutdown the agent ends the session; [Serve] returns [ErrShutdown] and the
// agent exits, which ends the sandbox.
//
// # Versions
//
// [ProtocolVersion] names this protocol exactly; there is no negotiation. It is part of a
// sandbox's runtime identity, so a bothyd never drives an agent of another version.
// Unknown JSON fields are ignored, unknown frame types are not. Features announce operations
// added without a new version (dial, [FeatureDial]): an agent announces those its Handler
// serves, and a client uses such an operation only with an agent that announced it, so an
// agent without one still serves everything in [RequiredFeatures].
package control
