"""Configuration: strict validation with key paths, redaction, atomic revision-guarded saves."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import run_process

CANARY = "canary-3f9a1c77e2b04d5e"

GOOD = """
shares = 2
check_interval = 120
providers = ["script", "codex"]
reserve_percent = 15

[forge]
url = "http://127.0.0.1:3000"

[forge.identities.planner]
token_env = "AIWORKER_TEST_PLANNER_TOKEN"

[forge.identities.worker]
token_file = "worker.token"

[forge.identities.reviewer]
token_env = "AIWORKER_TEST_MISSING_TOKEN"

[[repositories]]
index = 1
owner = "team"
name = "app"

[phases.implementation.providers.codex]
model = "gpt-5-codex"
effort = "high"

[database]
url = "sqlite:////tmp/never-used-%s.db"
"""


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(GOOD % "x")
    (tmp_path / "worker.token").write_text(CANARY + "\n")
    monkeypatch.setenv("AIWORKER_TEST_PLANNER_TOKEN", CANARY + "-planner")
    monkeypatch.delenv("AIWORKER_TEST_MISSING_TOKEN", raising=False)
    return path


def test_valid_config_is_shown_with_defaults(cli, config_file):
    result = cli("--json", "--config", str(config_file), "config", "show")
    assert result.exit_code == 0, result
    shown = result.json()
    assert shown["config"]["shares"] == 2
    assert shown["config"]["weekly_reserve_percent"] is None
    assert shown["config"]["phases"]["implementation"]["providers"]["codex"]["effort"] == "high"
    assert shown["tokens"]["worker"] == {
        "source": "file:worker.token",
        "present": True,
        "state": "present",
    }
    assert shown["tokens"]["reviewer"]["present"] is False
    assert len(shown["revision"]) == 64


def test_validate_reports_every_key_path(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        textwrap.dedent(
            """
            shares = 7
            check_interval = "often"
            colour = "blue"

            [[repositories]]
            index = 0
            owner = "team"
            name = "a b"
            """
        )
    )
    result = cli("--config", str(bad), "config", "validate")
    assert result.exit_code == 2, result
    for key in ("shares", "check_interval", "colour", "repositories[0].index"):
        assert f"  - {key}:" in result.stderr, key
    assert "repositories[0].name" in result.stderr
    as_json = cli("--json", "--config", str(bad), "config", "validate")
    assert as_json.exit_code == 2
    error = as_json.json()["error"]
    assert error["code"] == "config_invalid"
    assert any(d.startswith("shares:") for d in error["details"])


def test_validate_accepts_good_file(cli, config_file):
    result = cli("--config", str(config_file), "config", "validate")
    assert result.exit_code == 0, result
    assert "valid" in result.stdout


def test_missing_explicit_config_is_an_error(cli, tmp_path):
    missing = tmp_path / "nope.toml"
    for argv in (("config", "show"), ("status",), ("task", "list"), ("poll",)):
        result = cli("--config", str(missing), *argv)
        assert result.exit_code == 2, result
        assert f"no configuration file at {missing}: write one with `aiworker --config " in (
            result.stderr
        )  # each says what to run, as doctor does
        assert f"{missing} config set forge.url URL`" in result.stderr


def test_missing_default_config_uses_embedded_defaults(cli):
    result = cli("--json", "config", "show")
    assert result.exit_code == 0, result
    assert result.json()["exists"] is False
    assert result.json()["config"]["check_interval"] == 180


def test_broken_toml_names_the_line(cli, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("shares = \n")
    result = cli("--config", str(path), "config", "validate")
    assert result.exit_code == 2
    assert "not valid TOML" in result.stderr
    assert "line 1" in result.stderr


def test_a_byte_order_mark_is_named_not_taken_for_a_bad_statement(cli, tmp_path):
    path = tmp_path / "c.toml"
    path.write_bytes(b"\xef\xbb\xbfshares = 2\n")
    result = cli("--config", str(path), "config", "validate")
    assert result.exit_code == 2
    assert "starts with a UTF-8 byte-order mark" in result.stderr


def test_a_file_or_value_nested_too_deeply_or_not_utf8_is_refused_and_kept(tmp_path):
    """A configuration nested thousands deep (a generated file gone wrong), a value so
    nested given to `config set`, and a `config set` on a file that is not UTF-8 are
    refused with exit 2 naming the problem (the interpreter's recursion error or the
    decoder's, exit 1, said nothing), and the file is left as it was."""
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfeshares = 2\n")
    plain = tmp_path / "plain.toml"
    plain.write_text("shares = 2\n")
    nested = "[" * 3000 + "]" * 3000
    cases = [
        (deep, ("status",), "nested too deeply to be a configuration"),
        (binary, ("config", "set", "shares", "1"), "not UTF-8 text"),
        (plain, ("config", "set", "repositories", nested), "nested too deeply to be a setting"),
    ]
    for path, args, said in cases:
        before = path.read_bytes()
        done = run_process("--json", "--config", str(path), *args)
        assert done.exit_code == 2, (args, done)
        assert said in done.json()["error"]["message"], (args, done)
        assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("text", "key", "said"),
    [
        ('[labels]\nplan = " "\n', "labels.plan", "must be one line of text, not blank"),
        ('[labels]\nsimple = "a\\nb"\n', "labels.simple", "must be one line of text, not blank"),
        ('[execution]\nguests_dir = ""\n', "execution.guests_dir", "must be one line of text"),
        (
            '[provider_options.script]\nscenario = ""\n',
            "provider_options.script.scenario",
            "must be one line of text, not blank",
        ),
        (
            '[phases.review.providers.script]\nmodel = " "\n',
            "phases.review.providers.script.model",
            "must be one line of text, not blank",
        ),
        (
            '[provider_options.llama]\nbase_url = "http://"\n',
            "provider_options.llama.base_url",
            "must be http(s)://HOST[:PORT][/PATH]",
        ),
    ],
)
def test_values_that_cannot_work_are_refused_in_words(cli, tmp_path, text, key, said):
    """A blank label (every issue would carry it or none), an empty guests_dir (the
    configuration's own folder), an empty scenario, a blank model, a base URL with no
    host: each refused by the configuration, naming the key and what it must be."""
    path = tmp_path / "c.toml"
    path.write_text(text)
    result = cli("--json", "--config", str(path), "config", "validate")
    assert result.exit_code == 2, result
    assert f"{key}: {said}" in "\n".join(result.json()["error"]["details"])


