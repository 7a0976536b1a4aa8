"""Shell completion: `aiworker --show-completion [SHELL]` and `--install-completion [SHELL]`.

Typer's own pair either detects the shell (no way to name one) or requires a name (no
way to detect); these take a name when given and detect the running shell when not.
The scripts and the completion itself are Typer's: the script calls `aiworker` back
with `_AIWORKER_COMPLETE` set, and main() then answers from the command tree.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

SHELLS = ("bash", "zsh", "fish")
DETECT = "detect"  # the value of the option given without a shell
COMPLETE_VAR = "_AIWORKER_COMPLETE"


def requested() -> bool:
    """This run answers a completion request of a shell (not a command line)."""
    return COMPLETE_VAR in os.environ


def prepare() -> None:
    """Typer's completion classes, which answer in the form its scripts expect."""
    from typer._completion_classes import completion_init

    completion_init()


def _shell(value: str) -> str:
    if value in SHELLS:
        return value
    if value != DETECT:
        raise typer.BadParameter(f"{value!r} is not a supported shell: bash, zsh or fish")
    from typer._completion_shared import _get_shell_name

    name = _get_shell_name()
    if name not in SHELLS:
        raise typer.BadParameter(
            f"this shell ({name or 'unknown'}) is not bash, zsh or fish; name one, "
            "e.g. --show-completion bash"
        )
    return name


def show(ctx: typer.Context, _param: Any, value: str | None) -> None:
    if value is None or ctx.resilient_parsing:
        return
    from typer._completion_shared import get_completion_script

    script = get_completion_script(
        prog_name="aiworker", complete_var=COMPLETE_VAR, shell=_shell(value)
    )
    sys.stdout.write(script.rstrip("\n") + "\n")
    raise typer.Exit(0)


def install(ctx: typer.Context, _param: Any, value: str | None) -> None:
    if value is None or ctx.resilient_parsing:
        return
    from typer._completion_shared import install as install_script

    shell, path = install_script(
        shell=_shell(value), prog_name="aiworker", complete_var=COMPLETE_VAR
    )
    sys.stdout.write(f"{shell} completion installed in {path}; it takes effect in a new shell\n")
    raise typer.Exit(0)
