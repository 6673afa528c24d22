// Drives a live sandboxd with the unmodified E2B JS SDK (docs/e2b.md). run.sh sets
// E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL to the server; nothing here patches the SDK.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Sandbox, CommandExitError } from 'e2b';

const metadata = { suite: 'e2b-compat', run: String(process.pid) };

test('create, run, files, timeout, list, kill', { timeout: 180_000 }, async () => {
  const sbx = await Sandbox.create({ metadata, timeoutMs: 120_000 });
  try {
    assert.match(sbx.sandboxId, /^[a-z0-9]+$/);

    const hi = await sbx.commands.run('echo hi');
    assert.equal(hi.exitCode, 0);
    assert.equal(hi.stdout, 'hi\n');

    const env = await sbx.commands.run('echo "$GREETING"', { envs: { GREETING: 'hello' } });
    assert.equal(env.stdout, 'hello\n');

    await assert.rejects(sbx.commands.run('exit 3'), (err) => err instanceof CommandExitError && err.exitCode === 3);

    // Two commands at once: E2B processes take no exec lock.
    const bg = await sbx.commands.run('sleep 30', { background: true });
    const listed = await sbx.commands.list();
    assert.ok(listed.some((p) => p.pid === bg.pid), 'the background command is listed');
    const while_ = await sbx.commands.run('echo beside');
    assert.equal(while_.stdout, 'beside\n');
    assert.equal(await sbx.commands.kill(bg.pid), true);

    await sbx.files.write('/tmp/e2b/hello.txt', 'hello file');
    assert.equal(await sbx.files.read('/tmp/e2b/hello.txt'), 'hello file');
    assert.equal(await sbx.files.exists('/tmp/e2b/hello.txt'), true);
    const entries = await sbx.files.list('/tmp/e2b');
    assert.deepEqual(entries.map((e) => e.name), ['hello.txt']);
    assert.equal(await sbx.files.makeDir('/tmp/e2b/sub'), true);
    assert.equal(await sbx.files.makeDir('/tmp/e2b/sub'), false);
    await sbx.files.rename('/tmp/e2b/hello.txt', '/tmp/e2b/sub/moved.txt');
    assert.equal(await sbx.files.read('/tmp/e2b/sub/moved.txt'), 'hello file');
    await sbx.files.remove('/tmp/e2b/sub');
    assert.equal(await sbx.files.exists('/tmp/e2b/sub'), false);

    await sbx.setTimeout(60_000);
    const info = await sbx.getInfo();
    assert.equal(info.sandboxId, sbx.sandboxId);
    assert.deepEqual(info.metadata, metadata);
    assert.ok(info.endAt.getTime() - Date.now() > 30_000, 'setTimeout moved the end');

    // Re-attach to a background command by pid, and feed it stdin.
    const cat = await sbx.commands.run('cat', { background: true, stdin: true });
    const again = await sbx.commands.connect(cat.pid);
    await sbx.commands.sendStdin(cat.pid, 'through stdin\n');
    await sbx.commands.closeStdin(cat.pid);
    const catDone = await again.wait();
    assert.equal(catDone.stdout, 'through stdin\n');

    assert.equal(await sbx.pause(), true);
    assert.equal((await sbx.getInfo()).state, 'paused');
    const back = await Sandbox.connect(sbx.sandboxId);
    assert.equal((await back.commands.run('echo back')).stdout, 'back\n');

    const page = await Sandbox.list({ query: { metadata } }).nextItems();
    assert.deepEqual(page.map((s) => s.sandboxId), [sbx.sandboxId]);
  } finally {
    assert.equal(await sbx.kill(), true);
  }
  assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'a second kill finds nothing');
});

test('25 sandboxes in parallel', { timeout: 300_000 }, async () => {
  const ids = await Promise.all(Array.from({ length: 25 }, async (_, i) => {
    const sbx = await Sandbox.create({ metadata: { suite: 'e2b-parallel' } });
    try {
      const r = await sbx.commands.run(`echo ${i}`);
      assert.equal(r.stdout, `${i}\n`);
      return sbx.sandboxId;
    } finally {
      await sbx.kill();
    }
  }));
  assert.equal(new Set(ids).size, 25);
});
