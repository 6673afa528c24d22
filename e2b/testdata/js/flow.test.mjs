// Drives a live bothyd with the unmodified E2B JS SDK (docs/e2b.md). run.sh sets
// E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL and E2B_VOLUME_API_URL to the server; nothing here
// patches the SDK.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { Sandbox, Secret, CommandExitError, InvalidArgumentError, SandboxError, TimeoutError, Volume } from 'e2b';

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
    await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1000 }), TimeoutError);

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

    // File metadata (envd 0.6.2), stored with the file; owner and group as the sandbox's own
    // /etc/passwd and /etc/group name them.
    const meta = { author: 'ada', purpose: 'e2b flow' };
    const written = await sbx.files.write('/tmp/e2b/meta.txt', 'with metadata', { metadata: meta });
    assert.deepEqual(written.metadata, meta);
    const [owner, group] = (await sbx.commands.run('id -un; id -gn')).stdout.trim().split('\n');
    const metaInfo = await sbx.files.getInfo('/tmp/e2b/meta.txt');
    assert.deepEqual(metaInfo.metadata, meta);
    assert.equal(metaInfo.owner, owner);
    assert.equal(metaInfo.group, group);
    const listedMeta = (await sbx.files.list('/tmp/e2b')).find((e) => e.name === 'meta.txt');
    assert.deepEqual(listedMeta.metadata, meta);
    assert.equal(listedMeta.owner, owner);
    assert.equal((await sbx.files.getInfo('/', { user: 'root' })).owner, 'root');
    await sbx.files.write('/tmp/e2b/meta.txt', 'replaced');
    assert.equal((await sbx.files.getInfo('/tmp/e2b/meta.txt')).metadata, undefined, 'a write without metadata replaces it');
    await sbx.files.remove('/tmp/e2b/meta.txt');
    // A link is described by what it resolves to, as envd describes it.
    await sbx.commands.run('ln -s hello.txt /tmp/e2b/link');
    const link = await sbx.files.getInfo('/tmp/e2b/link');
    assert.equal(link.symlinkTarget, '/tmp/e2b/hello.txt');
    assert.equal(link.type, 'file');
    await sbx.files.remove('/tmp/e2b/link');
    assert.equal(await sbx.files.makeDir('/tmp/e2b/sub'), true);
    assert.equal(await sbx.files.makeDir('/tmp/e2b/sub'), false);
    await sbx.files.rename('/tmp/e2b/hello.txt', '/tmp/e2b/sub/moved.txt');
    assert.equal(await sbx.files.read('/tmp/e2b/sub/moved.txt'), 'hello file');
    await sbx.files.remove('/tmp/e2b/sub');
    assert.equal(await sbx.files.exists('/tmp/e2b/sub'), false);

    // Relative paths are taken from the user's home, as envd resolves them (and `~` is the
    // home); so is a command's relative cwd.
    await sbx.files.write('hello.txt', 'relative');
    assert.equal(await sbx.files.read('hello.txt'), 'relative');
    assert.equal(await sbx.files.read('/home/user/hello.txt'), 'relative');
    assert.equal(await sbx.files.read('~/hello.txt'), 'relative');
    assert.equal((await sbx.files.getInfo('hello.txt')).path, '/home/user/hello.txt');
    assert.ok((await sbx.files.list('.')).some((e) => e.name === 'hello.txt' && e.path === '/home/user/hello.txt'));
    assert.equal(await sbx.files.makeDir('rel/dir'), true);
    await sbx.files.rename('hello.txt', 'rel/dir/moved.txt');
    assert.equal(await sbx.files.exists('hello.txt'), false);
    assert.equal((await sbx.commands.run('cat moved.txt', { cwd: 'rel/dir' })).stdout, 'relative');
    assert.equal((await sbx.files.read('hello.txt', { user: 'root' }).catch((e) => e.name)), 'FileNotFoundError', "root's home is /root");
    await sbx.files.remove('rel');
    assert.equal(await sbx.files.exists('rel'), false);

    // What the sandbox's files refuse, the SDK raises as it does against E2B: a directory
    // read as a file, a listing of a file, a cwd that does not exist are InvalidArgumentError
    // (envd's 400 and invalid_argument); a path the user may not read is a SandboxError.
    await assert.rejects(sbx.files.read('/tmp'), InvalidArgumentError);
    await assert.rejects(sbx.files.list('/etc/passwd'), InvalidArgumentError);
    await assert.rejects(sbx.commands.run('true', { cwd: '/nonexistent' }), InvalidArgumentError);
    await assert.rejects(sbx.files.read('/root/x'), (err) => err instanceof SandboxError && !(err instanceof InvalidArgumentError));

    await sbx.setTimeout(60_000);
    const info = await sbx.getInfo();
    assert.equal(info.sandboxId, sbx.sandboxId);
    assert.deepEqual(info.metadata, metadata);
    assert.ok(info.endAt.getTime() - Date.now() > 30_000, 'setTimeout moved the end');
    assert.deepEqual(info.lifecycle, { onTimeout: 'kill', autoResume: false });
    assert.equal(await sbx.isRunning(), true);

    // Re-attach to a background command by pid, and feed it stdin.
    const cat = await sbx.commands.run('cat', { background: true, stdin: true });
    const again = await sbx.commands.connect(cat.pid);
    await sbx.commands.sendStdin(cat.pid, 'through stdin\n');
    await sbx.commands.closeStdin(cat.pid);
    const catDone = await again.wait();
    assert.equal(catDone.stdout, 'through stdin\n');

    assert.equal(await sbx.pause(), true);
    assert.equal((await sbx.getInfo()).state, 'paused');
    assert.equal(await sbx.isRunning(), false, 'a paused sandbox does not run');
    const back = await Sandbox.connect(sbx.sandboxId);
    assert.equal((await back.commands.run('echo back')).stdout, 'back\n');

    // A pause without memory keeps the files alone: connect boots the sandbox afresh.
    await sbx.files.write('kept.txt', 'kept');
    const sleeper = await sbx.commands.run('sleep 300', { background: true });
    assert.equal(await sbx.pause({ keepMemory: false }), true);
    assert.equal(await sbx.pause({ keepMemory: false }), false, 'a second pause finds it paused');
    const cold = await Sandbox.connect(sbx.sandboxId);
    assert.equal(await cold.files.read('kept.txt'), 'kept');
    assert.ok(!(await cold.commands.list()).some((p) => p.pid === sleeper.pid), 'the cold boot ran no old process');

    const page = await Sandbox.list({ query: { metadata } }).nextItems();
    assert.deepEqual(page.map((s) => s.sandboxId), [sbx.sandboxId]);
  } finally {
    assert.equal(await sbx.kill(), true);
  }
  assert.equal(await sbx.isRunning(), false, 'a killed sandbox does not run');
  assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'a second kill finds nothing');
});

