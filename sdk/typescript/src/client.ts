// The client: the generated openapi-fetch client for every operation of the contract, and
// methods over it that return the answer or throw a BothyError, plus what a generator does
// not do well: the exec websocket, file streams, the event stream and waiting for a state.

import createClient, { type Client } from "openapi-fetch";

import { ConnectionError, BothyError, problemError } from "./errors.js";
import { parseEvent, parseServerSentEvents } from "./events.js";
import { ExecStream, type ExecStreamOptions } from "./exec.js";
import { isRecord, numberField, oneOf, stringField } from "./guards.js";
import type { paths } from "./schema.gen.js";
import type {
  Checkpoint,
  CheckpointList,
  CreateSandboxRequest,
  ForkRequest,
  ForkResult,
  Event,
  ExecRequest,
  ExecResult,
  FileEntry,
  Generation,
  GenerationList,
  Info,
  Lease,
  Node,
  NodePatch,
  PortLink,
  PortLinkInfo,
  Sandbox,
  SandboxList,
  Secret,
  SandboxMetrics,
  SandboxState,
  Template,
  TemplateList,
  Volume,
  VolumeFileEntry,
} from "./types.js";

/** How to reach bothyd. */
export interface BothyOptions {
  /** The server's address, for example http://127.0.0.1:7780. */
  baseUrl: string;
  /**
   * The API token, if the server has one (the contents of its --token-file). It is sent as
   * `Authorization: Bearer`, on the websocket and the event stream too: a Node client can set
   * headers there, so the token need not go into a URL as `access_token`.
   */
  token?: string | undefined;
}

/** Bounds of a lifecycle transition. */
export interface TransitionOptions {
  /** How long the server waits for other transitions' locks and for this one, in ms. */
  timeoutMs?: number;
}

/** What a file write accepts: bytes, text, or a stream of bytes (a Node Readable is one). */
export type FileBody = string | Uint8Array | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

/** How a retirement ended: gone now, or tombstoned and draining until its last lease goes. */
export type Retirement = "deleted" | "draining";

/** Options of {@link Bothy.waitForState}. */
export interface WaitOptions {
  /** Give up after this many milliseconds (default 60000) with a {@link WaitTimeoutError}. */
  timeoutMs?: number;
  /** Give up when this signal aborts, with its reason. */
  signal?: AbortSignal;
}

/** Options of {@link Bothy.subscribe}. */
export interface SubscribeOptions {
  /** Start after this event id (the `seq` of the last event seen): the server replays what came since. */
  lastEventId?: string;
  /** Ends the subscription. */
  signal?: AbortSignal;
  /**
   * Called after the stream was lost and opened again. Events the server could not replay
   * (it keeps the last 1024; a restarted server none of the old ones) are missed, so a
   * consumer that tracks state should read it again here.
   */
  onReconnect?: () => void;
}

/** The sandbox did not reach the state in time. */
export class WaitTimeoutError extends Error {
  override readonly name = "WaitTimeoutError";
  /** The sandbox's state when the wait gave up. */
  readonly lastState: SandboxState;

  constructor(id: string, want: readonly SandboxState[], lastState: SandboxState, timeoutMs: number) {
    super(`Sandbox ${id} did not reach ${want.join(" or ")} within ${timeoutMs} ms; it is ${lastState}.`);
    this.lastState = lastState;
  }
}

/** A live subscription to /v1/events; iterate it, and close it when done. */
export interface EventSubscription extends AsyncIterable<Event> {
  close(): void;
}

/** The result shape of every openapi-fetch call. */
type FetchResult<D, E> = { data: D; error?: never; response: Response } | { data?: never; error: E; response: Response };

/**
 * A bothyd client. Methods return the answer's body and throw a {@link BothyError} for
 * every refusal (switch on its `code`) and a {@link ConnectionError} when bothyd cannot be
 * reached. `api` is the generated client itself, for anything not wrapped here.
 */
