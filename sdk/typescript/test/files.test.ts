import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { before, test } from "node:test";

import { client, rejectsWithCode, startedSandbox } from "./live.js";

let id = "";
before(async () => {
  id = await startedSandbox("files");
});

test("a text file in and out, and seen by a command", async () => {
  await client.writeFile(id, "/home/user/dir/hello.txt", "hello from the SDK\n");
  assert.equal(await client.readFileText(id, "/home/user/dir/hello.txt"), "hello from the SDK\n");
  const r = await client.exec(id, { command: ["cat", "/home/user/dir/hello.txt"] });
  assert.equal(r.stdout, "hello from the SDK\n");
});

test("every byte value survives the round trip", async () => {
  const bytes = new Uint8Array(256 * 4).map((_, i) => i % 256);
  await client.writeFile(id, "/tmp/bytes.bin", bytes);
  assert.deepEqual(await client.readFileBytes(id, "/tmp/bytes.bin"), bytes);
});

test("a file written by a command is read back", async () => {
  await client.exec(id, { command: ["sh", "-c", "printf 'made inside' > /tmp/inside.txt"] });
  assert.equal(await client.readFileText(id, "/tmp/inside.txt"), "made inside");
});

test("an empty file is empty", async () => {
  await client.writeFile(id, "/tmp/empty", new Uint8Array(0));
  assert.equal((await client.readFileBytes(id, "/tmp/empty")).length, 0);
});

test("streams both ways: a generated upload and a streamed download of 8 MiB", async () => {
  const chunk = 1 << 20;
  const chunks = 8;
  const up = createHash("sha256");
  async function* generate(): AsyncGenerator<Uint8Array> {
    for (let i = 0; i < chunks; i++) {
      const b = new Uint8Array(chunk).map((_, j) => (i * 31 + j) % 251);
      up.update(b);
      yield b;
    }
  }
  await client.writeFile(id, "/tmp/big.bin", generate());
  const r = await client.exec(id, { command: ["sh", "-c", "wc -c < /tmp/big.bin"] });
  assert.equal(r.stdout.trim(), String(chunk * chunks));

  const down = createHash("sha256");
  let n = 0;
  let pieces = 0;
  for await (const c of await client.readFile(id, "/tmp/big.bin")) {
    down.update(c);
    n += c.length;
    pieces++;
  }
  assert.equal(n, chunk * chunks);
  assert.ok(pieces > 1, "the download arrives in pieces, not whole");
  assert.equal(down.digest("hex"), up.digest("hex"));
});

test("a directory lists its entries", async () => {
  await client.writeFile(id, "/tmp/listing/a.txt", "aaa");
  await client.exec(id, { command: ["mkdir", "-p", "/tmp/listing/sub"] });
  const entries = await client.listFiles(id, "/tmp/listing");
  const byName = new Map(entries.map((e) => [e.name, e]));
  assert.equal(byName.get("a.txt")?.type, "file");
  assert.equal(byName.get("a.txt")?.size, 3);
  assert.equal(byName.get("sub")?.type, "directory");
});

test("a removed file is gone, and reading it is file-not-found", async () => {
  await client.writeFile(id, "/tmp/doomed", "x");
  await client.removeFile(id, "/tmp/doomed");
  await rejectsWithCode(client.readFileText(id, "/tmp/doomed"), "file-not-found", 404);
  await rejectsWithCode(client.removeFile(id, "/tmp/doomed"), "file-not-found", 404);
});

test("the sandbox's files refuse with codes of their own, naming the path", async () => {
  // A request the contract takes, refused by what the sandbox holds: never invalid-request.
  const dir = await rejectsWithCode(client.readFileText(id, "/tmp"), "is-a-directory", 409);
  assert.equal(dir.field, "path");
  await rejectsWithCode(client.readFileText(id, "/root/.profile"), "permission-denied", 403);
  await rejectsWithCode(client.listFiles(id, "/etc/passwd"), "not-a-directory", 409);
  await client.writeFile(id, "/tmp/full/f", "x");
  await rejectsWithCode(client.removeFile(id, "/tmp/full"), "directory-not-empty", 409);
  await rejectsWithCode(client.readFileText(id, `/tmp/${"n".repeat(300)}`), "name-too-long", 422);
});