// until polls cond until it holds, for at most ms.
async function until(what, cond, ms = 20_000) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

test('two sandboxes, watchDir, processes across a restart of bothyd', { timeout: 240_000 }, async () => {
  const [a, b] = await Promise.all([Sandbox.create({ metadata }), Sandbox.create({ metadata })]);
  try {
    assert.notEqual(a.sandboxId, b.sandboxId);

    // watchDir sees what a command writes, recursively.
    await a.files.makeDir('/tmp/w/deep');
    const events = [];
    const watch = await a.files.watchDir('/tmp/w', (e) => events.push(e), { recursive: true });
    await a.commands.run('echo x > /tmp/w/from-cmd.txt && echo y > /tmp/w/deep/nested.txt');
    await until('the watch events', () =>
      events.some((e) => e.name === 'from-cmd.txt' && e.type === 'create') &&
      events.some((e) => e.name === 'deep/nested.txt' && e.type === 'write'));
    await watch.stop();

    // Entries in watch events (envd 0.6.3), and allowNetworkMounts (0.6.4), which lifts
    // the refusal of network file systems and watches a local directory as before.
    const withEntries = [];
    const watch2 = await a.files.watchDir('/tmp/w', (e) => withEntries.push(e), { includeEntry: true, allowNetworkMounts: true });
    await a.files.write('/tmp/w/entry.txt', 'entry', { metadata: { seen: 'yes' } });
    await until('an event with its entry', () =>
      withEntries.some((e) => e.name === 'entry.txt' && e.entry?.path === '/tmp/w/entry.txt' && e.entry?.type === 'file'));
    await watch2.stop();

    // The two sandboxes are apart.
    assert.equal(await b.files.exists('/tmp/w/from-cmd.txt'), false);
    assert.equal((await b.commands.run('echo b')).stdout, 'b\n');

    // A background command outlives bothyd: killed with SIGKILL and started again on the
    // same state, it finds the command again by pid, with its output so far.
    const bg = await a.commands.run('echo started; read x; echo "got $x"', { background: true, stdin: true });
    await until('the first output', () => bg.stdout.includes('started'));
    await bg.disconnect();
    // Asynchronously: a blocking execFileSync would stop node's event loop while bothyd
    // dies, so the pooled keep-alive connections' closing would be seen only after the next
    // request had been written to one of them, which then fails with "fetch failed" (a race
    // of the harness, not of bothyd: a client's event loop runs while a server crashes).
    const restarted = await promisify(execFile)('bash', [process.env.BOTHY_RESTART, 'restart']);
    process.stderr.write(restarted.stderr);

    assert.ok((await a.commands.list()).some((p) => p.pid === bg.pid), 'listed after the restart');
    const again = await a.commands.connect(bg.pid);
    await a.commands.sendStdin(bg.pid, 'after\n');
    const done = await again.wait();
    assert.equal(done.exitCode, 0);
    assert.equal(done.stdout, 'started\ngot after\n');
    assert.equal((await b.commands.run('echo still')).stdout, 'still\n');
  } finally {
    await Promise.all([a.kill(), b.kill()]);
  }
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

test('getMetrics, and autoPause with autoResume: asleep when idle, woken by a command', { timeout: 120_000 }, async () => {
  const sbx = await Sandbox.create({ metadata, timeoutMs: 3_000, lifecycle: { onTimeout: 'pause', autoResume: true } });
  try {
    // getMetrics answers the server's samples and a reading now, in E2B's shape.
    const metrics = await sbx.getMetrics();
    assert.ok(metrics.length >= 1, 'at least the reading now');
    const m = metrics[metrics.length - 1];
    assert.ok(m.timestamp instanceof Date && !Number.isNaN(m.timestamp.getTime()));
    assert.ok(m.cpuCount >= 1 && m.memUsed > 0 && m.memTotal >= m.memUsed, JSON.stringify(m));
    const info = await sbx.getInfo();
    assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: true });

    // Unused for its timeout, it is paused (E2B's state), not killed.
    await until('the idle sandbox to be paused', async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', 60_000);
    // A command wakes it and runs.
    const woke = await sbx.commands.run('echo woke');
    assert.equal(woke.stdout, 'woke\n');
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running');
  } finally {
    await sbx.kill();
  }
});

test('volumes: create, connect, list, files, volumeMounts shared by two sandboxes, destroy', { timeout: 180_000 }, async () => {
  const name = `e2b-vol-${process.pid}`;
  const vol = await Volume.create(name);
  assert.equal(vol.name, name);
  try {
    const again = await Volume.connect(vol.volumeId);
    assert.equal(again.name, name);
    assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId), 'the volume is listed');

    const written = await vol.writeFile('/seed/hello.txt', 'from the volume API\n');
    assert.equal(written.type, 'file');
    assert.equal(written.uid, 1000);
    assert.equal(await vol.readFile('/seed/hello.txt'), 'from the volume API\n');
    const dir = await vol.makeDir('/made/deeper', { force: true });
    assert.equal(dir.type, 'directory');
    assert.equal(await vol.exists('/made/deeper'), true);
    assert.equal(await vol.exists('/nope'), false);
    const names = (await vol.list('/')).map((e) => e.name).sort();
    assert.ok(names.includes('seed') && names.includes('made'), `listing: ${names}`);

    const a = await Sandbox.create({ metadata, timeoutMs: 120_000, volumeMounts: { '/data': vol } });
    const b = await Sandbox.create({ metadata, timeoutMs: 120_000, volumeMounts: { '/home/user/shared': name } });
    try {
      assert.equal((await a.commands.run('cat /data/seed/hello.txt')).stdout, 'from the volume API\n');
      await a.commands.run('echo from-a > /data/a.txt');
      assert.equal((await b.commands.run('cat /home/user/shared/a.txt')).stdout, 'from-a\n');
      await b.commands.run('echo from-b > /home/user/shared/b.txt');
      assert.equal((await a.commands.run('cat /data/b.txt')).stdout, 'from-b\n');
      assert.equal(await vol.readFile('/b.txt'), 'from-b\n');
      // In use: E2B's destroy fails rather than pull the files from under the sandboxes.
      await assert.rejects(Volume.destroy(vol.volumeId), /in use|mounted/i);
    } finally {
      await a.kill();
      await b.kill();
    }
    await vol.remove('/made');
    assert.equal(await vol.exists('/made'), false);
  } finally {
    assert.equal(await Volume.destroy(vol.volumeId), true);
  }
  assert.equal(await Volume.destroy(vol.volumeId), false);
});