export class Bothy {
  /** The generated openapi-fetch client, typed by openapi/openapi.yaml. */
  readonly api: Client<paths>;
  readonly #base: URL;
  readonly #headers: Record<string, string>;

  constructor(options: BothyOptions) {
    this.#base = new URL(options.baseUrl);
    this.#headers = options.token === undefined ? {} : { Authorization: `Bearer ${options.token}` };
    this.api = createClient<paths>({ baseUrl: this.#base.origin + this.#base.pathname.replace(/\/+$/, ""), headers: this.#headers });
  }

  // ---- helpers -------------------------------------------------------------------------------

  /** Awaits an openapi-fetch call: its data, or the BothyError of its refusal. */
  async #call<D, E>(p: Promise<FetchResult<D, E>>): Promise<NonNullable<D>> {
    let r: FetchResult<D, E>;
    try {
      r = await p;
    } catch (err) {
      throw this.#connectionError(err);
    }
    // openapi-fetch leaves data undefined for an error and for an empty body; every caller
    // of #call expects a body, so both are refusals here.
    if (r.error === undefined && r.response.ok && r.data !== undefined && r.data !== null) return r.data;
    throw problemError(r.response, r.error);
  }

  /** As #call, for answers without a body; returns the status. */
  async #callEmpty<D, E>(p: Promise<FetchResult<D, E>>): Promise<number> {
    let r: FetchResult<D, E>;
    try {
      r = await p;
    } catch (err) {
      throw this.#connectionError(err);
    }
    if (r.error !== undefined || !r.response.ok) throw problemError(r.response, r.error);
    return r.response.status;
  }

  #connectionError(err: unknown): Error {
    if (err instanceof BothyError || err instanceof ConnectionError) return err;
    if (err instanceof Error && err.name === "AbortError") return err;
    return new ConnectionError(this.#base.origin, err);
  }

  #url(path: string, query: Record<string, string | string[] | number | boolean | undefined> = {}): URL {
    const u = new URL(this.#base.pathname.replace(/\/+$/, "") + path, this.#base);
    for (const [k, v] of Object.entries(query)) {
      if (v === undefined) continue;
      for (const x of Array.isArray(v) ? v : [v]) u.searchParams.append(k, String(x));
    }
    return u;
  }

  /** A plain fetch with the token, whose refusal throws its BothyError. */
  async #fetch(url: URL, init: RequestInit): Promise<Response> {
    let res: Response;
    try {
      res = await fetch(url, { ...init, headers: { ...this.#headers, ...init.headers } });
    } catch (err) {
      throw this.#connectionError(err);
    }
    if (!res.ok) throw problemError(res, await res.text());
    return res;
  }

  // ---- sandboxes -----------------------------------------------------------------------------

  /** Creates a sandbox (and starts it, with `start: true`). */
  createSandbox(req: CreateSandboxRequest = {}, opts: TransitionOptions = {}): Promise<Sandbox> {
    return this.#call(this.api.POST("/v1/sandboxes", { params: { query: { timeout: opts.timeoutMs } }, body: req }));
  }

  getSandbox(id: string): Promise<Sandbox> {
    return this.#call(this.api.GET("/v1/sandboxes/{id}", { params: { path: { id } } }));
  }

  /** One page of sandboxes; `labels` are `key=value` selectors that must all match. */
  listSandboxes(
    filter: { state?: SandboxState; labels?: string[]; cursor?: string; limit?: number } = {},
  ): Promise<SandboxList> {
    return this.#call(
      this.api.GET("/v1/sandboxes", {
        params: { query: { state: filter.state, label: filter.labels, cursor: filter.cursor, limit: filter.limit } },
      }),
    );
  }

  startSandbox(id: string, opts: TransitionOptions = {}): Promise<Sandbox> {
    return this.#call(
      this.api.POST("/v1/sandboxes/{id}/start", { params: { path: { id }, query: { timeout: opts.timeoutMs } } }),
    );
  }

