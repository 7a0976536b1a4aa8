"""The command line as the command tree expects it, however the operator wrote it.

Global options (`--json`, `--config PATH`, `--state-dir PATH`, `-v`) may be written
after the subcommand as well as before it (`aiworker status --json`): they are moved
in front of the command. A completion option given without a shell gets the value
that means "this shell". Nothing after a `--` is touched, nor anything after a command
that passes its arguments on (`qemu ssh NAME grep -v x f` runs `grep -v x f`).
"""

from __future__ import annotations

import re

from aiworker import completion

GLOBAL_FLAGS = ("--json", "--verbose")
GLOBAL_WITH_VALUES = ("--config", "--state-dir")
COMPLETION_OPTIONS = ("--show-completion", "--install-completion")
_VERBOSE = re.compile(r"-v+")
# Commands whose further arguments belong to a program they run.
PASSTHROUGH = (("qemu", "ssh"),)


def normalized(args: list[str]) -> list[str]:
    """ARGS with the global options first and completion options given a value."""
    cut = args.index("--") if "--" in args else len(args)
    head, tail = args[:cut], args[cut:]
    front: list[str] = []
    rest: list[str] = []
    named: list[str] = []  # the command path so far
    index = 0
    while index < len(head):
        arg = head[index]
        if tuple(named) in PASSTHROUGH:
            rest += head[index:]
            break
        if arg in GLOBAL_WITH_VALUES and index + 1 < len(head):
            front += head[index : index + 2]
            index += 2
            continue
        if arg in COMPLETION_OPTIONS:
            following = head[index + 1] if index + 1 < len(head) else "-"
            given = not following.startswith("-")
            front += [arg, following if given else completion.DETECT]
            index += 2 if given else 1
            continue
        is_global = arg in GLOBAL_FLAGS or _VERBOSE.fullmatch(arg) is not None
        is_global = is_global or arg.startswith(tuple(f"{o}=" for o in GLOBAL_WITH_VALUES))
        (front if is_global else rest).append(arg)
        if not is_global and not arg.startswith("-"):
            named.append(arg)
        index += 1
    return front + rest + tail
