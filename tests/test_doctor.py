"""doctor: each check reported as ok / warn / fail, exit 1 when any fails."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import pytest

from aiworker.store.schema import HEAD_REVISION
from tests.helpers import configure


def checks_by_name(result):
    return {c["name"]: c for c in result.json()["checks"]}


@pytest.fixture
def minimal_config(tmp_path, monkeypatch):
    path = tmp_path / "minimal.toml"
    path.write_text("shares = 1\n")
    monkeypatch.setenv("AIWORKER_CONFIG", str(path))
    return path


def test_fresh_machine_has_no_failures(cli, upgraded, minimal_config):
    result = cli("--json", "doctor")
    assert result.exit_code == 0, result
    checks = checks_by_name(result)
    assert checks["database"]["status"] == "ok"
    assert checks["state-dir"]["status"] == "ok"
    assert checks["git"]["status"] == "ok"
    assert checks["git"]["detail"].startswith("git version")
    assert checks["config"]["status"] == "ok"
    assert checks["forge"]["status"] == "warn"  # nothing configured to poll
    assert checks["accelerator"]["status"] in ("ok", "warn")
    # No guest image here: phases fall back to this host, and doctor says so.
    assert checks["guest-image"]["status"] == "warn"
    assert checks["execution"]["status"] == "warn"
    assert checks["execution"]["detail"].startswith("local: ")
    assert result.json()["ok"] is True


def test_a_configured_qemu_backend_without_an_image_fails(cli, upgraded, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[execution]\nbackend = "qemu"\n')
    result = cli("--json", "--config", str(path), "doctor")
    assert result.exit_code == 1, result
    execution = checks_by_name(result)["execution"]
    assert execution["status"] == "fail"
    assert "qemu configured, but" in execution["detail"]


def test_a_missing_configuration_fails_and_says_what_to_run(cli, upgraded, tmp_path):
    missing = tmp_path / "nowhere" / "config.toml"
    result = cli("--json", "--config", str(missing), "doctor")
    assert result.exit_code == 1, result
    config = checks_by_name(result)["config"]
    assert config["status"] == "fail"
    assert str(missing) in config["detail"]
    assert f"aiworker --config {missing} config set forge.url" in config["detail"]


def test_missing_database_is_a_warning_with_the_fix(cli, minimal_config):
    result = cli("--json", "doctor")
    assert result.exit_code == 0, result
    assert "aiworker db upgrade" in checks_by_name(result)["database"]["detail"]


def test_invalid_config_fails(cli, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("shares = 0\n")
    result = cli("--json", "--config", str(path), "doctor")
    assert result.exit_code == 1, result
    failures = [c for c in result.json()["checks"] if c["status"] == "fail"]
    assert any("shares:" in c["detail"] for c in failures)


def test_missing_token_fails(cli, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[forge]\nurl = "http://127.0.0.1:1"\n'
        '[forge.identities.worker]\ntoken_file = "missing.token"\n'
    )
    result = cli("--json", "--config", str(path), "doctor")
    assert result.exit_code == 1, result
    assert checks_by_name(result)["token:worker"]["status"] == "fail"


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ('token_file = "missing.token"', "{dir}/missing.token: No such file or directory"),
        ('token_file = "folder"', "{dir}/folder is a directory, not a file"),
        ('token_file = "empty.token"', "{dir}/empty.token is empty"),
        ('token_file = "latin1.token"', "{dir}/latin1.token: not UTF-8 text"),
        ('token_env = "AIWORKER_TEST_UNSET_TOKEN"', "$AIWORKER_TEST_UNSET_TOKEN is not set"),
    ],
)
def test_a_token_that_cannot_be_read_says_which_source_and_why(cli, tmp_path, source, why):
    """doctor and the commands that need the token name the source and what is wrong
    with it, not only that no token could be read."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "empty.token").write_text("\n")
    (tmp_path / "latin1.token").write_bytes(b"caf\xe9\n")
    path = tmp_path / "c.toml"
    path.write_text(f'[forge]\nurl = "http://127.0.0.1:1"\n[forge.identities.worker]\n{source}\n')
    why = why.format(dir=tmp_path)
    result = cli("--json", "--config", str(path), "doctor")
    assert checks_by_name(result)["token:worker"]["detail"] == f"no token readable: {why}"
    polled = cli("--json", "--config", str(path), "poll")
    assert polled.exit_code == 2, polled
    assert polled.json()["error"]["message"] == (
        f"forge.identities.worker: no token readable: {why}"
    )


