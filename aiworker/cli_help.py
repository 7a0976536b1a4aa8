"""What every command's help shows beyond its own docstring: examples and metavars.

Applied to the command tree main() runs, so `aiworker CMD -h` ends with a short
Examples section and every option names what it takes (PATH, N, URL, ADDR:PORT)
instead of Typer's `<str>`, `<int range>` and `{name}`. Every path it takes refuses an
empty value there too: Path("") is the working directory, so `--dir "$UNSET"` would
quietly write there.
"""

from __future__ import annotations

from typing import Any

from typer._click.core import Context
from typer.core import TyperArgument, TyperGroup
from typer.models import TyperPath

EXAMPLES: dict[str, tuple[str, ...]] = {
    "status": ("aiworker status", "aiworker status --json"),
    "doctor": ("aiworker doctor", "aiworker doctor --json"),
    "poll": ("aiworker poll", "aiworker poll --full --json"),
    "claim": ("aiworker claim", "aiworker claim --slot 2 --json"),
    "plan": ("aiworker plan --task 4 --slot 1",),
    "implement": ("aiworker implement --task 3 --slot 1",),
    "repair": ("aiworker repair --task 3 --slot 1",),
    "publish": ("aiworker publish --task 3",),
    "ci": ("aiworker ci --task 3 --json",),
    "review": ("aiworker review --task 3",),
    "merge": ("aiworker merge --task 3",),
    "milestones": ("aiworker milestones --task 4",),
    "cleanup": ("aiworker cleanup", "aiworker cleanup --json"),
    "retention": ("aiworker retention --dry-run", "aiworker retention --json"),
    "config show": ("aiworker config show", "aiworker config show --json"),
    "config validate": ("aiworker config validate --config ./config.toml",),
    "config set": (
        "aiworker config set shares 3",
        'aiworker config set forge.url "https://forge.example.org"',
        "aiworker config set budgets.implementation 4 --if-revision 7c1e...",
    ),
    "db upgrade": ("aiworker db upgrade",),
    "db current": ("aiworker db current --json",),
    "db backup": (
        "aiworker db backup --to /var/backups/aiworker.db",
        "aiworker db backup --to /var/backups/aiworker.db --with-artifacts /var/backups/artifacts",
    ),
    "db copy": ("aiworker db copy --to postgresql://aiworker@db.example.org/aiworker",),
    "restore": (
        "aiworker restore --from /var/backups/aiworker.db --artifacts /var/backups/artifacts",
    ),
    "scheduler tick": ("aiworker scheduler tick", "aiworker scheduler tick --if-due"),
    "scheduler pause": ('aiworker scheduler pause --reason "forge upgrade"',),
    "scheduler resume": ("aiworker scheduler resume",),
    "scheduler start-now": ("aiworker scheduler start-now",),
    "scheduler status": ("aiworker scheduler status --json",),
    "scheduler run-slot": ("aiworker scheduler run-slot 1",),
    "scheduler run-step": ("aiworker scheduler run-step 3",),
    "scheduler install": (
        "aiworker scheduler install --user",
        "aiworker scheduler install --user --web 127.0.0.1:8765",
        "aiworker scheduler install --dir ./units",
    ),
    "runner schema": ("aiworker runner schema request", "aiworker runner schema result"),
    "runner execute": (
        "aiworker runner execute --request job.json --source-root ~/src",
        "aiworker runner execute < job.json",
    ),
    "runner serve": (
        "aiworker runner serve --server http://10.0.0.1:8766 --worker-id build-1",
        "aiworker runner serve --server http://10.0.0.1:8766 --worker-id build-1 --once",
    ),
    "runner run-job": (
        "aiworker runner run-job --server http://10.0.0.1:8766 "
        "--repository-index 1 --worker-job-index 12",
    ),
    "runner doctor": ("aiworker runner doctor --server http://10.0.0.1:8766",),
    "qemu provision": ("sudo aiworker qemu provision", "sudo aiworker qemu provision --wait 600"),
    "qemu layer": ("sudo aiworker qemu layer node --script ./node-layer.sh",),
    "qemu list": ("aiworker qemu list", "aiworker qemu list --json"),
    "qemu boot": ("aiworker qemu boot", "aiworker qemu boot --cold"),
    "qemu ssh": ("aiworker qemu ssh ci-3f2a", "aiworker qemu ssh ci-3f2a -- systemctl status"),
    "qemu stop": ("aiworker qemu stop ci-3f2a",),
    "sandbox serve": ("aiworker sandbox serve --data ./forge --port 3000",),
    "sandbox seed": ("aiworker sandbox seed --data ./forge",),
    "web serve": (
        "aiworker web serve",
        "aiworker web serve --listen 127.0.0.1:8765 --runner-listen 10.0.0.1:8766",
    ),
    "providers status": ("aiworker providers status", "aiworker providers status --json"),
    "providers check": ("aiworker providers check codex", "aiworker providers check llama --json"),
    "task list": ("aiworker task list", "aiworker task list --state failed --json"),
    "task show": ("aiworker task show 3", "aiworker task show 3 --json"),
    "task retry": ("aiworker task retry 3",),
    "task resume": ("aiworker task resume 3",),
    "task cancel": ("aiworker task cancel 3",),
}