  /** Stops a running sandbox; `force` kills it instead of a clean shutdown. */
  stopSandbox(id: string, opts: TransitionOptions & { force?: boolean } = {}): Promise<Sandbox> {
    return this.#call(
      this.api.POST("/v1/sandboxes/{id}/stop", {
        params: { path: { id }, query: { timeout: opts.timeoutMs, force: opts.force } },
      }),
    );
  }

  /** What a running sandbox uses now, with the server's recent samples of it. */
  sandboxMetrics(id: string): Promise<SandboxMetrics> {
    return this.#call(this.api.GET("/v1/sandboxes/{id}/metrics", { params: { path: { id } } }));
  }

  /** Deletes a stopped sandbox (a running one is refused with `sandbox-launched`). */
  async deleteSandbox(id: string, opts: TransitionOptions = {}): Promise<void> {
    await this.#callEmpty(
      this.api.DELETE("/v1/sandboxes/{id}", { params: { path: { id }, query: { timeout: opts.timeoutMs } } }),
    );
  }

  /** The console log of the sandbox's current or last run. */
  async logs(id: string, opts: { tail?: number } = {}): Promise<string> {
    // A plain fetch: openapi-fetch answers an empty body as no data, and an empty log is "".
    const res = await this.#fetch(this.#url(`/v1/sandboxes/${encodeURIComponent(id)}/logs`, { tail: opts.tail }), {
      method: "GET",
    });
    return res.text();
  }

  // ---- exec ----------------------------------------------------------------------------------

  /** Runs a command and answers when it ends, with its captured output. */
  exec(id: string, req: ExecRequest): Promise<ExecResult> {
    return this.#call(this.api.POST("/v1/sandboxes/{id}/exec", { params: { path: { id } }, body: req }));
  }

  /**
   * Runs a command with live input and output over the exec websocket. Resolves once the
   * server admitted it; a refusal (`not-running`, `sandbox-busy`, ...) rejects with its
   * BothyError.
   */
  execStream(id: string, command: string[], opts: ExecStreamOptions = {}): Promise<ExecStream> {
    const u = this.#url(`/v1/sandboxes/${encodeURIComponent(id)}/exec/stream`, {
      command,
      env: opts.env,
      cwd: opts.cwd,
      user: opts.user,
      umask: opts.umask,
      tty: opts.tty,
      rows: opts.rows,
      cols: opts.cols,
      timeout_ms: opts.timeoutMs,
      wait_ms: opts.waitMs,
    });
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    return ExecStream.open(u, this.#headers, this.#base.origin);
  }

  // ---- files ---------------------------------------------------------------------------------

  /**
   * A file's bytes as a stream, read as the server sends them. A caller that stops reading
   * early cancels the stream, which closes the connection.
   */
  async readFile(id: string, path: string, opts: { signal?: AbortSignal } = {}): Promise<ReadableStream<Uint8Array>> {
    const init: RequestInit = { method: "GET" };
    if (opts.signal !== undefined) init.signal = opts.signal;
    const res = await this.#fetch(this.#url(`/v1/sandboxes/${encodeURIComponent(id)}/files`, { path }), init);
    return res.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
  }

  /** A file's bytes, whole. */
  async readFileBytes(id: string, path: string): Promise<Uint8Array> {
    const chunks: Uint8Array[] = [];
    let size = 0;
    for await (const chunk of await this.readFile(id, path)) {
      chunks.push(chunk);
      size += chunk.length;
    }
    const out = new Uint8Array(size);
    let at = 0;
    for (const c of chunks) {
      out.set(c, at);
      at += c.length;
    }
    return out;
  }

  /** A file's content as UTF-8 text. */
  async readFileText(id: string, path: string): Promise<string> {
    return new TextDecoder().decode(await this.readFileBytes(id, path));
  }

  /**
   * Creates or replaces a file with body, streamed to the server (a stream is sent as it is
   * read, never held whole). Missing parent directories are created.
   */
  async writeFile(id: string, path: string, body: FileBody): Promise<void> {
    const init: RequestInit = {
      method: "PUT",
      headers: { "Content-Type": "application/octet-stream" },
      body,
    };
    // A streamed request body needs half-duplex in fetch; bytes and text do not.
    if (typeof body !== "string" && !(body instanceof Uint8Array) && !(body instanceof Blob)) init.duplex = "half";
    const res = await this.#fetch(this.#url(`/v1/sandboxes/${encodeURIComponent(id)}/files`, { path }), init);
    await res.body?.cancel();
  }

  /** A directory's entries. */
  async listFiles(id: string, path: string): Promise<FileEntry[]> {
    const list = await this.#call(this.api.GET("/v1/sandboxes/{id}/files/list", { params: { path: { id }, query: { path } } }));
    return list.items;
  }

  /** Removes a file or an empty directory. */
  async removeFile(id: string, path: string): Promise<void> {
    await this.#callEmpty(this.api.DELETE("/v1/sandboxes/{id}/files", { params: { path: { id }, query: { path } } }));
  }

  // ---- volumes --------------------------------------------------------------------------------

  /** Makes a volume of sizeMb MiB (default 1024) that sandboxes mount with `volumes` on create. */
  createVolume(name: string, sizeMb?: number): Promise<Volume> {
    const body: { name: string; size_mb?: number } = { name };
    if (sizeMb !== undefined) body.size_mb = sizeMb;
    return this.#call(this.api.POST("/v1/volumes", { body }));
  }

  getVolume(name: string): Promise<Volume> {
    return this.#call(this.api.GET("/v1/volumes/{name}", { params: { path: { name } } }));
  }

  /** Lists every volume by name, following the pages to the end. */
  async listVolumes(): Promise<Volume[]> {
    const all: Volume[] = [];
    let cursor: string | undefined;
    do {
      const page = await this.#call(this.api.GET("/v1/volumes", { params: { query: { cursor, limit: 1000 } } }));
      all.push(...page.items);
      cursor = page.next_cursor;
    } while (cursor);
    return all;
  }

  /** Deletes a volume and its files; one that sandboxes mount is refused with volume-in-use. */
  async deleteVolume(name: string): Promise<void> {
    await this.#callEmpty(this.api.DELETE("/v1/volumes/{name}", { params: { path: { name } } }));
  }

  /** A volume's file as a stream, read as the server sends it. */
  async readVolumeFile(name: string, path: string, opts: { signal?: AbortSignal } = {}): Promise<ReadableStream<Uint8Array>> {
    const init: RequestInit = { method: "GET" };
    if (opts.signal !== undefined) init.signal = opts.signal;
    const res = await this.#fetch(this.#url(`/v1/volumes/${encodeURIComponent(name)}/files`, { path }), init);
    return res.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
  }

  /** Creates or replaces a volume's file with body, streamed; a volume that fills answers volume-full. */
  async writeVolumeFile(name: string, path: string, body: FileBody): Promise<VolumeFileEntry> {
    const init: RequestInit = {
      method: "PUT",
      headers: { "Content-Type": "application/octet-stream" },
      body,
    };
    if (typeof body !== "string" && !(body instanceof Uint8Array) && !(body instanceof Blob)) init.duplex = "half";
    const res = await this.#fetch(this.#url(`/v1/volumes/${encodeURIComponent(name)}/files`, { path }), init);
    return volumeFileEntry(await res.json());
  }

  async listVolumeFiles(name: string, path: string): Promise<VolumeFileEntry[]> {
    const list = await this.#call(this.api.GET("/v1/volumes/{name}/files/list", { params: { path: { name }, query: { path } } }));
    return list.items;
  }

  makeVolumeDir(name: string, path: string): Promise<VolumeFileEntry> {
    return this.#call(this.api.POST("/v1/volumes/{name}/files/mkdir", { params: { path: { name }, query: { path } } }));
  }

  async removeVolumeFile(name: string, path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.#callEmpty(
      this.api.DELETE("/v1/volumes/{name}/files", { params: { path: { name }, query: { path, recursive: opts.recursive } } }),
    );
  }

  // ---- secrets --------------------------------------------------------------------------------

  /**
   * Stores a secret (docs/secrets.md). The value is write-only: no answer returns it. A sandbox's
   * network policy binds the secret to hosts (`network.secrets`); the sandbox sees only a
   * placeholder in `BOTHY_SECRET_<NAME>`, and bothyd's egress proxy puts the value in its place
   * on HTTPS requests to those hosts. A name in use is refused with secret-exists.
   */
  createSecret(name: string, value: string): Promise<Secret> {
    return this.#call(this.api.POST("/v1/secrets", { body: { name, value } }));
  }

  /** A secret's name, times and bindings; never its value. */
  getSecret(name: string): Promise<Secret> {
    return this.#call(this.api.GET("/v1/secrets/{secret}", { params: { path: { secret: name } } }));
  }

  /**
   * Every secret by name (byte order: upper case first), with the sandboxes and hosts that bind
   * it, following the pages to the end; never a value.
   */
  async listSecrets(): Promise<Secret[]> {
    const all: Secret[] = [];
    let cursor: string | undefined;
    do {
      const page = await this.#call(this.api.GET("/v1/secrets", { params: { query: { cursor, limit: 1000 } } }));
      all.push(...page.items);
      cursor = page.next_cursor;
    } while (cursor);
    return all;
  }

  /**
   * Replaces a secret's value. Its name, and so every sandbox's placeholder, stays; the egress
   * proxy sends the new value from the next request on.
   */
  rotateSecret(name: string, value: string): Promise<Secret> {
    return this.#call(this.api.POST("/v1/secrets/{secret}/rotate", { params: { path: { secret: name } }, body: { value } }));
  }

  /** Deletes a secret; one that a sandbox's network policy binds is refused with secret-in-use. */
  async deleteSecret(name: string): Promise<void> {
    await this.#callEmpty(this.api.DELETE("/v1/secrets/{secret}", { params: { path: { secret: name } } }));
  }

  // ---- nodes (a cluster router only) ----------------------------------------------------------

  /**
   * The cluster's nodes, in name order, as its router sees them: lease, health, cordon and
   * drain, capacity and what is free (docs/cluster.md). A single bothyd is no cluster and
   * refuses with not-a-cluster (501); `info().cluster` says which one this is.
   */
  async listNodes(): Promise<Node[]> {
    const list = await this.#call(this.api.GET("/v1/nodes", {}));
    return list.items;
  }

  /** One node of the cluster; a name none has is refused with node-not-found. */
  getNode(name: string): Promise<Node> {
    return this.#call(this.api.GET("/v1/nodes/{name}", { params: { path: { name } } }));
  }

  /**
   * Writes a node's cordon and drain (the fields given; `drain_deadline: null` clears the
   * deadline) and returns the node after the change.
   */
  patchNode(name: string, patch: NodePatch): Promise<Node> {
    return this.#call(this.api.PATCH("/v1/nodes/{name}", { params: { path: { name } }, body: patch }));
  }

  /** Cordons a node: placement puts nothing new on it; it keeps serving its own sandboxes. */
  cordonNode(name: string): Promise<Node> {
    return this.patchNode(name, { cordoned: true });
  }

  /** Uncordons a node: placement may put sandboxes on it again. */
  uncordonNode(name: string): Promise<Node> {
    return this.patchNode(name, { cordoned: false });
  }

  // ---- port links -----------------------------------------------------------------------------

  /**
   * Makes a link that opens the sandbox's port to whoever holds it, without the API token, for
   * `ttlS` seconds (the server's default, an hour, when omitted). Its token and `path` are in
   * this answer alone: no list shows them again.
   */
  createPortLink(id: string, port: number, ttlS?: number): Promise<PortLink> {
    return this.#call(
      this.api.POST("/v1/sandboxes/{id}/ports/{port}/links", {
        params: { path: { id, port } },
        body: ttlS === undefined ? {} : { ttl_s: ttlS },
      }),
    );
  }

  /** The live links of the sandbox's port, or of all its ports when `port` is omitted; oldest first, without tokens. */
  async listPortLinks(id: string, port?: number): Promise<PortLinkInfo[]> {
    const list =
      port === undefined
        ? await this.#call(this.api.GET("/v1/sandboxes/{id}/links", { params: { path: { id } } }))
        : await this.#call(this.api.GET("/v1/sandboxes/{id}/ports/{port}/links", { params: { path: { id, port } } }));
    return list.items;
  }

  /** Revokes a link: its URL stops working at once (link-not-found when it is not live). */
  async revokePortLink(id: string, port: number, link: string): Promise<void> {
    await this.#callEmpty(this.api.DELETE("/v1/sandboxes/{id}/ports/{port}/links/{link}", { params: { path: { id, port, link } } }));
  }

  // ---- checkpoints, rollback and fork --------------------------------------------------------

  /** Takes a named checkpoint of the sandbox's files (a running sandbox is frozen for it). */
  createCheckpoint(id: string, name: string, opts: TransitionOptions = {}): Promise<Checkpoint> {
    return this.#call(
      this.api.POST("/v1/sandboxes/{id}/checkpoints", {
        params: { path: { id }, query: { timeout: opts.timeoutMs } },
        body: { name },
      }),
    );
  }

  /** The sandbox's checkpoints, oldest first, each with its size. */
  listCheckpoints(id: string): Promise<CheckpointList> {
    return this.#call(this.api.GET("/v1/sandboxes/{id}/checkpoints", { params: { path: { id } } }));
  }

  getCheckpoint(id: string, name: string): Promise<Checkpoint> {
    return this.#call(this.api.GET("/v1/sandboxes/{id}/checkpoints/{name}", { params: { path: { id, name } } }));
  }

  async deleteCheckpoint(id: string, name: string): Promise<void> {
    await this.#callEmpty(
      this.api.DELETE("/v1/sandboxes/{id}/checkpoints/{name}", { params: { path: { id, name } } }),
    );
  }

  /** Rolls the sandbox's files back to the checkpoint, in place; a running sandbox is restarted. */
  rollback(id: string, name: string, opts: TransitionOptions = {}): Promise<Sandbox> {
    return this.#call(
      this.api.POST("/v1/sandboxes/{id}/checkpoints/{name}/rollback", {
        params: { path: { id, name }, query: { timeout: opts.timeoutMs } },
      }),
    );
  }

  /** Forks the sandbox into new ones that run on from its files; each item succeeds or fails alone. */
  forkSandbox(id: string, req: ForkRequest, opts: TransitionOptions = {}): Promise<ForkResult> {
    return this.#call(
      this.api.POST("/v1/sandboxes/{id}/fork", {
        params: { path: { id }, query: { timeout: opts.timeoutMs } },
        body: req,
      }),
    );
  }

  // ---- templates and generations -------------------------------------------------------------

  createTemplate(name: string): Promise<Template> {
    return this.#call(this.api.POST("/v1/templates", { body: { name } }));
  }

  getTemplate(name: string): Promise<Template> {
    return this.#call(this.api.GET("/v1/templates/{name}", { params: { path: { name } } }));
  }

  listTemplates(page: { cursor?: string; limit?: number } = {}): Promise<TemplateList> {
    return this.#call(this.api.GET("/v1/templates", { params: { query: { cursor: page.cursor, limit: page.limit } } }));
  }

  /** Deletes a template and retires its generations; with `drain`, finishes when the last clone goes. */
  async deleteTemplate(name: string, opts: TransitionOptions & { drain?: boolean } = {}): Promise<Retirement> {
    const status = await this.#callEmpty(
      this.api.DELETE("/v1/templates/{name}", {
        params: { path: { name }, query: { drain: opts.drain, timeout: opts.timeoutMs } },
      }),
    );
    return status === 202 ? "draining" : "deleted";
  }

  /** Captures a stopped sandbox as a new generation of the template. */
  captureGeneration(template: string, sandbox: string, opts: TransitionOptions = {}): Promise<Generation> {
    return this.#call(
      this.api.POST("/v1/templates/{name}/generations", {
        params: { path: { name: template }, query: { timeout: opts.timeoutMs } },
        body: { sandbox },
      }),
    );
  }

  listGenerations(template: string, page: { cursor?: string; limit?: number } = {}): Promise<GenerationList> {
    return this.#call(
      this.api.GET("/v1/templates/{name}/generations", {
        params: { path: { name: template }, query: { cursor: page.cursor, limit: page.limit } },
      }),
    );
  }

  getGeneration(template: string, generation: string): Promise<Generation> {
    return this.#call(
      this.api.GET("/v1/templates/{name}/generations/{gen}", { params: { path: { name: template, gen: generation } } }),
    );
  }

  tombstoneGeneration(template: string, generation: string, opts: TransitionOptions = {}): Promise<Generation> {
    return this.#call(
      this.api.POST("/v1/templates/{name}/generations/{gen}/tombstone", {
        params: { path: { name: template, gen: generation }, query: { timeout: opts.timeoutMs } },
      }),
    );
  }

  async retireGeneration(
    template: string,
    generation: string,
    opts: TransitionOptions & { drain?: boolean } = {},
  ): Promise<Retirement> {
    const status = await this.#callEmpty(
      this.api.DELETE("/v1/templates/{name}/generations/{gen}", {
        params: { path: { name: template, gen: generation }, query: { drain: opts.drain, timeout: opts.timeoutMs } },
      }),
    );
    return status === 202 ? "draining" : "deleted";
  }

  async listLeases(template: string, generation: string): Promise<Lease[]> {
    const list = await this.#call(
      this.api.GET("/v1/templates/{name}/generations/{gen}/leases", {
        params: { path: { name: template, gen: generation } },
      }),
    );
    return list.items;
  }

  // ---- system --------------------------------------------------------------------------------

  info(): Promise<Info> {
    return this.#call(this.api.GET("/v1/info"));
  }

  /**
   * Subscribes to the event stream. Resolves once the server has subscribed this client, so
   * that every event after the call resolves is seen. When the stream is lost (the server
   * drops a subscriber that falls behind, or restarts) it is opened again with Last-Event-ID;
   * `onReconnect` says so. Iteration ends when `close` is called or the signal aborts.
   */
  async subscribe(opts: SubscribeOptions = {}): Promise<EventSubscription> {
    const ac = new AbortController();
    const onAbort = (): void => ac.abort(opts.signal?.reason);
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    if (opts.signal?.aborted === true) onAbort();
    let lastId = opts.lastEventId;
    const open = async (): Promise<ReadableStream<Uint8Array>> => {
      const headers: Record<string, string> = { Accept: "text/event-stream" };
      if (lastId !== undefined) headers["Last-Event-ID"] = lastId;
      const res = await this.#fetch(this.#url("/v1/events"), { method: "GET", headers, signal: ac.signal });
      if (res.body === null) throw new ConnectionError(this.#base.origin, "the event stream has no body");
      return res.body;
    };
    let body = await open();
    const close = (): void => {
      opts.signal?.removeEventListener("abort", onAbort);
      ac.abort();
    };
    async function* iterate(): AsyncGenerator<Event> {
      try {
        for (;;) {
          try {
            for await (const m of parseServerSentEvents(body)) {
              if (m.id !== undefined) lastId = m.id;
              const e = parseEvent(m.data);
              if (e !== undefined) yield e;
            }
          } catch (err) {
            if (ac.signal.aborted) return;
            throw err;
          }
          if (ac.signal.aborted) return;
          try {
            body = await open();
          } catch (err) {
            if (ac.signal.aborted) return;
            throw err;
          }
          opts.onReconnect?.();
        }
      } finally {
        close();
      }
    }
    const events = iterate();
    return { [Symbol.asyncIterator]: () => events, close };
  }

  /**
   * Waits until the sandbox is in one of the states, and answers it then. It follows the event
   * stream (subscribing before it reads the sandbox, so no change is missed in between), and
   * reads the sandbox again whenever an event names it in a wanted state. A sandbox deleted
   * meanwhile rejects with `sandbox-not-found`; running out of time with a WaitTimeoutError.
   */
  async waitForState(id: string, states: SandboxState | readonly SandboxState[], opts: WaitOptions = {}): Promise<Sandbox> {
    const want: readonly SandboxState[] = typeof states === "string" ? [states] : states;
    const timeoutMs = opts.timeoutMs ?? 60_000;
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), timeoutMs);
    const onAbort = (): void => ac.abort();
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    let last: Sandbox | undefined;
    const give = (): Error => {
      if (opts.signal?.aborted === true) {
        const reason: unknown = opts.signal.reason;
        return reason instanceof Error ? reason : new Error(String(reason));
      }
      return new WaitTimeoutError(id, want, last?.state ?? "provisioned", timeoutMs);
    };
    if (opts.signal?.aborted === true) throw give();
    // A lost and reopened stream may have missed the change: the reconnection wakes the loop
    // below to read the sandbox again, without waiting for an unrelated event.
    let reconnected = deferred();
    let sub: EventSubscription | undefined;
    try {
      sub = await this.subscribe({ signal: ac.signal, onReconnect: () => reconnected.resolve() });
      last = await this.getSandbox(id);
      if (want.includes(last.state)) return last;
      const events = sub[Symbol.asyncIterator]();
      let next = events.next();
      for (;;) {
        const woke = await Promise.race([next, reconnected.promise]);
        if (woke === undefined) {
          reconnected = deferred();
        } else if (woke.done === true) {
          break;
        } else {
          next = events.next();
          const e = woke.value;
          if (e.sandbox !== id) continue;
          if (e.type === "sandbox.deleted") {
            throw new BothyError({
              code: "sandbox-not-found",
              status: 404,
              detail: `Sandbox ${id} was deleted while waiting for it to be ${want.join(" or ")}.`,
            });
          }
          if (e.state === undefined || !want.includes(e.state)) continue;
        }
        last = await this.getSandbox(id);
        if (want.includes(last.state)) return last;
      }
      throw give();
    } catch (err) {
      if (ac.signal.aborted && !(err instanceof BothyError)) throw give();
      throw err;
    } finally {
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
      sub?.close();
    }
  }
}