def test_two_kinds_of_work_given_one_label_are_refused(cli, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[labels]\nplan = "aiworker"\napproved = "aiworker"\n')
    result = cli("--json", "--config", str(path), "config", "validate")
    assert result.exit_code == 2, result
    assert result.json()["error"]["details"] == [
        "labels: plan and approved are both 'aiworker': name each its own"
    ]


@pytest.mark.parametrize("where", ["token_env", "token_file"])
def test_an_empty_token_source_is_refused(cli, tmp_path, where):
    path = tmp_path / "c.toml"
    path.write_text(f'[forge]\nurl = "http://f"\n[forge.identities.worker]\n{where} = " "\n')
    result = cli("--json", "--config", str(path), "config", "validate")
    assert result.exit_code == 2, result
    assert f"forge.identities.worker.{where}: is empty" in result.stdout


def test_inline_token_is_refused_without_echo(cli, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f'[forge]\nurl = "http://f"\n[forge.identities.worker]\ntoken = "{CANARY}"\n')
    result = cli("--json", "--config", str(path), "config", "validate")
    assert result.exit_code == 2
    assert "forge.identities.worker: inline tokens are not accepted" in result.stdout
    assert CANARY not in result.output


@pytest.mark.parametrize("where", ["token_env", "token_file"])
def test_a_token_pasted_where_its_source_is_named_is_refused_without_echo(cli, tmp_path, where):
    """A Forgejo token (40 hex digits) pasted as the variable's or the file's name: it
    was accepted, and `config show` and `doctor` then printed it as that name."""
    token = "a05db9fe0dbf6537461f88eaeda4e806749641cd"
    path = tmp_path / "c.toml"
    path.write_text(f'[forge]\nurl = "http://f"\n[forge.identities.worker]\n{where} = "{token}"\n')
    for command, code in ((("config", "validate"), 2), (("config", "show"), 2), (("doctor",), 1)):
        result = cli("--json", "--config", str(path), *command)
        assert result.exit_code == code, (command, result)
        assert f"forge.identities.worker.{where}: looks like a token itself" in result.stdout
        assert token not in result.output
    given = cli(
        "--config",
        str(tmp_path / "d.toml"),
        "config",
        "set",
        f"forge.identities.worker.{where}",
        token,
    )
    assert given.exit_code == 2, given
    assert token not in given.output
    assert not (tmp_path / "d.toml").exists() or token not in (tmp_path / "d.toml").read_text()


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (f"postgresql+psycopg2://u:{CANARY}@h/db", "the driver is psycopg"),
        (f"mysql://u:{CANARY}@h/db", "must be sqlite:///PATH or a postgresql:// URL"),
        (f"postgresql://u:{CANARY}@h:notaport/db", "not a well-formed PostgreSQL URL"),
        (f"postgresql://u:{CANARY}@[::1:5432/db", "not a well-formed PostgreSQL URL"),
        ("sqlite://relative.db", "sqlite:///PATH (three slashes)"),
        ("sqlite:///relative.db", "names its file by an absolute path"),
        ("sqlite:///:memory:", "names its file by an absolute path"),
        # The driver splits at the first '@' (half the password would be named as the
        # host); a space would end the URL where text is masked.
        (f"postgresql://u:{CANARY}@half@h/db", "percent-encode them (%40, %20)"),
        (f"postgresql://u:{CANARY} two@h/db", "percent-encode them (%40, %20)"),
    ],
)
def test_a_database_url_the_store_cannot_open_is_refused_without_echo(cli, tmp_path, url, said):
    """Refused with the key and what is wrong (exit 2), never where it is used later as an
    unexplained driver failure, and the password in it is not repeated."""
    path = tmp_path / "c.toml"
    path.write_text(f'[database]\nurl = "{url}"\n')
    result = cli("--json", "--config", str(path), "config", "validate")
    assert result.exit_code == 2, result
    assert "database.url" in result.stdout
    assert said in result.stdout
    assert CANARY not in result.output
    status = cli("--config", str(path), "status")
    assert status.exit_code == 2, status
    assert CANARY not in status.output


