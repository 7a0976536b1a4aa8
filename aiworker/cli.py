"""The `aiworker` console script: global options, command groups, one error handler."""

from __future__ import annotations

import errno
import gc
import importlib
import re
import sys
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.main import get_command

from aiworker import __version__, completion
from aiworker.arguments import normalized
from aiworker.cli_help import describe
from aiworker.errors import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_UNAVAILABLE,
    FULL_ERRNOS,
    AiworkerError,
    Interrupted,
    short_of,
)
from aiworker.invocation import Invocation, default_config_path, default_state_dir
from aiworker.render import emit, emit_error

# name -> (module in aiworker.commands, attribute, whether it is a group)
COMMANDS = {
    "status": ("status", "status", False),
    "doctor": ("doctor", "doctor", False),
    "poll": ("work", "poll", False),
    "claim": ("work", "claim", False),
    "config": ("config", "app", True),
    "db": ("db", "app", True),
    "scheduler": ("scheduler", "app", True),
    "runner": ("runner", "app", True),
    "qemu": ("qemu", "app", True),
    "sandbox": ("sandbox", "app", True),
    "web": ("web", "app", True),
    "providers": ("providers", "app", True),
    "task": ("task", "app", True),
    "plan": ("phases", "plan", False),
    "implement": ("phases", "implement", False),
    "repair": ("phases", "repair", False),
    "publish": ("delivery", "publish", False),
    "ci": ("delivery", "ci", False),
    "review": ("delivery", "review", False),
    "merge": ("delivery", "merge", False),
    "milestones": ("delivery", "milestones", False),
    "cleanup": ("housekeeping", "cleanup", False),
    "retention": ("housekeeping", "retention", False),
    "restore": ("restore", "restore", False),
}
GLOBAL_OPTIONS_WITH_VALUES = ("--config", "--state-dir")
JSON_MODE: ContextVar[bool] = ContextVar("json_mode", default=False)  # main() sets it


def _print_version(value: bool) -> None:
    if value:  # with --json, one JSON document, as --json promises
        emit(
            JSON_MODE.get(),
            {"version": __version__},
            lambda c: c.print(f"aiworker {__version__}", markup=False),
        )
        raise typer.Exit(0)


def _completion(flag: str, callback: Callable[..., Any], does: str) -> Any:
    """An eager option that does something with SHELL's completion script and exits."""
    shells = "for SHELL (bash, zsh, fish; default: this one)."
    return typer.Option(
        flag, metavar="[SHELL]", is_eager=True, callback=callback, help=f"{does} {shells}"
    )


def root(
    ctx: typer.Context,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="Configuration file (default: $AIWORKER_CONFIG, else "
            "$XDG_CONFIG_HOME/aiworker/config.toml).",
        ),
    ] = None,
    state_dir: Annotated[
        str | None,
        typer.Option(
            "--state-dir",
            help="State directory (default: $AIWORKER_STATE_DIR, else $XDG_STATE_HOME/aiworker).",
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")
    ] = False,
    verbose: Annotated[
        int, typer.Option("-v", "--verbose", count=True, help="Log JSON lines to stderr.")
    ] = 0,
    _version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
    _show_completion: Annotated[
        str | None, _completion("--show-completion", completion.show, "Print the completion script")
    ] = None,
    _install_completion: Annotated[
        str | None, _completion("--install-completion", completion.install, "Install completion")
    ] = None,
) -> None:
    from aiworker import logs

    logs.configure(verbose, json_output)
    for option, value in (("--config", config), ("--state-dir", state_dir)):
        if value is not None and not value.strip():
            # Path("") is the working directory: an empty value would quietly use it.
            raise typer.BadParameter("must not be empty", param_hint=f"'{option}'")
    default_config, explicit = default_config_path()
    ctx.obj = Invocation(
        config_path=Path(config) if config is not None else default_config,
        config_required=config is not None or explicit,
        state_dir=Path(state_dir) if state_dir is not None else default_state_dir(),
        json=json_output,
        verbose=verbose,
    )