/** A promise of nothing with its resolve function, as Promise.withResolvers (Node 22) gives. */
function deferred(): { promise: Promise<undefined>; resolve: () => void } {
  let resolve: () => void = () => undefined;
  const promise = new Promise<undefined>((res) => {
    resolve = () => res(undefined);
  });
  return { promise, resolve };
}

const volumeFileTypes: ReadonlyArray<VolumeFileEntry["type"]> = ["file", "directory", "symlink", "other"];

/** The VolumeFileEntry the server answered a write with, checked field by field. */
function volumeFileEntry(v: unknown): VolumeFileEntry {
  if (!isRecord(v)) throw new Error("bothyd: the answer to a volume write is not an object");
  const type = oneOf(volumeFileTypes, v["type"]);
  const entry: VolumeFileEntry = {
    name: stringField(v, "name") ?? "",
    path: stringField(v, "path") ?? "",
    type: type ?? "other",
    size: numberField(v, "size") ?? 0,
    mode: stringField(v, "mode") ?? "",
    uid: numberField(v, "uid") ?? 0,
    gid: numberField(v, "gid") ?? 0,
    modified_at: stringField(v, "modified_at") ?? "",
  };
  const target = stringField(v, "target");
  if (target !== undefined) entry.target = target;
  return entry;
}
