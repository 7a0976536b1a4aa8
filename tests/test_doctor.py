"""doctor: each check reported as ok / warn / fail, exit 1 when any fails."""

from __future__ import annotations

import os


def checks_by_name(result):
    return {c["name"]: c for c in result.json()["checks"]}


def test_fresh_machine_has_no_failures(cli, upgraded):
    result = cli("--json", "doctor")
    assert result.exit_code == 0, result
    checks = checks_by_name(result)
    assert checks["database"]["status"] == "ok"
    assert checks["state-dir"]["status"] == "ok"
    assert checks["git"]["status"] == "ok"
    assert checks["git"]["detail"].startswith("git version")
    assert checks["config"]["status"] == "warn"  # no file: embedded defaults
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


def test_missing_database_is_a_warning_with_the_fix(cli):
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


def test_open_state_dir_is_a_warning(cli, upgraded, state_dir):
    os.chmod(state_dir, 0o755)
    result = cli("--json", "doctor")
    assert checks_by_name(result)["state-dir"]["status"] == "warn"
    assert "0755" in checks_by_name(result)["state-dir"]["detail"]


def test_human_output_has_one_line_per_check(cli, upgraded):
    result = cli("doctor")
    assert result.exit_code == 0, result
    lines = result.stdout.strip().splitlines()
    assert any(line.split()[:2] == ["ok", "database"] for line in lines), lines
    assert all(line.split()[0] in ("ok", "warn", "fail") for line in lines)