def build_app(only: str | None = None) -> typer.Typer:
    """The command tree; with ONLY, just that command, so a tick does not pay for the rest."""
    tree = typer.Typer(
        name="aiworker",
        help="Turn forge issues into reviewed, CI-verified pull requests written by coding agents.",
        no_args_is_help=True,
        add_completion=False,  # ours, taking a shell's name or detecting it: completion.py
        context_settings={"help_option_names": ["-h", "--help"]},
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    tree.callback()(root)
    for name, (module, attribute, group) in COMMANDS.items():
        if only is not None and name != only:
            continue
        target = getattr(importlib.import_module(f"aiworker.commands.{module}"), attribute)
        if group:
            tree.add_typer(target, name=name)
        else:
            tree.command(name)(target)
    return tree


def selected_command(args: list[str]) -> str | None:
    """The command a command line names, if it is one of ours."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in GLOBAL_OPTIONS_WITH_VALUES:
            skip = True
        elif arg == "--" or arg in ("-h", "--help", "--version"):
            return None
        elif not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def __getattr__(name: str) -> typer.Typer:
    # `aiworker.cli.app` (the whole tree) is built on demand: tests and tools walk it,
    # while main() builds only the command a command line names.
    if name == "app":
        return build_app()
    raise AttributeError(name)


def _wants(args: list[str], flag: str) -> bool:
    options = args[: args.index("--")] if "--" in args else args
    return flag in options


def run() -> NoReturn:
    """The console script and `python -m aiworker`: main(), then exit.

    The heap is frozen first, so that the interpreter's collections at exit skip the
    hundreds of thousands of objects that imports created: on an idle scheduler tick
    that sweep cost more than the tick's own work (benchmarks/tick).
    """
    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    args = normalized(list(sys.argv[1:] if argv is None else argv))
    json_mode = _wants(args, "--json")
    JSON_MODE.set(json_mode)
    verbose = any(a in ("-v", "--verbose") or a.startswith("-vv") for a in args)
    try:
        if completion.requested():
            completion.prepare()
        tree = build_app(selected_command(args))
        command = describe(get_command(tree))
        result = command.main(args=args, prog_name="aiworker", standalone_mode=False)
    except AiworkerError as exc:
        emit_error(json_mode, exc.code, exc.message, getattr(exc, "problems", None))
        return exc.exit_code
    except typer.Abort:
        emit_error(json_mode, "aborted", "aborted")
        return EXIT_FAILED
    except typer.TyperException as exc:
        return _usage(json_mode, exc)
    except (KeyboardInterrupt, Interrupted) as exc:  # Ctrl-C; SIGTERM where it unwinds
        emit_error(json_mode, "interrupted", str(exc) or "interrupted")
        return 128 + getattr(exc, "signum", 2)  # 130 for Ctrl-C (SIGINT), 143 for SIGTERM
    except Exception as exc:
        return _unexpected(json_mode, verbose, exc)
    return result if isinstance(result, int) else 0


def _usage(json_mode: bool, exc: typer.TyperException) -> int:
    """A usage error of the vendored click (a bad option, a missing argument), said."""
    format_message = getattr(exc, "format_message", None)
    message = format_message() if format_message else str(exc)
    if type(exc).__name__ == "NoArgsIsHelpError" and not json_mode:
        # A group named without its command: its help, as written (exit 2).
        sys.stderr.write(message.rstrip("\n") + "\n")
        return 2
    if re.fullmatch(r"No such option: -[0-9][0-9.]*", message):
        message += (
            f" ({message.rsplit(' ', 1)[1]} is a negative number, read as an option; "
            "a value that starts with '-' goes after `--`)"
        )
    emit_error(json_mode, "usage", message)
    return int(getattr(exc, "exit_code", 2))


# A state directory or file the file system refuses: named, with what to do.
FILE_SYSTEM_REFUSALS = {
    errno.EROFS: (EXIT_INVALID, "remount it read-write, or use a path on another file system"),
    errno.EACCES: (EXIT_INVALID, "this user may not write there; fix its owner or mode"),
    errno.EPERM: (EXIT_INVALID, "this user may not change it; fix its owner or mode"),
    errno.ENAMETOOLONG: (EXIT_INVALID, "a name in it is longer than the file system allows"),
    errno.ENOTDIR: (EXIT_INVALID, "a part of it is a file, not a directory"),
    errno.ENOSPC: (EXIT_UNAVAILABLE, "the disk is full; free space and try again"),
    errno.EDQUOT: (EXIT_UNAVAILABLE, "the quota is used up; free space and try again"),
}


def _unexpected(json_mode: bool, verbose: bool, exc: BaseException) -> int:
    """A failure no command expected: a file system that refuses a path of ours is named
    with what to do; anything else is one line (the traceback with -v)."""
    if verbose:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, OSError) and exc.errno in FILE_SYSTEM_REFUSALS and exc.filename:
        code, advice = FILE_SYSTEM_REFUSALS[exc.errno]
        emit_error(json_mode, "state_unusable", f"{exc.filename}: {exc.strerror}; {advice}")
        return code
    short = short_of(exc, exc.filename or "this command") if isinstance(exc, OSError) else None
    if short is not None:
        emit_error(json_mode, short.code, short.message)
        return short.exit_code
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
        # A write into an open file names none; the disk is full all the same.
        code, advice = FILE_SYSTEM_REFUSALS[exc.errno]
        emit_error(json_mode, "unavailable", f"{exc.strerror}; {advice}")
        return code
    hint = "" if verbose else "; rerun with -v for details"
    first_line = (str(exc).strip().splitlines() or [""])[0]
    emit_error(json_mode, "internal", f"unexpected {type(exc).__name__}: {first_line}{hint}")
    return EXIT_FAILED
