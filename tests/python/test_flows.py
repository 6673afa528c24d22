"""The main flows through a Python client generated from openapi/openapi.yaml by
openapi-python-client with its defaults, against a live bothyd (tests/python/run.sh starts
one and generates the client into a temporary directory on PYTHONPATH as bothy_client).

Each flow uses the generated functions and models as a user would, with no cast and no
hand-made request: a create, an exec, a file written and read back as bytes, a directory
listing, and refusals that come back as the contract's Problem. A spec that a generator turns
into something unusable here (a default made required, a body typed as text, an answer with
two shapes, a closed list of codes) fails this file.
"""

import io
import os
import secrets
import unittest

from bothy_client import AuthenticatedClient, Client
from bothy_client.api.exec_ import exec_command
from bothy_client.api.files import list_files, read_file, write_file
from bothy_client.api.sandboxes import create_sandbox, delete_sandbox, get_sandbox, stop_sandbox
from bothy_client.models import CreateSandboxRequest, ExecRequest, ExecResult, FileEntryType, FileList, Problem, Sandbox
from bothy_client.types import File


def client():
    url, token = os.environ["BOTHY_URL"], os.environ.get("BOTHY_TOKEN", "")
    if token:
        return AuthenticatedClient(base_url=url, token=token, raise_on_unexpected_status=True)
    return Client(base_url=url, raise_on_unexpected_status=True)


class Flows(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = client()
        cls.id = "py-" + secrets.token_hex(4)
        # start has a default: it is optional in the generated model, and asked for here.
        sb = create_sandbox.sync(client=cls.c, body=CreateSandboxRequest(id=cls.id, start=True))
        assert isinstance(sb, Sandbox), sb
        assert sb.state.value == "running", sb.state

    @classmethod
    def tearDownClass(cls):
        stop_sandbox.sync_detailed(cls.id, client=cls.c, force=True)
        delete_sandbox.sync_detailed(cls.id, client=cls.c)

    def test_exec(self):
        # timeout_ms and wait_ms have defaults: the command alone is a whole request.
        r = exec_command.sync(self.id, client=self.c, body=ExecRequest(command=["sh", "-c", "echo out; echo err >&2; exit 3"]))
        self.assertIsInstance(r, ExecResult)
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.timed_out), (3, "out\n", "err\n", False))

    def test_exec_killed_by_a_signal(self):
        r = exec_command.sync(self.id, client=self.c, body=ExecRequest(command=["sleep", "30"], timeout_ms=200))
        self.assertIsInstance(r, ExecResult)
        self.assertEqual((r.exit_code, r.signal, r.timed_out), (137, "SIGKILL", True))

    def test_files(self):
        data = bytes(range(256)) * 4
        w = write_file.sync_detailed(self.id, client=self.c, path="/home/user/py/bytes.bin", body=File(payload=io.BytesIO(data)))
        self.assertEqual(w.status_code, 204, w.content)
        f = read_file.sync(self.id, client=self.c, path="/home/user/py/bytes.bin")
        self.assertIsInstance(f, File)
        self.assertEqual(f.payload.read(), data)
        ls = list_files.sync(self.id, client=self.c, path="/home/user/py")
        self.assertIsInstance(ls, FileList)
        self.assertEqual([(e.name, e.type_, e.size) for e in ls.items], [("bytes.bin", FileEntryType.FILE, len(data))])

    def test_problems(self):
        p = get_sandbox.sync("none-" + secrets.token_hex(4), client=self.c)
        self.assertIsInstance(p, Problem)
        self.assertEqual((p.status, p.code), (404, "sandbox-not-found"))
        p = exec_command.sync(self.id, client=self.c, body=ExecRequest(command=["true"], timeout_ms=3600001))
        self.assertIsInstance(p, Problem)
        self.assertEqual((p.status, p.code, p.field), (400, "invalid-request", "timeout_ms"))
        self.assertIn("at most 3600000", p.detail)
        # A directory read as a file: the refusal names the path.
        p = read_file.sync(self.id, client=self.c, path="/home/user")
        self.assertIsInstance(p, Problem)
        self.assertEqual((p.code, p.field), ("invalid-request", "path"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
