// The exec websocket, GET /v1/sandboxes/{id}/exec/stream, as an object: an async iterator of
// output chunks, sendStdin/closeStdin, resize, kill, and the exit as a promise.
//
// Frames (see the contract): binary frames carry data with a first byte naming the stream
// (0 stdin, 1 stdout, 2 stderr); text frames carry one JSON control message each (resize,
// signal and eof from the client; exit from the server, followed by a normal close).

import type { IncomingMessage } from "node:http";
import WebSocket from "ws";

import { ConnectionError, BothyError, closeError, problemError } from "./errors.js";
import { isRecord, numberField, parseJSON, stringField } from "./guards.js";

const streamStdin = 0;
const streamStdout = 1;
const streamStderr = 2;

/**
 * While more than this many output bytes wait for a reader that is iterating, the socket is
 * paused, so that a fast command and a slow consumer do not fill memory: the server then
 * stops reading the command's output, and the command blocks on its pipe, as in a terminal.
 */
const highWaterMark = 1 << 20;

/** One piece of a command's output. */
export interface OutputChunk {
  stream: "stdout" | "stderr";
  data: Uint8Array;
}

/** How a streamed command ended: the server's exit message. */
export interface ExecExit {
  /** The exit status, or -1 when a signal ended the command. */
  exitCode: number;
  /** The signal that ended the command, when one did (for example SIGKILL). */
  signal: string | null;
  /** The command was killed at its timeout_ms. */
  timedOut: boolean;
}

/** The query of an exec stream beyond its command. */
export interface ExecStreamOptions {
  /** Environment variables as KEY=VALUE, added to the sandbox's. */
  env?: string[];
  /** The working directory, an absolute path inside the sandbox. */
  cwd?: string;
  /** A user name or numeric uid inside the sandbox. */
  user?: string;
  /** The command's umask in octal, as the shell writes it ("0077"); the server's default is "0022". */
  umask?: string;
  /** Run the command on a pseudo-terminal (all output then arrives on stdout). */
  tty?: boolean;
  rows?: number;
  cols?: number;
  /** Kill the command after this many milliseconds. */
  timeoutMs?: number;
  /** How long to wait for another exec on the sandbox to end. */
  waitMs?: number;
}

/** A command's whole output and exit, from {@link ExecStream.collect}. */
export interface CollectedOutput {
  stdout: string;
  stderr: string;
  exit: ExecExit;
}

function parseExit(v: unknown): ExecExit | undefined {
  if (!isRecord(v) || v["type"] !== "exit") return undefined;
  const exitCode = numberField(v, "exit_code");
  if (exitCode === undefined) return undefined;
  return {
    exitCode,
    signal: stringField(v, "signal") ?? null,
    timedOut: v["timed_out"] === true,
  };
}

/** A promise with its settle functions, as Promise.withResolvers (Node 22) gives. */
function deferred<T>(): { promise: Promise<T>; resolve: (v: T) => void; reject: (e: Error) => void } {
  let resolve: (v: T) => void = () => undefined;
  let reject: (e: Error) => void = () => undefined;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

function toBuffer(data: WebSocket.RawData): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data);
}

/** Reads an HTTP response body that refused the upgrade. */
function readBody(res: IncomingMessage): Promise<string> {
  return new Promise((resolve) => {
    const parts: Buffer[] = [];
    res.on("data", (b: Buffer) => parts.push(b));
    res.on("end", () => resolve(Buffer.concat(parts).toString("utf8")));
    res.on("error", () => resolve(Buffer.concat(parts).toString("utf8")));
  });
}

function headersOf(res: IncomingMessage): Headers {
  const h = new Headers();
  for (const [k, v] of Object.entries(res.headers)) {
    if (typeof v === "string") h.set(k, v);
    else if (Array.isArray(v)) for (const x of v) h.append(k, x);
  }
  return h;
}

/**
 * A running command over the exec websocket. Get one from {@link Bothy.execStream}, which
 * resolves once the server admitted the command (or rejects with the refusal's
 * {@link BothyError}, for example `not-running` or `sandbox-busy`).
 *
 * Iterate it for the output; `exit` resolves when the command has ended and all its output
 * was received. The output is buffered for a reader that has not started iterating, so
 * `await stream.exit` alone is safe for a command of modest output.
 *
 * Dropping the connection ({@link ExecStream.close}) kills the command, as a terminal's
 * hang-up would.
 */
export class ExecStream implements AsyncIterable<OutputChunk> {
  /** Resolves with the command's exit; rejects if the stream ended without one. */
  readonly exit: Promise<ExecExit>;

  readonly #ws: WebSocket;
  readonly #origin: string;
  readonly #queue: OutputChunk[] = [];
  #queued = 0;
  #paused = false;
  #iterating = false;
  #done = false;
  #failure: Error | undefined;
  #wake: (() => void) | undefined;
  readonly #exitSettle = deferred<ExecExit>();
  #exit: ExecExit | undefined;