def test_canary_never_appears_in_output_or_logs(tmp_path, config_file):
    config_file.write_text(
        (GOOD % "x")
        .replace("never-used-x.db", "x.db")
        .replace('url = "sqlite:////tmp/x.db"', f'url = "postgresql://bot:{CANARY}@127.0.0.1:1/db"')
    )
    env = {"AIWORKER_TEST_PLANNER_TOKEN": CANARY + "-planner"}
    outputs = []
    for args in (
        ("config", "show"),
        ("--json", "config", "show"),
        ("-vv", "--json", "config", "show"),
        ("-vv", "doctor"),
        ("-vv", "--json", "status"),
    ):
        result = run_process("--config", str(config_file), *args, env=env)
        outputs.append(result.output)
    joined = "\n".join(outputs)
    assert "postgresql://bot:***@127.0.0.1:1/db" in joined
    assert CANARY not in joined


def test_a_url_password_is_redacted_in_both_output_modes(cli, tmp_path):
    """The forge's URL, and a provider's base_url (a llama-server behind a proxy that
    asks for a login)."""
    path = tmp_path / "config.toml"
    path.write_text(
        f'[forge]\nurl = "http://bot:{CANARY}@127.0.0.1:1"\n'
        f'[provider_options.llama]\nbase_url = "http://llama:{CANARY}@127.0.0.1:2"\n'
    )
    for args in (("config", "show"), ("--json", "config", "show"), ("-vv", "doctor")):
        result = cli("--config", str(path), *args)
        assert CANARY not in result.output, args
        if args[-1] == "show":
            assert result.exit_code == 0, result
            assert "http://bot:***@127.0.0.1:1" in result.stdout, args
            assert "http://llama:***@127.0.0.1:2" in result.stdout, args


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("forge.url", "http://[::1", "forge.url: not a usable URL (Invalid IPv6 URL)"),
        ("forge.url", "http://127.0.0.1:99999", "forge.url: not a usable URL (Port out of range"),
        ("forge.url", "http://127.0.0.1:abc", "forge.url: not a usable URL (Port could not be"),
        ("forge.url", "http://forge?x=1", "forge.url: must be http(s)://HOST[:PORT][/PATH]"),
        ("repositories", '[{index=1, owner="..", name="app"}]', "repositories[0].owner: may not"),
    ],
)
def test_a_forge_address_requests_cannot_use_is_refused_when_set(cli, tmp_path, key, value, said):
    path = tmp_path / "config.toml"
    path.write_text("shares = 1\n")
    result = cli("--config", str(path), "config", "set", key, value)
    assert result.exit_code == 2, result
    assert said in result.stderr
    assert path.read_text() == "shares = 1\n"