# What a parameter takes, by its name; then by the end of its name; then by its type.
METAVARS = {
    "task": "ID",
    "after": "ID",
    "worker_id": "ID",
    "slot": "N",
    "repository_index": "N",
    "worker_job_index": "N",
    "key": "KEY",
    "value": "VALUE",
    "name": "NAME",
    "state": "STATE",
    "reason": "TEXT",
    "if_revision": "REVISION",
    "request": "PATH",
    "dir": "DIR",
    "data": "DIR",
    "artifacts": "DIR",
    "with_artifacts": "DIR",
    "server": "URL",
    "runner_server": "URL",
    "public_origin": "URL",
    "web": "ADDR:PORT",
    "listen": "ADDR:PORT",
    "runner_listen": "ADDR:PORT",
    "host": "ADDR",
    "port": "PORT",
    "wait": "SECONDS",
}
SUFFIXES = {"_ms": "MS", "_gib": "GIB", "_bytes": "BYTES"}
TYPES = {"path": "PATH", "integer": "N", "integer range": "N", "float": "SECONDS"}


class _PlainArgument(TyperArgument):
    """An argument shown as NAME in the usage line, not {name}."""

    def make_metavar(self, ctx: Context, *, usage: bool = False) -> str:
        var = self.metavar or (self.name or "").upper()
        return var if self.required or not usage else f"[{var}]"


def metavar(param: Any) -> str:
    name = param.name or ""
    if name in METAVARS:
        return METAVARS[name]
    for suffix, shown in SUFFIXES.items():
        if name.endswith(suffix):
            return shown
    return TYPES.get(param.type.name, name.upper())


def leaves(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """Every runnable command under COMMAND with its path ("task show")."""
    if isinstance(command, TyperGroup):
        return [
            leaf for name, sub in command.commands.items() for leaf in leaves(sub, (*path, name))
        ]
    return [(" ".join(path), command)]


def describe(root: Any) -> Any:
    """ROOT (the click command main() runs) with examples and metavars set; returned."""
    for path, command in leaves(root):
        examples = EXAMPLES.get(path)
        if examples:
            # \b keeps the lines as written instead of rewrapping them into one paragraph.
            command.epilog = "\b\nExamples:\n" + "\n".join(f"  {line}" for line in examples)
        for param in command.params:
            if isinstance(param, TyperArgument):
                param.__class__ = _PlainArgument
            if isinstance(param.type, TyperPath):
                param.type.__class__ = _GivenPath
            _name_what_it_takes(param)
    for param in root.params:
        _name_what_it_takes(param)
    return root


def _name_what_it_takes(param: Any) -> None:
    takes_value = not (getattr(param, "is_flag", False) or getattr(param, "count", False))
    if param.metavar is None and takes_value:
        param.metavar = metavar(param)


class _GivenPath(TyperPath):
    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("must not be empty (it would be the working directory)", param, ctx)
        return super().convert(value, param, ctx)
