"""Bad state, bad files and bad tokens: a clear sentence naming the path, exit 2, nothing
changed, and never a secret's content in any output."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from aiworker.secrets import redact, register_secret
from tests.helpers import configure, worker_token_from_file

LINE_ONE = "ghp-canary-first-line-7d1e"
LINE_TWO = "canary-second-line-93b0"


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def two_line_token(tmp_path, monkeypatch, forge):
    config = configure(tmp_path, forge, monkeypatch)
    token = tmp_path / "worker.token"
    token.write_text(f"{LINE_ONE}\n{LINE_TWO}\n")
    token.chmod(0o600)
    worker_token_from_file(config, token)
    return token


def test_a_token_file_with_two_lines_is_refused_by_name_never_by_content(
    cli, upgraded, two_line_token
):
    for args in (("poll",), ("--json", "poll"), ("--json", "scheduler", "tick")):
        result = cli(*args)
        assert LINE_ONE not in result.output, args
        assert LINE_TWO not in result.output, args
    plain = cli("poll")
    assert plain.exit_code == 2, plain
    assert f"file:{two_line_token}: must hold exactly one token on one line" in plain.stderr
    tick = cli("--json", "scheduler", "tick").json()
    assert "must hold exactly one token" in tick["poll_error"]
    shown = cli("--json", "config", "show").json()
    assert shown["tokens"]["worker"] == {
        "source": f"file:{two_line_token}",
        "present": False,
        "state": "malformed",
    }
    doctor = cli("--json", "doctor").json()
    [worker] = [c for c in doctor["checks"] if c["name"] == "token:worker"]
    assert worker["status"] == "fail"
    assert "exactly one token" in worker["detail"]


def test_doctor_fails_a_token_file_others_can_read(cli, upgraded, two_line_token):
    two_line_token.write_text(LINE_ONE + "\n")
    two_line_token.chmod(0o644)
    [worker] = [c for c in cli("--json", "doctor").json()["checks"] if c["name"] == "token:worker"]
    assert worker == {
        "name": "token:worker",
        "status": "fail",
        "detail": f"{two_line_token} is readable by others (mode 0644); chmod 600 it",
    }


def test_a_rejected_token_names_its_identity_and_source(cli, upgraded, two_line_token):
    two_line_token.write_text("not-the-workers-token\n")
    result = cli("--json", "poll")
    assert result.exit_code == 2, result
    message = result.json()["error"]["message"]
    assert message.startswith(
        f"forge.identities.worker: the forge rejected the token from file:{two_line_token}"
    )
    assert "not-the-workers-token" not in result.output


@pytest.mark.parametrize(
    "secret",
    ['tok"en-with\\\\quotes-81c2', "tok\ten-with-a-tab-55f1", "tok/en+with=url&chars-0a9d"],
)
def test_escaped_forms_of_a_secret_are_masked(secret):
    register_secret(secret)
    from urllib.parse import quote

    for text in (json.dumps({"t": secret}), repr(secret), quote(secret, safe=""), secret):
        masked = redact(f"before {text} after")
        assert "before" in masked
        assert masked.count("***") == 1, (text, masked)


def test_a_password_in_a_urls_query_is_masked_and_a_json_document_stays_one():
    """libpq's password= parameter in a URL nobody registered (db copy --to, say): masked
    up to the end of the parameter, never past the string that holds the URL."""
    document = {
        "target": "postgresql://u@db/x?sslmode=require&password=canary-7e1d&connect_timeout=3",
        "rows": 41,
    }
    masked = redact(json.dumps(document, separators=(",", ":")))
    assert "canary-7e1d" not in masked
    assert json.loads(masked) == {
        "target": "postgresql://u@db/x?sslmode=require&password=***&connect_timeout=3",
        "rows": 41,
    }


def test_the_client_key_s_passphrase_in_a_database_url_is_masked_in_config_show(cli, tmp_path):
    """sslpassword= (the passphrase of the client key libpq decrypts) is as secret as the
    password: `config show` masks it in both output modes."""
    config = tmp_path / "c.toml"
    url = "postgresql://u:pw-canary-1@db/x?sslmode=require&sslpassword=ssl-canary-2"
    config.write_text(f'[database]\nurl = "{url}"\n')
    for args in (("config", "show"), ("--json", "config", "show")):
        shown = cli("--config", str(config), *args)
        assert shown.exit_code == 0, shown
        assert "ssl-canary-2" not in shown.stdout + shown.stderr
        assert "pw-canary-1" not in shown.stdout + shown.stderr
        assert "sslpassword=***" in shown.stdout


def test_config_show_renders_any_configuration(cli, tmp_path, monkeypatch, forge):
    assert cli("config", "show").exit_code == 0  # the built-in defaults
    configure(tmp_path, forge, monkeypatch)
    result = cli("config", "show")
    assert result.exit_code == 0, result
    assert "[forge.identities.worker]" in result.stdout


def test_config_set_on_a_malformed_file_names_the_file_and_line(cli, tmp_path, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text("shares = 2\ncheck_interval = \n")
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    before = digest(config)
    result = cli("config", "set", "shares", "3")
    assert result.exit_code == 2, result
    assert f"{config}: not valid TOML" in result.stderr
    assert "line 2" in result.stderr
    assert digest(config) == before


def test_a_database_that_is_not_one_is_refused_untouched(cli, state_dir):
    state_dir.mkdir()
    database = state_dir / "aiworker.db"
    database.write_bytes(b"this is no database\n" * 200)
    before = digest(database)
    for args in (("status",), ("db", "upgrade"), ("scheduler", "tick")):
        result = cli("--json", *args)
        assert result.exit_code == 2, (args, result)
        assert result.json()["error"]["message"] == (
            f"{database}: not a usable aiworker database (file is not a database)"
        )
    assert digest(database) == before
    assert sorted(p.name for p in state_dir.iterdir()) == ["aiworker.db"]


def test_a_truncated_database_is_refused_by_name(cli, upgraded):
    data = upgraded.read_bytes()
    (upgraded.parent / "aiworker.db-wal").unlink(missing_ok=True)
    (upgraded.parent / "aiworker.db-shm").unlink(missing_ok=True)
    upgraded.write_bytes(data[:3000])
    result = cli("--json", "status")
    assert result.exit_code == 2, result
    assert result.json()["error"]["message"].startswith(f"{upgraded}:")


def test_a_state_directory_that_is_a_file_is_refused(cli, state_dir):
    state_dir.write_text("not a directory")
    result = cli("--json", "status")
    assert result.exit_code == 2, result
    assert result.json()["error"] == {
        "code": "state_unusable",
        "message": f"state directory {state_dir} exists and is not a directory",
    }
    assert state_dir.read_text() == "not a directory"


def test_a_newer_schema_is_refused_before_anything_is_written(cli, upgraded):
    conn = sqlite3.connect(upgraded)
    conn.execute("PRAGMA journal_mode = DELETE")
    with conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_future'")
    conn.close()
    before = digest(upgraded)
    for args in (("status",), ("db", "upgrade"), ("scheduler", "tick")):
        result = cli("--json", *args)
        assert result.exit_code == 2, (args, result)
        assert result.json()["error"]["code"] == "schema_mismatch"
    assert digest(upgraded) == before
    assert sorted(p.name for p in upgraded.parent.iterdir() if p.name.startswith("aiworker")) == [
        "aiworker.db"
    ]
