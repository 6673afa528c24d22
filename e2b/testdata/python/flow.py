"""Drives a live bothyd with the unmodified E2B Python SDK (docs/e2b.md).

run.sh beside this file starts bothyd and sets E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL;
the SDK must be importable (PyPI `e2b`, which this project's CI cannot reach: see README.md).
The same flow as ../js/flow.test.mjs, through both of the SDK's faces: the synchronous one
(whose watch_dir polls CreateWatcher/GetWatcherEvents) and the asynchronous one (whose
watch_dir is the WatchDir stream).
"""

import asyncio
import os
import re
import subprocess
import time
import unittest
from datetime import datetime, timezone

from e2b import AsyncSandbox, CommandExitException, Sandbox, SandboxQuery, SandboxState, TimeoutException

METADATA = {"suite": "e2b-compat-py", "run": str(os.getpid())}


def until(what, cond, seconds=20.0):
    """Polls cond until it holds, for at most seconds."""
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


async def until_async(what, cond, seconds=20.0):
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


class SyncFlow(unittest.TestCase):
    def test_create_run_files_timeout_list_kill(self):
        sbx = Sandbox.create(metadata=METADATA, timeout=120)
        try:
            self.assertRegex(sbx.sandbox_id, r"^[a-z0-9]+$")

            hi = sbx.commands.run("echo hi")
            self.assertEqual(hi.exit_code, 0)
            self.assertEqual(hi.stdout, "hi\n")
            env = sbx.commands.run('echo "$GREETING"', envs={"GREETING": "hello"})
            self.assertEqual(env.stdout, "hello\n")
            # A command past its timeout is a TimeoutException (deadline_exceeded), not an exit.
            with self.assertRaises(TimeoutException):
                sbx.commands.run("sleep 30", timeout=1)
            with self.assertRaises(CommandExitException) as caught:
                sbx.commands.run("echo out; echo err >&2; exit 3")
            self.assertEqual(caught.exception.exit_code, 3)
            self.assertEqual(caught.exception.stdout, "out\n")
            self.assertEqual(caught.exception.stderr, "err\n")

            # Two commands at once: E2B processes take no exec lock.
            bg = sbx.commands.run("sleep 30", background=True)
            self.assertIn(bg.pid, [p.pid for p in sbx.commands.list()])
            self.assertEqual(sbx.commands.run("echo beside").stdout, "beside\n")
            self.assertTrue(sbx.commands.kill(bg.pid))
            until("the killed command to go", lambda: bg.pid not in [p.pid for p in sbx.commands.list()])
            self.assertFalse(sbx.commands.kill(bg.pid), "a kill of a command that is gone finds nothing")

            sbx.files.write("/tmp/e2b/hello.txt", "hello file")
            self.assertEqual(sbx.files.read("/tmp/e2b/hello.txt"), "hello file")
            self.assertEqual(sbx.files.read("/tmp/e2b/hello.txt", format="bytes"), b"hello file")
            self.assertTrue(sbx.files.exists("/tmp/e2b/hello.txt"))
            self.assertEqual([e.name for e in sbx.files.list("/tmp/e2b")], ["hello.txt"])
            # A file object goes up as octet-stream (envd 0.5.7), gzip too.
            with open(__file__, "rb") as f:
                sbx.files.write("/tmp/e2b/stream.py", f)
            with open(__file__, "rb") as f:
                mine = f.read()
            self.assertEqual(sbx.files.read("/tmp/e2b/stream.py", format="bytes"), mine)
            sbx.files.write("/tmp/e2b/gz.txt", "gzipped", gzip=True)
            self.assertEqual(sbx.files.read("/tmp/e2b/gz.txt"), "gzipped")
            many = sbx.files.write_files(
                [{"path": "/tmp/e2b/many/a.txt", "data": "a"}, {"path": "/tmp/e2b/many/b.txt", "data": b"b"}]
            )
            self.assertEqual(sorted(w.path for w in many), ["/tmp/e2b/many/a.txt", "/tmp/e2b/many/b.txt"])
            self.assertEqual(sbx.files.read("/tmp/e2b/many/b.txt"), "b")
            deep = sbx.files.list("/tmp/e2b", depth=2)
            self.assertIn("/tmp/e2b/many/a.txt", [e.path for e in deep])

            # File metadata (envd 0.6.2); owner and group as the sandbox names them.
            meta = {"author": "ada", "purpose": "e2b flow"}
            written = sbx.files.write("/tmp/e2b/meta.txt", "with metadata", metadata=meta)
            self.assertEqual(written.metadata, meta)
            owner, group = sbx.commands.run("id -un; id -gn").stdout.split()
            info = sbx.files.get_info("/tmp/e2b/meta.txt")
            self.assertEqual(info.metadata, meta)
            self.assertEqual((info.owner, info.group), (owner, group))
            self.assertEqual(info.size, len("with metadata"))
            self.assertEqual(info.permissions[0], "-")
            self.assertLess(abs((datetime.now(timezone.utc) - info.modified_time).total_seconds()), 120)
            listed = [e for e in sbx.files.list("/tmp/e2b") if e.name == "meta.txt"][0]
            self.assertEqual(listed.metadata, meta)
            self.assertEqual(sbx.files.get_info("/", user="root").owner, "root")
            sbx.files.write("/tmp/e2b/meta.txt", "replaced")
            self.assertIsNone(sbx.files.get_info("/tmp/e2b/meta.txt").metadata)
            sbx.files.remove("/tmp/e2b/meta.txt")
            sbx.commands.run("ln -s hello.txt /tmp/e2b/link")
            link = sbx.files.get_info("/tmp/e2b/link")
            self.assertEqual(link.symlink_target, "/tmp/e2b/hello.txt")
            self.assertEqual(link.type.value, "file")
            sbx.files.remove("/tmp/e2b/link")
            self.assertTrue(sbx.files.make_dir("/tmp/e2b/sub"))
            self.assertFalse(sbx.files.make_dir("/tmp/e2b/sub"))
            moved = sbx.files.rename("/tmp/e2b/hello.txt", "/tmp/e2b/sub/moved.txt")
            self.assertEqual(moved.path, "/tmp/e2b/sub/moved.txt")
            self.assertEqual(sbx.files.read("/tmp/e2b/sub/moved.txt"), "hello file")
            sbx.files.remove("/tmp/e2b/sub")
            self.assertFalse(sbx.files.exists("/tmp/e2b/sub"))

            # The polled watcher (CreateWatcher, GetWatcherEvents, RemoveWatcher).
            sbx.files.make_dir("/tmp/w/deep")
            watch = sbx.files.watch_dir("/tmp/w", recursive=True)
            sbx.commands.run("echo x > /tmp/w/from-cmd.txt && echo y > /tmp/w/deep/nested.txt")
            events = []

            def seen():
                events.extend(watch.get_new_events())
                return any(e.name == "from-cmd.txt" and e.type.value == "create" for e in events) and any(
                    e.name == "deep/nested.txt" and e.type.value == "write" for e in events
                )

            until("the polled watch events", seen)
            watch.stop()
            watch2 = sbx.files.watch_dir("/tmp/w", include_entry=True, allow_network_mounts=True)
            sbx.files.write("/tmp/w/entry.txt", "entry")
            events = []

            def entry_seen():
                events.extend(watch2.get_new_events())
                return any(e.name == "entry.txt" and e.entry is not None and e.entry.path == "/tmp/w/entry.txt" for e in events)

            until("a polled event with its entry", entry_seen)
            watch2.stop()

            sbx.set_timeout(60)
            info = sbx.get_info()
            self.assertEqual(info.sandbox_id, sbx.sandbox_id)
            self.assertEqual(info.metadata, METADATA)
            self.assertEqual(info.state.value, "running")
            self.assertGreater((info.end_at - datetime.now(timezone.utc)).total_seconds(), 30)
            self.assertEqual(info.lifecycle, {"on_timeout": "kill", "auto_resume": False})
            self.assertTrue(sbx.is_running())

            # Re-attach to a background command by pid, and feed it stdin.
            cat = sbx.commands.run("cat", background=True, stdin=True)
            again = sbx.commands.connect(cat.pid)
            sbx.commands.send_stdin(cat.pid, "through stdin\n")
            sbx.commands.close_stdin(cat.pid)
            self.assertEqual(again.wait().stdout, "through stdin\n")

            self.assertTrue(sbx.pause())
            self.assertFalse(sbx.pause(), "a second pause finds it paused")
            self.assertEqual(sbx.get_info().state.value, "paused")
            self.assertFalse(sbx.is_running())
            paused = Sandbox.list(query=SandboxQuery(metadata=METADATA, state=[SandboxState.PAUSED])).next_items()
            self.assertEqual([s.sandbox_id for s in paused], [sbx.sandbox_id])
            back = Sandbox.connect(sbx.sandbox_id)
            self.assertEqual(back.commands.run("echo back").stdout, "back\n")

            page = Sandbox.list(query=SandboxQuery(metadata=METADATA)).next_items()
            self.assertEqual([s.sandbox_id for s in page], [sbx.sandbox_id])

            # A pause without memory keeps the files alone: connect boots the sandbox afresh.
            sbx.files.write("/home/user/kept.txt", "kept")
            sleeper = sbx.commands.run("sleep 300", background=True)
            self.assertTrue(sbx.pause(keep_memory=False))
            self.assertFalse(sbx.is_running())
            self.assertFalse(sbx.pause(keep_memory=False), "a second pause finds it paused")
            cold = Sandbox.connect(sbx.sandbox_id)
            self.assertEqual(cold.files.read("/home/user/kept.txt"), "kept")
            self.assertNotIn(sleeper.pid, [p.pid for p in cold.commands.list()])
        finally:
            self.assertTrue(sbx.kill())
        self.assertFalse(sbx.is_running(), "a killed sandbox does not run")
        self.assertFalse(Sandbox.kill(sbx.sandbox_id), "a second kill finds nothing")

    def test_two_sandboxes_and_a_restart_of_bothyd(self):
        a = Sandbox.create(metadata=METADATA)
        b = Sandbox.create(metadata=METADATA)
        try:
            self.assertNotEqual(a.sandbox_id, b.sandbox_id)
            a.files.write("/tmp/only-a.txt", "a")
            self.assertFalse(b.files.exists("/tmp/only-a.txt"))

            # A background command outlives bothyd (SIGKILL, started again on the same state).
            bg = a.commands.run('echo started; read x; echo "got $x"', background=True, stdin=True)
            out = []
            for stdout, _, _ in bg:
                out.append(stdout or "")
                if "started" in "".join(out):
                    break
            bg.disconnect()
            subprocess.run(["bash", os.environ["BOTHY_RESTART"], "restart"], check=True)

            self.assertIn(bg.pid, [p.pid for p in a.commands.list()])
            again = a.commands.connect(bg.pid)
            a.commands.send_stdin(bg.pid, "after\n")
            done = again.wait()
            self.assertEqual(done.exit_code, 0)
            self.assertEqual(done.stdout, "started\ngot after\n")
            self.assertEqual(b.commands.run("echo still").stdout, "still\n")
        finally:
            a.kill()
            b.kill()