def test_open_state_dir_is_a_warning(cli, upgraded, state_dir):
    os.chmod(state_dir, 0o755)
    result = cli("--json", "doctor")
    assert checks_by_name(result)["state-dir"]["status"] == "warn"
    assert "0755" in checks_by_name(result)["state-dir"]["detail"]


def test_doctor_as_the_first_command_makes_the_state_directory_private(cli, tmp_path):
    """Run first, with providers whose homes it makes (codex, claude), doctor makes the
    state directory and every folder above those homes 0700, as every command does."""
    path = tmp_path / "c.toml"
    path.write_text('providers = ["codex", "claude"]\n')
    fresh = tmp_path / "fresh" / "state"
    cli("--json", "--config", str(path), "--state-dir", str(fresh), "doctor")
    modes = {p.relative_to(tmp_path): p.stat().st_mode & 0o777 for p in (fresh, *fresh.rglob("*"))}
    assert modes[fresh.relative_to(tmp_path)] == 0o700
    assert set(modes.values()) == {0o700}, modes
    again = cli("--json", "--config", str(path), "--state-dir", str(fresh), "doctor")
    assert checks_by_name(again)["state-dir"]["status"] == "ok"


def test_human_output_has_one_entry_per_check_its_detail_folded_under_it(
    cli, upgraded, minimal_config
):
    result = cli("doctor")
    assert result.exit_code == 0, result
    lines = result.stdout.strip("\n").splitlines()
    assert any(line.split()[:2] == ["ok", "database"] for line in lines), lines
    entries = [line for line in lines if not line.startswith(" " * 21)]
    assert all(line.split()[0] in ("ok", "warn", "fail") for line in entries), lines
    checks = cli("--json", "doctor").json()["checks"]
    assert len(entries) == len(checks)
    assert all(len(line) <= 80 for line in lines), lines


def test_doctor_sees_the_forge_each_identity_and_each_repository(
    cli, upgraded, forge, tmp_path, monkeypatch
):
    configure(tmp_path, forge, monkeypatch)
    result = cli("--json", "doctor")
    assert result.exit_code == 0, result
    checks = checks_by_name(result)
    assert checks["forge"]["status"] == "ok"
    assert forge.url in checks["forge"]["detail"]
    assert "version" in checks["forge"]["detail"]
    assert checks["identity:worker"]["detail"] == "worker-bot, configured as the worker"
    assert checks["identity:reviewer"]["detail"] == "reviewer-bot, configured as the reviewer"
    assert checks["repository:team/app"]["status"] == "ok"
    assert "worker-bot write" in checks["repository:team/app"]["detail"]

    # A token revoked on the forge: named by its identity and source, never its value.
    state = forge.app.state
    with state.lock:
        state.data["users"]["reviewer-bot"]["token"] = "0" * 40
        state.save()
    result = cli("--json", "doctor")
    assert result.exit_code == 1, result
    reviewer = checks_by_name(result)["identity:reviewer"]
    assert reviewer == {
        "name": "identity:reviewer",
        "status": "fail",
        "detail": "the forge refuses the token from env:AIWORKER_TEST_REVIEWER_TOKEN",
    }
    assert forge.tokens["reviewer-bot"] not in result.stdout
    with state.lock:
        state.data["users"]["reviewer-bot"]["token"] = forge.tokens["reviewer-bot"]
        state.save()
    assert cli("--json", "doctor").exit_code == 0

    # A bot that lost Write on the repository: the repository is named, and the bot.
    admin = forge.client("admin")
    admin.add_collaborator("team", "app", "worker-bot", "read")
    result = cli("--json", "doctor")
    assert result.exit_code == 1, result
    repository = checks_by_name(result)["repository:team/app"]
    assert repository["status"] == "fail"
    assert "worker-bot has read" in repository["detail"]
    admin.add_collaborator("team", "app", "worker-bot", "write")
    assert cli("--json", "doctor").exit_code == 0