test('fork, and snapshots: create, list, create from, delete', { timeout: 180_000 }, async () => {
  const sbx = await Sandbox.create({ metadata, timeoutMs: 120_000 });
  const made = [sbx];
  try {
    await sbx.files.write('/home/user/state.txt', 'before');
    // A process runs through the fork; the forks start their own, with the files.
    await sbx.commands.run('sleep 300', { background: true });

    const forks = await sbx.fork({ count: 2 });
    assert.equal(forks.length, 2);
    for (const f of forks) {
      assert.ok(!(f instanceof Error), String(f));
      made.push(f);
      assert.notEqual(f.sandboxId, sbx.sandboxId);
      assert.equal(await f.files.read('/home/user/state.txt'), 'before');
    }
    await forks[0].files.write('/home/user/state.txt', 'fork0');
    assert.equal(await forks[1].files.read('/home/user/state.txt'), 'before');
    assert.equal(await sbx.files.read('/home/user/state.txt'), 'before');

    const snap = await sbx.createSnapshot({ name: 'flow' });
    assert.ok(snap.snapshotId.startsWith('snap-'), snap.snapshotId);
    assert.deepEqual(snap.names, ['flow']);
    const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems();
    assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId), JSON.stringify(listed));

    const fromSnap = await Sandbox.create(snap.snapshotId, { metadata, timeoutMs: 60_000 });
    made.push(fromSnap);
    assert.equal(await fromSnap.files.read('/home/user/state.txt'), 'before');
    await fromSnap.kill();
    made.pop();

    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true);
    const after = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems();
    assert.ok(!after.some((s) => s.snapshotId === snap.snapshotId), JSON.stringify(after));
  } finally {
    await Promise.all(made.map((s) => s.kill().catch(() => undefined)));
  }
});

