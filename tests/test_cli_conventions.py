"""CLI conventions a user meets: global options anywhere, -h, an Examples section and named
metavars in every command's help, help text for every option, shell completion."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command

import aiworker
from aiworker.arguments import normalized
from aiworker.cli import build_app
from aiworker.cli_help import EXAMPLES, describe, leaves
from aiworker.store.engine import Database
from aiworker.store.task_records import create_task, ensure_repository
from tests.helpers import run_process

TREE = describe(get_command(build_app()))
COMMANDS = [path for path, _command in leaves(TREE)]
AIWORKER = str(Path(sys.executable).parent / "aiworker")


@pytest.mark.parametrize("path", COMMANDS)
def test_every_command_has_examples_named_metavars_and_help_for_each_option(cli, path):
    shown = cli(*path.split(), "--help")
    assert shown.exit_code == 0, shown
    text = shown.stdout
    # -h is --help everywhere (in `qemu ssh NAME df -h` it is the guest command's, below).
    assert cli(*path.split(), "-h").stdout == text
    examples = text[text.index("Examples:") :].splitlines()[1:]
    assert examples, text
    for line in examples:
        assert line.strip().removeprefix("sudo ").startswith(f"aiworker {path}"), line
    assert not re.search(r"<[a-z ]+>|\{[a-z_]+\}", text), text  # no <str>, {task}
    [(_, command)] = [leaf for leaf in leaves(TREE) if leaf[0] == path]
    for param in command.params:
        assert param.help, f"{path}: {param.name} has no help text"


def test_examples_name_only_commands_that_exist():
    assert sorted(EXAMPLES) == sorted(COMMANDS)


def test_global_options_work_after_the_subcommand_and_h_is_help(upgraded, cli, state_dir):
    before = run_process("--json", "--state-dir", str(state_dir), "status")
    after = run_process("status", "--json", "--state-dir", str(state_dir))
    assert after.exit_code == before.exit_code == 0, after
    assert after.json().keys() == before.json().keys()
    assert after.json()["tasks"] == before.json()["tasks"]
    shown = cli("task", "show", "1", "--json")
    assert shown.exit_code == 2
    assert shown.json()["error"]["message"] == "no task 1"
    assert cli("-h").stdout == cli("--help").stdout
    assert "Usage: aiworker status" in cli("status", "-h").stdout
    # A group without its command prints its help as written, not one escaped line.
    bare = cli("task")
    assert bare.exit_code == 2
    assert bare.stderr.startswith("Usage: aiworker task [OPTIONS] COMMAND")
    assert "\n  show " in bare.stderr
    assert "\\x0a" not in bare.stderr
    # What follows `--` belongs to the command run in a guest (qemu ssh), not to aiworker.
    passed = ["qemu", "ssh", "g", "--", "-v", "--json"]
    assert normalized(passed) == passed
    # ... and what follows `qemu ssh NAME` without one runs there as written.
    guest = ["qemu", "ssh", "g", "grep", "-v", "x", "f", "--json"]
    assert normalized(guest) == guest
    assert normalized(["-v", *guest]) == ["-v", *guest]
    refused = cli("qemu", "ssh", "nosuch", "df", "-h")  # -h is df's here, not help
    assert "Usage:" not in refused.stdout
    assert "nosuch" in refused.stderr
    assert normalized(["task", "list", "-vv", "--config=c.toml"]) == [
        "-vv",
        "--config=c.toml",
        "task",
        "list",
    ]


@pytest.mark.parametrize(
    ("shell", "marker"),
    [
        ("bash", "complete -o default -F _aiworker_completion aiworker"),
        ("zsh", "#compdef aiworker"),
        ("fish", "complete --command aiworker"),
    ],
)
def test_completion_scripts_for_each_shell(cli, shell, marker):
    shown = cli("--show-completion", shell)
    assert shown.exit_code == 0, shown
    assert marker in shown.stdout


def test_an_unknown_shell_is_refused_by_name(cli):
    refused = cli("--show-completion", "tcsh")
    assert refused.exit_code == 2
    assert "'tcsh' is not a supported shell: bash, zsh or fish" in refused.stderr


def test_bash_completes_commands_and_subcommands_through_the_script(tmp_path):
    script = subprocess.run(
        [AIWORKER, "--show-completion", "bash"], capture_output=True, text=True, check=True
    ).stdout
    (tmp_path / "completion.bash").write_text(script)
    probe = (
        f"source {tmp_path / 'completion.bash'}\n"
        "COMP_WORDS=(aiworker ta); COMP_CWORD=1; _aiworker_completion aiworker\n"
        'echo "${COMPREPLY[@]}"\n'
        "COMP_WORDS=(aiworker task s); COMP_CWORD=2; _aiworker_completion aiworker\n"
        'echo "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{Path(AIWORKER).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.splitlines() == ["task", "show"]


def test_install_completion_writes_the_script_into_the_users_shell_setup(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    done = subprocess.run(
        [AIWORKER, "--install-completion", "bash"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done
    assert "bash completion installed in" in done.stdout
    assert "_aiworker_completion" in (tmp_path / ".bash_completions" / "aiworker.sh").read_text()
    assert ".bash_completions/aiworker.sh" in (tmp_path / ".bashrc").read_text()


HUGE = "99999999999999999999999"


@pytest.mark.parametrize(
    "args",
    [
        ("task", "show", HUGE),
        ("task", "retry", HUGE),
        ("task", "cancel", HUGE),
        ("task", "list", "--after", HUGE),
        ("implement", "--task", HUGE, "--slot", "1"),
        ("publish", "--task", HUGE),
        ("ci", "--task", HUGE),
        ("scheduler", "run-step", HUGE),
    ],
)
def test_an_id_past_what_a_row_can_hold_is_refused_as_input(cli, upgraded, args):
    """Beyond a signed 64-bit integer no row can have the id, and SQLite cannot bind it:
    the command says the value is out of range (exit 2), not an internal error."""
    result = cli("--json", *args)
    assert result.exit_code == 2, (args, result)
    message = result.json()["error"]["message"]
    assert f"{HUGE} is not in the range" in message
    assert "9223372036854775807" in message


@pytest.mark.parametrize("option", ["--state-dir", "--config"])
def test_an_empty_path_is_refused_not_taken_for_the_working_directory(
    cli, tmp_path, monkeypatch, option
):
    monkeypatch.chdir(tmp_path)
    result = cli(option, "", "db", "upgrade")
    assert result.exit_code == 2, result
    assert f"Invalid value for '{option}': must not be empty" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("variable", ["AIWORKER_STATE_DIR", "AIWORKER_CONFIG"])
def test_a_blank_path_from_the_environment_is_refused_too(cli, tmp_path, monkeypatch, variable):
    """A variable holding only blanks (a unit's `Environment=AIWORKER_STATE_DIR= `) made a
    folder named " " in the working directory: refused with exit 2, as the options are."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, " ")
    result = cli("--json", "db", "upgrade")
    assert result.exit_code == 2, result
    assert result.json()["error"]["message"] == f"{variable} is blank: unset it, or name a path"
    assert list(tmp_path.iterdir()) == []


def test_a_relative_xdg_home_is_ignored_and_a_mistyped_state_dir_is_not_made(
    cli, tmp_path, monkeypatch
):
    """A relative XDG_STATE_HOME is ignored (as its specification says), not resolved
    against wherever the command runs; `status` on a state directory that does not exist
    says it is not initialised and makes nothing there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AIWORKER_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    result = cli("--json", "db", "upgrade")
    assert result.exit_code == 0, result
    assert (tmp_path / "home/.local/state/aiworker/aiworker.db").is_file()
    assert not (tmp_path / "relative").exists()
    typo = tmp_path / "stat-dir"
    missing = cli("--json", "--state-dir", str(typo), "status")
    assert missing.exit_code == 2, missing
    assert "is not initialised" in missing.json()["error"]["message"]
    assert not typo.exists()


@pytest.mark.parametrize(
    "args",
    [
        ("scheduler", "install", "--dir", ""),
        ("db", "backup", "--to", " "),
    ],
)
def test_an_empty_path_given_to_a_command_is_refused(cli, tmp_path, monkeypatch, args):
    """`--dir "$UNSET"` would have written the units into whatever directory the command
    ran in: every path a command takes refuses an empty value, naming the option."""
    monkeypatch.chdir(tmp_path)
    result = cli("--json", *args)
    assert result.exit_code == 2, result
    message = result.json()["error"]["message"]
    assert f"Invalid value for '{args[-2]}': must not be empty" in message
    assert list(tmp_path.iterdir()) == []


def test_escape_sequences_from_the_forge_never_reach_the_terminal(cli, upgraded):
    """An issue's title is anyone's text: its escape sequences (recolour, retitle the
    window) are shown as \\xNN in every human rendering, and kept as they are in JSON."""
    title = "evil \x1b[31mRED\x1b[0m \x1b]0;pwned\x07 title [/bold][red]"
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        create_task(session, repo.id, "issue", issue_number=1, title=title)
    db.dispose()
    shown = r"evil \x1b[31mRED\x1b[0m \x1b]0;pwned\x07 title [/bold][red]"  # no markup either
    for args in (("task", "list"), ("task", "show", "1")):
        result = cli(*args)
        assert result.exit_code == 0, result
        assert "\x1b" not in result.stdout, args
        assert "\x07" not in result.stdout, args
        assert "[/bold][red]" in result.stdout, args  # text, not rich markup
    assert shown in cli("task", "show", "1").stdout  # the list folds the title
    # A line break in a title would forge a row of the list; a right-to-left override
    # would show what follows it reversed.
    forged = "fix\n2      issue   done     team/app#9   merged \u202etxt.exe"
    with db.write() as session:
        create_task(session, repo.id, "issue", issue_number=2, title=forged)
    db.dispose()
    listed = cli("task", "list").stdout
    assert "\u202e" not in listed
    assert r"\u202etxt.exe" in listed
    assert not any(line.lstrip().startswith("2      issue") for line in listed.splitlines())
    # An operator's pause reason is one line of text: a line break would forge status
    # lines, an escape would reach every later reader's terminal.
    # A line separator or a right-to-left override does the same in other readers.
    for reason in ("disk\x1b[2J", "full\nScheduler: running", "a\u2028b", "\u202eksid"):
        refused = cli("--json", "scheduler", "pause", "--reason", reason)
        assert refused.exit_code == 2, refused
        assert refused.json()["error"]["message"] == (
            "the pause reason must be one line without control characters"
        )
    assert cli("--json", "status").json()["scheduler"]["paused"] is False
    assert cli("--json", "task", "show", "1").json()["title"] == title


def test_operators_mistakes_are_named_with_exit_2_and_change_nothing(cli, upgraded, tmp_path):
    """A revision that is not one, a slot the configuration does not have (the unit would
    count 75 as success), --user and --dir together, and --json --version, which prints one
    JSON document as every --json command does."""
    config = tmp_path / "config.toml"
    config.write_text("shares = 1\n")
    before = config.read_bytes()
    cases = {
        ("config", "set", "shares", "2", "--if-revision", "abc"): (
            "--if-revision 'abc' is not a revision: give the 64 hex digits `aiworker config "
            "show` prints as its revision"
        ),
        ("scheduler", "run-slot", "3"): "slot 3: this configuration has 1 (shares = 1)",
        ("scheduler", "install", "--user", "--dir", str(tmp_path / "units")): (
            "choose one of --user (systemd user units) and --dir DIR"
        ),
    }
    for args, said in cases.items():
        result = cli("--json", "--config", str(config), *args)
        assert result.exit_code == 2, (args, result)
        assert result.json()["error"]["message"] == said
    assert config.read_bytes() == before
    assert not (tmp_path / "units").exists()
    assert cli("--json", "--version").json() == {"version": aiworker.__version__}
    assert cli("--version").stdout == f"aiworker {aiworker.__version__}\n"


def test_a_negative_number_read_as_an_option_is_said_to_be_one(cli):
    result = cli("--json", "task", "show", "-1")
    assert result.exit_code == 2, result
    assert result.json()["error"]["message"] == (
        "No such option: -1 (-1 is a negative number, read as an option; a value that "
        "starts with '-' goes after `--`)"
    )


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_wait_that_is_no_number_of_seconds_is_refused(cli, tmp_path, value):
    """nan passes every range check and would wait for ever, holding maintenance.lock
    while every tick exits 75: it is refused with exit 2, before anything is built."""
    script = tmp_path / "layer.sh"
    script.write_text("true\n")
    for args in (("qemu", "layer", "cache", "--script", str(script)), ("qemu", "provision")):
        result = cli("--json", *args, "--wait", value)
        assert result.exit_code == 2, (args, result)
        assert result.json()["error"]["message"] == f"--wait {value}: a number of seconds"
