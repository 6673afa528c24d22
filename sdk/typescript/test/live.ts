// What the live tests share: a client for the bothyd that scripts/test-live.sh started
// (BOTHY_URL, BOTHY_TOKEN), unique ids, cleanup, and an assertion on error codes.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after } from "node:test";

import { Bothy, BothyError, type ErrorCode } from "../src/index.js";

const url = process.env["BOTHY_URL"];
if (url === undefined || url === "") {
  throw new Error("BOTHY_URL is not set: run these tests through scripts/test-live.sh, which starts a bothyd.");
}
export const baseUrl: string = url;
export const token: string | undefined = process.env["BOTHY_TOKEN"] || undefined;

export const client = new Bothy({ baseUrl, token });

/** A fresh id with a prefix that says which test made it. */
export function uniqueId(prefix: string): string {
  return `${prefix}-${randomBytes(4).toString("hex")}`;
}

const cleanups: Array<() => Promise<unknown>> = [];

/** Runs fn after the file's tests, last registered first; its failure is ignored (best effort). */
export function cleanup(fn: () => Promise<unknown>): void {
  cleanups.push(fn);
}

after(async () => {
  for (const fn of cleanups.reverse()) {
    await fn().catch(() => undefined);
  }
});

/** Removes a sandbox whatever its state, for cleanup. */
export async function removeSandbox(id: string): Promise<void> {
  await client.stopSandbox(id, { force: true }).catch(() => undefined);
  await client.deleteSandbox(id);
}

/** Creates a started sandbox that is removed after the file's tests. */
export async function startedSandbox(prefix: string): Promise<string> {
  const id = uniqueId(prefix);
  cleanup(() => removeSandbox(id));
  const sb = await client.createSandbox({ id, start: true });
  assert.equal(sb.state, "running");
  return id;
}

/** Asserts that p rejects with a BothyError of code (and status), and returns it. */
export async function rejectsWithCode(p: Promise<unknown>, code: ErrorCode, status?: number): Promise<BothyError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof BothyError, `want a BothyError with code ${code}, got ${String(err)}`);
    assert.equal(err.code, code, `want code ${code}, got ${err.code}: ${err.message}`);
    if (status !== undefined) assert.equal(err.status, status);
    assert.ok(err.detail.length > 0, "the problem has a detail");
    return err;
  }
  assert.fail(`want a rejection with code ${code}, but it succeeded`);
}