test('secrets, and a network.rules header transform that names one', { timeout: 120_000 }, async () => {
  // E2B lower-cases names; bothyd's are a letter, then letters, digits or underscores.
  const name = `flow_key_${process.pid}`;
  const value = `flow-secret-value-${process.pid}`;
  const info = await Secret.create(name, value);
  assert.equal(info.name, name);
  assert.equal(info.secretId, `sec_${name}`);
  assert.equal(info.version, 1);
  assert.ok(!JSON.stringify(info).includes(value), 'no answer carries the value');
  const rotated = await Secret.update(info.secretId, `flow-secret-rotated-${process.pid}`);
  assert.equal(rotated.version, 2);
  assert.equal((await Secret.getInfo(name)).version, 2);
  assert.ok(await Secret.exists(name));
  const listed = await Secret.list().nextItems();
  assert.ok(listed.some((s) => s.name === name), JSON.stringify(listed));

  const sbx = await Sandbox.create({
    metadata,
    timeoutMs: 60_000,
    network: {
      allowOut: ['api.example.com'],
      rules: { 'api.example.com': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(name)}` } } }] },
    },
  });
  try {
    // The sandbox holds a placeholder for the secret, never its value, and trusts the proxy.
    const env = await sbx.commands.run('env');
    assert.match(env.stdout, new RegExp(`BOTHY_SECRET_${name}=bothy-secret-[0-9a-f]{32}\n`));
    assert.match(env.stdout, /SSL_CERT_FILE=/);
    assert.ok(!env.stdout.includes('flow-secret'), 'the environment holds no value');
    // A secret a sandbox's rules name is not destroyed under it.
    await assert.rejects(Secret.destroy(name));
  } finally {
    await sbx.kill();
  }
  assert.equal(await Secret.destroy(name), true);
  assert.equal(await Secret.exists(name), false);
  assert.equal(await Secret.destroy(name), false);
});
