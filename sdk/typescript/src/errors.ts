// Errors of the SDK. Every refusal from bothyd is an application/problem+json body with a
// stable code; BothyError carries that code so that callers switch on it, never on the
// message. A failure to reach the server at all is a ConnectionError.

import { knownErrorCodes } from "./codes.gen.js";
import { isRecord, numberField, oneOf, parseJSON, stringField } from "./guards.js";
import type { ErrorCode, Problem } from "./types.js";

/**
 * The generic code of an HTTP status, for an answer whose body is not a problem (a proxy's
 * error page, say) or whose code this SDK does not know: the contract tells clients to treat
 * an unknown code by its status.
 */
function codeOfStatus(status: number): ErrorCode {
  switch (status) {
    case 400:
      return "invalid-request";
    case 401:
      return "unauthorized";
    case 403:
      return "forbidden";
    case 404:
      return "not-found";
    case 405:
      return "method-not-allowed";
    case 413:
      return "payload-too-large";
    case 501:
      return "not-implemented";
    case 503:
      return "unavailable";
    default:
      return "internal";
  }
}

/** An error answered by bothyd: the problem's code, status and detail. */
export class BothyError extends Error {
  override readonly name = "BothyError";
  /** The stable error code; switch on it. */
  readonly code: ErrorCode;
  /**
   * The code as the server sent it. It differs from code only when the server sent one that
   * this SDK does not know (a newer server); code is then the generic code of the status.
   */
  readonly rawCode: string;
  /** The HTTP status, or 0 for a failure reported in a websocket close frame. */
  readonly status: number;
  /** What went wrong and what to do next, in a sentence. */
  readonly detail: string;
  /**
   * For invalid-request, the request field at fault; for a refusal of the sandbox's files
   * (permission-denied, is-a-directory, ...), the field whose path was refused (path, cwd).
   */
  readonly field: string | undefined;
  /** The server's request id; quote it when reporting a problem. */
  readonly requestId: string | undefined;

  constructor(init: {
    code: ErrorCode;
    rawCode?: string;
    status: number;
    detail: string;
    field?: string | undefined;
    requestId?: string | undefined;
  }) {
    super(`${init.detail} (${init.rawCode ?? init.code}${init.status > 0 ? `, HTTP ${init.status}` : ""})`);
    this.code = init.code;
    this.rawCode = init.rawCode ?? init.code;
    this.status = init.status;
    this.detail = init.detail;
    this.field = init.field;
    this.requestId = init.requestId;
  }

  /** The error as a problem object, as the server would have sent it. */
  toProblem(): Problem {
    const p: Problem = {
      type: `urn:bothyd:problem:${this.code}`,
      title: this.status > 0 ? String(this.status) : "websocket",
      status: this.status,
      detail: this.detail,
      code: this.code,
    };
    if (this.field !== undefined) p.field = this.field;
    if (this.requestId !== undefined) p.request_id = this.requestId;
    return p;
  }
}

/** bothyd could not be reached: it is not running, or baseUrl is wrong. */
export class ConnectionError extends Error {
  override readonly name = "ConnectionError";
  readonly url: string;

  constructor(url: string, cause: unknown) {
    const why = cause instanceof Error ? cause.message : String(cause);
    super(`Cannot reach bothyd at ${url} (${why}); is it running, and is baseUrl right?`, { cause });
    this.url = url;
  }
}

/**
 * Whether err is a BothyError, and with code when one is given:
 * `if (isBothyError(err, "sandbox-busy")) retry()`.
 */
export function isBothyError(err: unknown, code?: ErrorCode): err is BothyError {
  return err instanceof BothyError && (code === undefined || err.code === code);
}

/** The BothyError for a refused HTTP answer whose body (already read) is body. */
export function problemError(response: Response, body: unknown): BothyError {
  const requestId = response.headers.get("X-Request-Id") ?? undefined;
  const problem = typeof body === "string" ? parseJSON(body) : body;
  if (!isRecord(problem)) {
    return new BothyError({
      code: codeOfStatus(response.status),
      status: response.status,
      detail: `bothyd answered HTTP ${response.status} ${response.statusText} without a problem body.`,
      requestId,
    });
  }
  const raw = stringField(problem, "code");
  return new BothyError({
    code: oneOf(knownErrorCodes, raw) ?? codeOfStatus(response.status),
    rawCode: raw ?? codeOfStatus(response.status),
    status: numberField(problem, "status") ?? response.status,
    detail: stringField(problem, "detail") ?? `bothyd answered HTTP ${response.status}.`,
    field: stringField(problem, "field"),
    requestId: stringField(problem, "request_id") ?? requestId,
  });
}

/** The BothyError for a websocket closed with a code other than 1000. */
export function closeError(closeCode: number, reason: string): BothyError {
  const code = oneOf(knownErrorCodes, reason);
  return new BothyError({
    code: code ?? "internal",
    rawCode: reason === "" ? "internal" : reason,
    status: 0,
    detail: `The exec stream closed with code ${closeCode}${reason === "" ? "" : ` (${reason})`} before the command's exit was reported.`,
  });
}
