import assert from "node:assert/strict";
import { test } from "node:test";

import { client, cleanup, rejectsWithCode, removeSandbox, uniqueId } from "./live.js";

test("capture a template, clone it, lease, retire", async () => {
  const builder = uniqueId("builder");
  const name = uniqueId("tpl");
  const clone = uniqueId("clone");
  cleanup(() => client.deleteTemplate(name, { drain: true }));
  cleanup(() => removeSandbox(builder));
  cleanup(() => removeSandbox(clone));

  // Build: install something as root, then stop it (a stopped sandbox's capture freezes
  // nothing; a running one's is its own test below).
  await client.createSandbox({ id: builder, start: true });
  const built = await client.exec(builder, {
    user: "root",
    command: ["sh", "-c", "mkdir -p /opt/tool && echo 'tool v1' > /opt/tool/VERSION"],
  });
  assert.equal(built.exit_code, 0, built.stderr);

  const tpl = await client.createTemplate(name);
  assert.equal(tpl.name, name);
  assert.equal(tpl.generations, 0);
  await rejectsWithCode(client.createTemplate(name), "template-exists", 409);

  await client.stopSandbox(builder);
  await rejectsWithCode(client.captureGeneration(uniqueId("absent"), builder), "template-not-found", 404);
  const gen = await client.captureGeneration(name, builder);
  assert.equal(gen.template, name);
  assert.equal(gen.state, "active");
  assert.equal(gen.eligibility, "eligible");
  assert.equal(gen.leases, 0);

  const got = await client.getTemplate(name);
  assert.equal(got.generations, 1);
  assert.equal(got.latest, gen.id);
  assert.ok((await client.listTemplates()).items.some((t) => t.name === name));
  assert.deepEqual(
    (await client.listGenerations(name)).items.map((g) => g.id),
    [gen.id],
  );

  // Clone: the newest eligible generation, with the builder's files.
  const c = await client.createSandbox({ id: clone, template: name, start: true });
  assert.equal(c.state, "running");
  assert.equal(c.template?.template, name);
  assert.equal(c.template?.generation, gen.id);
  const r = await client.exec(clone, { command: ["cat", "/opt/tool/VERSION"] });
  assert.equal(r.stdout, "tool v1\n");

  const leases = await client.listLeases(name, gen.id);
  assert.deepEqual(
    leases.map((l) => l.sandbox),
    [clone],
  );
  assert.equal((await client.getGeneration(name, gen.id)).leases, 1);

  // Retire: refused while the clone leases it, then gone once it is deleted.
  await rejectsWithCode(client.retireGeneration(name, gen.id), "generation-leased", 423);
  const tomb = await client.tombstoneGeneration(name, gen.id);
  assert.equal(tomb.state, "tombstoned");
  await rejectsWithCode(client.createSandbox({ id: uniqueId("late"), template: name }), "template-ineligible", 409);

  await client.stopSandbox(clone);
  await client.deleteSandbox(clone);
  assert.equal(await client.retireGeneration(name, gen.id), "deleted");
  await rejectsWithCode(client.getGeneration(name, gen.id), "generation-not-found", 404);
  assert.equal(await client.deleteTemplate(name), "deleted");
  await rejectsWithCode(client.getTemplate(name), "template-not-found", 404);
});

test("a template with a leased generation drains", async () => {
  const builder = uniqueId("builder");
  const name = uniqueId("tpl");
  const clone = uniqueId("clone");
  cleanup(() => client.deleteTemplate(name, { drain: true }));
  cleanup(() => removeSandbox(builder));
  cleanup(() => removeSandbox(clone));

  await client.createSandbox({ id: builder, start: true });
  await client.stopSandbox(builder);
  await client.createTemplate(name);
  const gen = await client.captureGeneration(name, builder);
  await client.createSandbox({ id: clone, template: name, generation: gen.id });
  await rejectsWithCode(client.deleteTemplate(name), "generation-leased", 423);
  assert.equal(await client.deleteTemplate(name, { drain: true }), "draining");
  await client.deleteSandbox(clone);
  await rejectsWithCode(client.getTemplate(name), "template-not-found", 404);
});

test("a running sandbox's capture freezes it for the copy only, and it runs on", async () => {
  const runner = uniqueId("runner");
  const name = uniqueId("tpl");
  cleanup(() => client.deleteTemplate(name, { drain: true }));
  cleanup(() => removeSandbox(runner));
  await client.createSandbox({ id: runner, start: true });
  await client.createTemplate(name);
  const gen = await client.captureGeneration(name, runner);
  assert.equal(gen.state, "active");
  assert.equal(typeof gen.capture_pause_ms, "number");
  assert.ok((gen.capture_pause_ms ?? -1) >= 0);
  assert.equal((await client.getSandbox(runner)).state, "running");
});