def test_set_writes_through_a_link_and_refuses_what_is_no_file(cli, tmp_path):
    """A symbolic link stays a link and its file changes; a directory or a device is
    refused with exit 2 and left as it was (a device replaced by a file would be
    /dev/null turned into a regular file)."""
    real = tmp_path / "real.toml"
    real.write_text("shares = 1\n")
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    assert cli("--config", str(link), "config", "set", "shares", "2").exit_code == 0
    assert link.is_symlink()
    assert real.read_text() == "shares = 2\n"
    device = tmp_path / "null"
    if os.geteuid() == 0:  # making a device node needs root; a directory shows the rest
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    for target in (device, tmp_path) if device.exists() else (tmp_path,):
        result = cli("--config", str(target), "config", "set", "shares", "3")
        assert result.exit_code == 2, (target, result)
        assert f"{target}: not a regular file" in result.stderr
    assert not device.exists() or stat.S_ISCHR(device.stat().st_mode)


def test_an_endless_config_or_token_source_is_refused_after_a_bounded_read(cli, tmp_path):
    """Read up to a bound, never to the end: a 1 GiB sparse file stands for a device such
    as /dev/zero (which, were the bound lost, would fill memory instead of failing)."""
    endless = tmp_path / "endless"
    with endless.open("wb") as handle:
        handle.truncate(1 << 30)
    result = cli("--config", str(endless), "config", "show")
    assert result.exit_code == 2, result
    assert f"{endless}: larger than 1 MiB; not a configuration file" in result.stderr
    path = tmp_path / "config.toml"
    path.write_text(
        '[forge]\nurl = "http://127.0.0.1:1"\n[forge.identities.worker]\ntoken_file = "endless"\n'
    )
    shown = cli("--json", "--config", str(path), "config", "show")
    assert shown.exit_code == 0, shown
    assert shown.json()["tokens"]["worker"]["state"] == "malformed"


def test_set_creates_a_private_file(cli, tmp_path):
    path = tmp_path / "new" / "config.toml"
    result = cli("--json", "--config", str(path), "config", "set", "shares", "3")
    assert result.exit_code == 0, result
    assert result.json()["previous"] == "absent"
    assert path.read_text() == "shares = 3\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_set_replaces_atomically_with_private_mode(cli, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("shares = 1\n")
    os.chmod(path, 0o644)
    result = cli("--json", "--config", str(path), "config", "set", "shares", "3")
    assert result.exit_code == 0, result
    assert "shares = 3" in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    shown = cli("--json", "--config", str(path), "config", "show").json()
    assert shown["revision"] == result.json()["revision"]


def test_a_check_across_keys_is_named_by_its_keys(cli, tmp_path):
    """Two repositories at one index, a provider named twice: named by the keys they are
    about, as every other problem is, not as "(top level)"."""
    bad = tmp_path / "config.toml"
    bad.write_text(
        'providers = ["script", "script"]\n[forge]\nurl = "http://forge"\n'
        + "".join(f'[[repositories]]\nindex = 1\nowner = "team"\nname = "{n}"\n' for n in "ab")
    )
    details = cli("--json", "--config", str(bad), "config", "validate").json()["error"]["details"]
    assert details == ["repositories: each index must be unique"]