  private constructor(ws: WebSocket, origin: string) {
    this.#ws = ws;
    this.#origin = origin;
    this.exit = this.#exitSettle.promise;
    // A caller that only iterates must not see an unhandled rejection of exit; the failure
    // reaches it through the iterator instead.
    this.exit.catch(() => undefined);
    ws.on("message", (data, isBinary) => this.#onMessage(toBuffer(data), isBinary));
    ws.on("close", (code, reason) => this.#onClose(code, reason.toString("utf8")));
    ws.on("error", (err) => this.#fail(err));
  }

  /**
   * Opens the websocket at url and resolves once the server has upgraded it. A refusal before
   * the upgrade rejects with the problem's BothyError.
   */
  static open(url: URL, headers: Record<string, string>, origin: string): Promise<ExecStream> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, { headers, perMessageDeflate: false });
      let settled = false;
      ws.once("unexpected-response", (_req, res) => {
        settled = true;
        void readBody(res).then((body) => {
          reject(problemError(new Response(null, { status: res.statusCode ?? 500, headers: headersOf(res) }), body));
          ws.terminate();
        });
      });
      ws.once("error", (err) => {
        if (!settled) {
          settled = true;
          reject(new ConnectionError(origin, err));
        }
      });
      ws.once("open", () => {
        settled = true;
        resolve(new ExecStream(ws, origin));
      });
    });
  }

  /** Writes to the command's standard input. */
  sendStdin(data: string | Uint8Array): void {
    const payload = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    const frame = Buffer.allocUnsafe(payload.length + 1);
    frame[0] = streamStdin;
    frame.set(payload, 1);
    this.#ws.send(frame, { binary: true });
  }

  /** Closes the command's standard input (it reads end of file). */
  closeStdin(): void {
    this.#control({ type: "eof" });
  }

  /** Resizes the command's terminal (tty only). */
  resize(rows: number, cols: number): void {
    this.#control({ type: "resize", rows, cols });
  }

  /** Sends the command a signal, by name (default SIGKILL). */
  kill(signal = "SIGKILL"): void {
    this.#control({ type: "signal", signal });
  }

  /** Drops the connection; the server kills the command. */
  close(): void {
    this.#ws.close(1000);
  }

  /** Reads all the output as UTF-8 text, and the exit. */
  async collect(): Promise<CollectedOutput> {
    const decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    const text = { stdout: "", stderr: "" };
    for await (const chunk of this) {
      text[chunk.stream] += decoders[chunk.stream].decode(chunk.data, { stream: true });
    }
    text.stdout += decoders.stdout.decode();
    text.stderr += decoders.stderr.decode();
    return { ...text, exit: await this.exit };
  }

  async *[Symbol.asyncIterator](): AsyncIterator<OutputChunk> {
    this.#iterating = true;
    for (;;) {
      const chunk = this.#queue.shift();
      if (chunk !== undefined) {
        this.#queued -= chunk.data.length;
        if (this.#paused && this.#queued <= highWaterMark / 2) {
          this.#paused = false;
          this.#ws.resume();
        }
        yield chunk;
        continue;
      }
      if (this.#done) {
        if (this.#failure !== undefined) throw this.#failure;
        return;
      }
      await new Promise<void>((resolve) => {
        this.#wake = resolve;
      });
    }
  }

  #control(msg: Record<string, string | number>): void {
    this.#ws.send(JSON.stringify(msg));
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  #onMessage(data: Buffer, isBinary: boolean): void {
    if (!isBinary) {
      const exit = parseExit(parseJSON(data.toString("utf8")));
      if (exit !== undefined) this.#exit = exit;
      return;
    }
    if (data.length === 0) return;
    const stream = data[0] === streamStdout ? "stdout" : data[0] === streamStderr ? "stderr" : undefined;
    if (stream === undefined) return;
    const payload = data.subarray(1);
    this.#queue.push({ stream, data: payload });
    this.#queued += payload.length;
    if (this.#iterating && !this.#paused && this.#queued > highWaterMark) {
      this.#paused = true;
      this.#ws.pause();
    }
    this.#notify();
  }

  #onClose(code: number, reason: string): void {
    if (this.#exit !== undefined) {
      this.#done = true;
      this.#exitSettle.resolve(this.#exit);
      this.#notify();
      return;
    }
    this.#fail(closeError(code, reason));
  }

  #fail(err: Error): void {
    if (this.#done) return;
    this.#done = true;
    this.#failure = err instanceof BothyError || err instanceof ConnectionError ? err : new ConnectionError(this.#origin, err);
    this.#exitSettle.reject(this.#failure);
    this.#notify();
  }
}