class AsyncFlow(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        # unittest runs the loop in debug mode, which reports every callback over 0.1 s:
        # the SDK's own startup work, not something this flow checks.
        asyncio.get_running_loop().slow_callback_duration = 5

    async def test_watch_stream_and_processes(self):
        sbx = await AsyncSandbox.create(metadata=METADATA)
        try:
            self.assertEqual((await sbx.commands.run("echo hi")).stdout, "hi\n")
            with self.assertRaises(CommandExitException):
                await sbx.commands.run("exit 4")

            await sbx.files.make_dir("/tmp/w/deep")
            events = []
            watch = await sbx.files.watch_dir("/tmp/w", events.append, recursive=True)
            await sbx.commands.run("echo x > /tmp/w/from-cmd.txt && echo y > /tmp/w/deep/nested.txt")
            await until_async(
                "the streamed watch events",
                lambda: any(e.name == "from-cmd.txt" and e.type.value == "create" for e in events)
                and any(e.name == "deep/nested.txt" and e.type.value == "write" for e in events),
            )
            await watch.stop()
            entries = []
            watch2 = await sbx.files.watch_dir("/tmp/w", entries.append, include_entry=True, allow_network_mounts=True)
            await sbx.files.write("/tmp/w/entry.txt", "entry", metadata={"seen": "yes"})
            await until_async(
                "a streamed event with its entry",
                lambda: any(
                    e.name == "entry.txt" and e.entry is not None and e.entry.type.value == "file" for e in entries
                ),
            )
            await watch2.stop()

            got = []
            bg = await sbx.commands.run("echo one; sleep 30", background=True, on_stdout=got.append)
            await until_async("background output", lambda: "one\n" in "".join(got))
            self.assertIn(bg.pid, [p.pid for p in await sbx.commands.list()])
            self.assertTrue(await bg.kill())
            with self.assertRaises(CommandExitException):
                await bg.wait()

            await sbx.set_timeout(90)
            info = await sbx.get_info()
            self.assertEqual(info.metadata, METADATA)
            self.assertTrue(await sbx.pause())
            back = await AsyncSandbox.connect(sbx.sandbox_id)
            self.assertEqual((await back.commands.run("echo back")).stdout, "back\n")
        finally:
            self.assertTrue(await sbx.kill())
        self.assertFalse(await AsyncSandbox.kill(sbx.sandbox_id))

    async def test_sandboxes_in_parallel(self):
        async def one(i):
            sbx = await AsyncSandbox.create(metadata={"suite": "e2b-parallel-py"})
            try:
                r = await sbx.commands.run(f"echo {i}")
                self.assertEqual(r.stdout, f"{i}\n")
                return sbx.sandbox_id
            finally:
                await sbx.kill()

        ids = await asyncio.gather(*(one(i) for i in range(10)))
        self.assertEqual(len(set(ids)), 10)
        self.assertTrue(all(re.fullmatch(r"[a-z0-9]+", i) for i in ids))


if __name__ == "__main__":
    unittest.main(verbosity=2)
