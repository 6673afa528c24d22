import assert from "node:assert/strict";
import { test } from "node:test";

import { cleanup, client, rejectsWithCode, removeSandbox, uniqueId } from "./live.js";

test("a volume shared by two sandboxes, its files through the API, and its in-use delete refused", async () => {
  const name = uniqueId("vol");
  const v = await client.createVolume(name, 32);
  assert.equal(v.size_mb, 32);
  cleanup(() => client.deleteVolume(name));
  const a = uniqueId("vol-a");
  const b = uniqueId("vol-b");
  cleanup(() => removeSandbox(a));
  cleanup(() => removeSandbox(b));
  await client.createSandbox({ id: a, start: true, volumes: [{ name, path: "/data" }] });
  await client.createSandbox({ id: b, start: true, volumes: [{ name, path: "/mnt/v", read_only: true }] });
  await client.exec(a, { command: ["sh", "-c", "echo from-a > /data/a"] });
  const r = await client.exec(b, { command: ["cat", "/mnt/v/a"] });
  assert.equal(r.stdout, "from-a\n");

  const e = await client.writeVolumeFile(name, "/dir/api.txt", "from the API\n");
  assert.equal(e.uid, 1000);
  assert.equal(e.type, "file");
  const r2 = await client.exec(b, { command: ["cat", "/mnt/v/dir/api.txt"] });
  assert.equal(r2.stdout, "from the API\n");
  const names = (await client.listVolumeFiles(name, "/")).map((x) => x.name).sort();
  assert.deepEqual(names.filter((n) => n !== "lost+found"), ["a", "dir"]);
  assert.equal(new TextDecoder().decode(await bytes(await client.readVolumeFile(name, "/a"))), "from-a\n");

  const err = await rejectsWithCode(client.deleteVolume(name), "volume-in-use", 423);
  assert.match(err.detail, new RegExp(a));
  assert.equal((await client.getVolume(name)).sandboxes.length, 2);
  await client.removeVolumeFile(name, "/dir", { recursive: true });
  await rejectsWithCode(client.writeVolumeFile(name, "/big", new Uint8Array(48 << 20)), "volume-full", 507);
});

async function bytes(s: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  for await (const c of s) parts.push(c);
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