def test_a_stopped_forge_fails_doctor_and_poll_names_the_url_and_cause(
    cli, upgraded, forge, tmp_path, monkeypatch
):
    configure(tmp_path, forge, monkeypatch)
    assert cli("poll").exit_code == 0
    forge.stop()
    result = cli("--json", "doctor")
    assert result.exit_code == 1, result
    detail = checks_by_name(result)["forge"]["detail"]
    assert forge.url in detail, detail
    assert "connection refused" in detail, detail

    polled = cli("poll")
    assert polled.exit_code == 75, polled  # a stopped forge may come back by itself
    assert forge.url in polled.stderr
    assert "connection refused" in polled.stderr
    polled = cli("poll")
    result = cli("--json", "doctor")
    poll = checks_by_name(result)["poll"]
    assert poll["status"] == "fail"
    assert poll["detail"].startswith("2 polls in a row failed")
    assert "connection refused" in poll["detail"]
    status = cli("--json", "status").json()
    assert status["poll_failures"] == 2
    assert forge.url in status["poll_error"]


def test_an_overdue_tick_fails_doctor(cli, upgraded, minimal_config, state_dir):
    long_ago = (datetime.now(UTC) - timedelta(seconds=3 * 180)).isoformat()
    (state_dir / "scheduler.json").write_text(json.dumps({"last_check": long_ago}))
    result = cli("--json", "doctor")
    assert result.exit_code == 1, result
    assert checks_by_name(result)["scheduler"]["detail"].startswith("overdue: the last check")
    recent = datetime.now(UTC).isoformat()
    (state_dir / "scheduler.json").write_text(json.dumps({"last_check": recent}))
    assert cli("--json", "doctor").exit_code == 0


def test_the_database_check_names_the_engine_its_version_and_the_round_trip(
    cli, store_url, postgres, tmp_path, monkeypatch
):
    if store_url.startswith("sqlite"):  # (the PostgreSQL store comes with a configuration)
        (tmp_path / "minimal.toml").write_text("shares = 1\n")
        monkeypatch.setenv("AIWORKER_CONFIG", str(tmp_path / "minimal.toml"))
    result = cli("--json", "doctor")
    database = checks_by_name(result)["database"]
    assert database["status"] == "ok", database
    assert " round trip " in database["detail"]
    assert database["detail"].endswith("schema at " + HEAD_REVISION)
    if store_url.startswith("postgresql"):
        assert database["detail"].startswith("PostgreSQL 15.")
        assert f"at 127.0.0.1:{postgres.port}/" in database["detail"]
        assert postgres.password not in result.output
        # The server away: the check fails saying where and why, and the rest still run.
        away = store_url.replace(f":{postgres.port}/", ":1/")
        (tmp_path / "away.toml").write_text(f'[database]\nurl = "{away}"\n')
        monkeypatch.setenv("AIWORKER_CONFIG", str(tmp_path / "away.toml"))
        result = cli("--json", "doctor")
        assert result.exit_code == 1
        database = checks_by_name(result)["database"]
        assert database["status"] == "fail"
        assert database["detail"] == (
            "PostgreSQL at 127.0.0.1:1/"
            + store_url.rsplit("/", 1)[1]
            + " refuses connections: is the server running there?"
        )
        assert checks_by_name(result)["git"]["status"] == "ok"
    else:
        assert database["detail"].startswith("SQLite 3.")
