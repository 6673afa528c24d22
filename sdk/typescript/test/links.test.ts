import assert from "node:assert/strict";
import { test } from "node:test";

import { cleanup, client, rejectsWithCode, removeSandbox, uniqueId } from "./live.js";

test("port links are made, listed without their tokens, and revoked", async () => {
  const id = uniqueId("lnk");
  cleanup(() => removeSandbox(id));
  await client.createSandbox({ id });
  assert.deepEqual(await client.listPortLinks(id), []);

  const a = await client.createPortLink(id, 8000, 600);
  const b = await client.createPortLink(id, 8001);
  assert.equal(a.path, `/p/${a.token}/`);
  assert.equal(Date.parse(b.expires_at) - Date.parse(b.created_at), 3600 * 1000);

  const port = await client.listPortLinks(id, 8000);
  assert.deepEqual(port.map((l) => l.id), [a.id]);
  const all = await client.listPortLinks(id);
  assert.deepEqual(all.map((l) => l.id).sort(), [a.id, b.id].sort());
  const text = JSON.stringify(all);
  assert.ok(!text.includes(a.token) && !text.includes(b.token), "a list holds a token");

  await client.revokePortLink(id, 8000, a.id);
  assert.deepEqual((await client.listPortLinks(id)).map((l) => l.id), [b.id]);
  await rejectsWithCode(client.revokePortLink(id, 8000, a.id), "link-not-found", 404);
  await rejectsWithCode(client.listPortLinks(uniqueId("none")), "sandbox-not-found", 404);
});