def test_set_refuses_invalid_value_and_keeps_file(cli, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("shares = 1\n")
    before = path.read_bytes()
    result = cli("--config", str(path), "config", "set", "shares", "9")
    assert result.exit_code == 2, result
    assert "shares:" in result.stderr
    assert path.read_bytes() == before


def test_set_with_stale_revision_is_a_conflict(cli, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("shares = 1\n")
    first = cli("--json", "--config", str(path), "config", "show").json()["revision"]
    assert cli("--config", str(path), "config", "set", "check_interval", "60").exit_code == 0
    content = path.read_bytes()
    stale = cli(
        "--json", "--config", str(path), "config", "set", "shares", "2", "--if-revision", first
    )
    assert stale.exit_code == 1, stale
    assert stale.json()["error"]["code"] == "conflict"
    assert path.read_bytes() == content


def test_set_nested_key_creates_tables(cli, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("")
    assert (
        cli("--config", str(path), "config", "set", "forge.url", "http://127.0.0.1:3000").exit_code
        == 0
    )
    result = cli("--json", "--config", str(path), "config", "show")
    assert result.json()["config"]["forge"]["url"] == "http://127.0.0.1:3000"


def test_two_concurrent_writers_cannot_both_win(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("shares = 1\n")
    revision = run_process("--json", "--config", str(path), "config", "show").json()["revision"]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aiworker",
                "--json",
                "--config",
                str(path),
                "config",
                "set",
                "shares",
                str(value),
                "--if-revision",
                revision,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for value in (2, 3)
    ]
    outcomes = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        outcomes.append((proc.returncode, json.loads(out)))
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 1], outcomes
    winner = next(doc for code, doc in outcomes if code == 0)
    loser = next(doc for code, doc in outcomes if code == 1)
    assert loser["error"]["code"] == "conflict"
    assert (
        run_process("--json", "--config", str(path), "config", "show").json()["revision"]
        == winner["revision"]
    )


def test_controller_lease_follows_a_long_check_interval_unless_set(cli, tmp_path):
    """An idle controller renews only when it ticks: without a lease of its own, a long
    check interval lengthens the lease; a lease set shorter than the interval is refused."""
    from aiworker.config.models import Config

    assert Config(check_interval=60).controller_lease == 300
    assert Config().controller_lease == 3 * Config().check_interval
    assert Config(check_interval=600).controller_lease == 1800
    assert Config(check_interval=600, controller={"lease": 900}).controller_lease == 900
    config = tmp_path / "config.toml"
    config.write_text("check_interval = 600\n")
    assert cli("--config", str(config), "config", "validate").exit_code == 0
    config.write_text("check_interval = 600\n[controller]\nlease = 300\n")
    result = cli("--config", str(config), "config", "validate")
    assert result.exit_code == 2, result
    assert "controller.lease (300 s) must be longer than check_interval (600 s)" in result.stderr


def test_the_ci_identity_is_one_of_the_token_sources(cli, tmp_path, monkeypatch):
    """Its token is masked like the others' and hidden from jobs (a token_file)."""
    token = tmp_path / "ci.token"
    token.write_text(CANARY + "\n")
    path = tmp_path / "config.toml"
    path.write_text(
        f'[forge]\nurl = "http://127.0.0.1:1"\n[forge.identities.ci]\ntoken_file = "{token}"\n'
    )
    shown = cli("--json", "--config", str(path), "config", "show")
    assert shown.json()["tokens"]["ci"] == {
        "source": f"file:{token}",
        "present": True,
        "state": "present",
    }
    from aiworker.config.loader import load_config
    from aiworker.core.context import Environment
    from aiworker.core.guests.backends import host_secrets

    env = Environment(tmp_path / "state", load_config(path, required=True))
    assert token in host_secrets(env)


def test_concurrent_sets_of_different_keys_without_a_revision_all_land(tmp_path):
    """Without --if-revision each `config set` edits the file as it is when its turn comes
    (under the save lock), so sets of different keys racing each other all land."""
    path = tmp_path / "config.toml"
    path.write_text("# the operator's note\nshares = 1\n")
    values = {
        "shares": "2",
        "retention.artifact_days": "9",
        "runners.lease_seconds": "45",
        "runners.max_attempts": "4",
        "runners.queue_seconds": "900",
        "execution.memory_mib": "2048",
        "execution.cpus": "3",
        "storage.reserve_gib": "2.5",
    }
    argv = [sys.executable, "-m", "aiworker", "--config", str(path), "config", "set"]
    procs = [
        subprocess.Popen([*argv, key, value], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for key, value in values.items()
    ]
    failed = [(p.args[-2:], p.communicate(timeout=120)) for p in procs]
    assert [f for f, p in zip(failed, procs, strict=True) if p.returncode != 0] == []
    shown = run_process("--json", "--config", str(path), "config", "show").json()["config"]
    for key, value in values.items():
        table, _, name = key.rpartition(".")
        assert str((shown[table] if table else shown)[name]) == value, key
    assert path.read_text().startswith("# the operator's note\n")
