"""A server's address given on the command line (the runner's --server, the runner unit's
--runner-server, the web's --public-origin) is checked alike: a mistake exits 2 naming the
flag, nothing is written, and a URL carrying a credential is refused without repeating it."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_process

CANARY = "canary-5e6f7a8b"
BAD = [
    ("http://[::1", "is not a well-formed URL"),
    ("http://127.0.0.1:abc", "is not a well-formed URL (Port could not be cast"),
    ("http://127.0.0.1:99999", "is not a well-formed URL (Port out of range"),
    ("http://127.0.0.1:0", "must be http(s)://HOST[:PORT]"),
    ("ftp://127.0.0.1", "must be http(s)://HOST[:PORT]"),
    ("http://127.0.0.1:8080/path", "with no path or query"),
    (f"http://runner:{CANARY}@127.0.0.1:8080", "must not carry a user name or password"),
    (f"https://runner:{CANARY}/x@127.0.0.1", "must not carry a user name or password"),
    (f"https://{CANARY}/x@127.0.0.1/", "must not carry a user name or password"),
    ("http://127.0.0.1 --foo", "must be http(s)://HOST[:PORT]"),
    ("http://127.0.0.1:", "must be http(s)://HOST[:PORT]"),
]


def commands(tmp_path, value):
    yield "--server", ("runner", "doctor", "--server", value, "--attempt-root", str(tmp_path / "a"))
    yield (
        "--runner-server",
        (
            "scheduler",
            "install",
            "--dir",
            str(tmp_path / "units"),
            "--runner-server",
            value,
        ),
    )
    yield "--public-origin", ("web", "serve", "--listen", "127.0.0.1:0", "--public-origin", value)


@pytest.mark.parametrize(("value", "said"), BAD, ids=[b[0] for b in BAD])
def test_a_malformed_server_address_is_named_and_nothing_is_written(tmp_path, value, said):
    for flag, argv in commands(tmp_path, value):
        result = run_process("--json", *argv)
        assert result.exit_code == 2, (flag, result)
        message = json.loads(result.stdout)["error"]["message"]
        assert message.startswith(flag), (flag, message)
        assert said in message, (flag, message)
        assert CANARY not in result.stdout + result.stderr
        assert not (tmp_path / "units").exists()
        assert not (tmp_path / "a").exists()
