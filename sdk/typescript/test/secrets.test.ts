import assert from "node:assert/strict";
import { test } from "node:test";

import { cleanup, client, rejectsWithCode, removeSandbox, uniqueId } from "./live.js";

test("a secret is created, listed, bound by a sandbox that sees only its placeholder, rotated and deleted, and never shown", async () => {
  const name = `SDK_${uniqueId("key").replace("-", "_").toUpperCase()}`;
  const value = "sk-sdk-5e1f0c2a9b8d7e6f5a4b3c2d1e0f9a8b";
  const rotated = "sk-sdk-rotated-0a1b2c3d4e5f60718293";
  const created = await client.createSecret(name, value);
  cleanup(() => client.deleteSecret(name));
  assert.equal(created.name, name);
  assert.deepEqual(created.bindings, []);
  assert.equal(created.rotated_at, undefined);
  assert.ok(!JSON.stringify(created).includes(value), "the create's answer holds the value");
  await rejectsWithCode(client.createSecret(name, value), "secret-exists", 409);

  const id = uniqueId("sec");
  cleanup(() => removeSandbox(id));
  await client.createSandbox({
    id,
    start: true,
    network: { allow: ["api.example.com"], secrets: { [name]: { hosts: ["api.example.com"] } } },
  });
  const env = await client.exec(id, { command: ["env"] });
  const placeholder = env.stdout.split("\n").find((l) => l.startsWith(`BOTHY_SECRET_${name}=`));
  assert.match(placeholder ?? "", /=bothy-secret-[0-9a-f]{32}$/);
  assert.ok(!env.stdout.includes(value), "the sandbox's environment holds the value");

  const listed = (await client.listSecrets()).find((s) => s.name === name);
  assert.deepEqual(listed?.bindings, [{ sandbox: id, hosts: ["api.example.com"] }]);
  const err = await rejectsWithCode(client.deleteSecret(name), "secret-in-use", 409);
  assert.match(err.detail, new RegExp(id));

  const after = await client.rotateSecret(name, rotated);
  assert.equal(after.name, name);
  assert.ok(after.rotated_at !== undefined, "a rotation sets rotated_at");
  const shown = await client.getSecret(name);
  assert.equal(shown.rotated_at, after.rotated_at);
  for (const s of [after, shown, listed]) {
    const text = JSON.stringify(s);
    assert.ok(!text.includes(value) && !text.includes(rotated), "an answer holds a value");
  }

  await removeSandbox(id);
  await client.deleteSecret(name);
  await rejectsWithCode(client.getSecret(name), "secret-not-found", 404);
});
