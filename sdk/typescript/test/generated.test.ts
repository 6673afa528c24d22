// The generated client alone, as a user of openapi-typescript and openapi-fetch gets it from
// openapi/openapi.yaml with no generator options but --enum-values: the main flows (create,
// exec, write and read a file, list a directory, a refusal typed as Problem) type-check
// without a cast and work against the live server. A request field with a default
// (`start`, `timeout_ms`, `wait_ms`) may be left out; tsc fails this file if the spec makes
// one required again, or gives an answer two shapes.

import assert from "node:assert/strict";
import { test } from "node:test";

import createClient from "openapi-fetch";

import type { components, paths } from "../src/schema.gen.js";
import { baseUrl, cleanup, token, uniqueId } from "./live.js";

type Problem = components["schemas"]["Problem"];

const headers: Record<string, string> = token === undefined ? {} : { Authorization: `Bearer ${token}` };
const api = createClient<paths>({ baseUrl, headers });

test("the generated client: create, exec, files, a directory and a Problem, without a cast", async () => {
  const id = uniqueId("gen");
  cleanup(async () => {
    await api.POST("/v1/sandboxes/{id}/stop", { params: { path: { id }, query: { force: true } } });
    await api.DELETE("/v1/sandboxes/{id}", { params: { path: { id } } });
  });

  // `start` has a default: the create without it type-checks, and makes a stopped sandbox.
  const created = await api.POST("/v1/sandboxes", { body: { id } });
  assert.equal(created.response.status, 201);
  assert.equal(created.data?.state, "provisioned");
  const started = await api.POST("/v1/sandboxes/{id}/start", { params: { path: { id } } });
  assert.equal(started.data?.state, "running");

  // `timeout_ms` and `wait_ms` have defaults: only the command is needed.
  const ran = await api.POST("/v1/sandboxes/{id}/exec", {
    params: { path: { id } },
    body: { command: ["sh", "-c", "echo out; exit 3"] },
  });
  assert.equal(ran.data?.exit_code, 3);
  assert.equal(ran.data?.stdout, "out\n");

  // The file body is the raw bytes, typed Blob (`format: binary`); openapi-fetch serializes
  // bodies as JSON unless told not to.
  const wrote = await api.PUT("/v1/sandboxes/{id}/files", {
    params: { path: { id }, query: { path: "/home/user/gen/hello.txt" } },
    body: new Blob(["hello from the generated client\n"]),
    bodySerializer: (body) => body,
    headers: { "Content-Type": "application/octet-stream" },
  });
  assert.equal(wrote.response.status, 204);

  // One media type for a file's 200: its data is the file, read as text here.
  const read = await api.GET("/v1/sandboxes/{id}/files", {
    params: { path: { id }, query: { path: "/home/user/gen/hello.txt" } },
    parseAs: "text",
  });
  assert.equal(read.data, "hello from the generated client\n");

  // A listing is an operation of its own, with one type: FileList.
  const listed = await api.GET("/v1/sandboxes/{id}/files/list", {
    params: { path: { id }, query: { path: "/home/user/gen" } },
  });
  assert.deepEqual(
    listed.data?.items.map((e) => [e.name, e.type, e.size]),
    [["hello.txt", "file", 32]],
  );

  // A refusal's error is typed as the contract's Problem.
  const missing = await api.GET("/v1/sandboxes/{id}", { params: { path: { id: uniqueId("none") } } });
  const problem: Problem | undefined = missing.error;
  assert.equal(missing.response.status, 404);
  assert.equal(problem?.code, "sandbox-not-found");
  assert.equal(problem?.status, 404);
  assert.match(problem?.detail ?? "", /./);
});
