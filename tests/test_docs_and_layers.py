"""Standing checks: every command documented, layers kept, modules small."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from typer.main import get_command

from aiworker.cli import app

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "aiworker"


def leaf_commands():
    def walk(command, prefix):
        subcommands = getattr(command, "commands", None)
        if not subcommands:
            yield prefix, command
            return
        for name, sub in subcommands.items():
            yield from walk(sub, [*prefix, name])

    return list(walk(get_command(app), []))


def test_every_command_has_help_and_a_readme_entry():
    """Each command has its row in the README's one command table (a blank line inside it
    once turned forty rows into a paragraph of pipes)."""
    readme = (ROOT / "README.md").read_text()
    reference = readme.split("## Command reference", 1)[1]
    table = reference.split("| command | what it does |\n", 1)[1]
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), table.splitlines()))
    commands = leaf_commands()
    assert len(commands) >= 7
    for path, command in commands:
        name = " ".join(path)
        assert (command.help or "").strip(), f"{name} has no help text"
        row = [r for r in rows if r.startswith(f"| `aiworker {name}") or f"/ `aiworker {name}" in r]
        assert row, f"{name} has no row in the README's command table"


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted((PACKAGE / "commands").glob("*.py")), ids=lambda p: p.name)
def test_commands_stay_thin(path):
    forbidden = imports_of(path) & {"sqlalchemy", "requests", "paramiko", "subprocess"}
    assert not forbidden, f"{path.name} imports {forbidden}"
    assert len(path.read_text().splitlines()) <= 150


DOMAIN = [
    p for layer in ("core", "store", "adapters", "runtime") for p in (PACKAGE / layer).rglob("*.py")
]


@pytest.mark.parametrize("path", DOMAIN, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_domain_code_never_prints_or_exits(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("print", "exit"), f"{path}:{node.lineno}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            call = f"{node.value.id}.{node.attr}"
            assert call not in ("sys.exit", "typer.echo", "os._exit"), f"{path}:{node.lineno}"
    assert not imports_of(path) & {"typer", "rich", "aiworker.commands"}


def test_core_never_imports_commands():
    for path in (PACKAGE / "core").rglob("*.py"):
        assert "aiworker.commands" not in path.read_text()


def test_all_sql_lives_in_store():
    for path in PACKAGE.rglob("*.py"):
        if "store" in path.relative_to(PACKAGE).parts:
            continue
        assert "sqlalchemy" not in imports_of(path), path
        assert "sqlite3" not in imports_of(path), path


def test_no_module_over_400_lines():
    for path in PACKAGE.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path


def test_every_dependency_is_pinned_in_the_constraints():
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    pins = {
        re.split(r"==", line)[0].lower().replace("_", "-")
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    for requirement in wanted:
        name = re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pins, f"{name} has no pin in constraints.txt"
    assert "-e '.[dev]' -c constraints.txt" in (ROOT / "Makefile").read_text()


# Spelled in pieces, so that this test does not find itself.
NEEDLES = ("../" + "sha" + "red", '"' + "sha" + "red" + '"')


def test_nothing_reads_from_a_shared_folder_beside_the_clone():
    """A user's clone has no shared folder beside it: code, tests and tools never need one."""
    offenders = []
    for folder in ("aiworker", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ""):
                text = path.read_text(errors="replace")
                if any(needle in text for needle in NEEDLES):
                    offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
    assert not any(needle in (ROOT / "Makefile").read_text() for needle in NEEDLES)
