"""`aiworker config`: show, validate and change the configuration file."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

app = typer.Typer(
    help="Show, validate and change the configuration.", no_args_is_help=True, rich_markup_mode=None
)


@app.command("show")
def show(ctx: typer.Context) -> None:
    """Print the effective configuration with every secret redacted."""
    from aiworker.core.maintenance.configuration import describe_config

    inv: Invocation = ctx.obj
    description = describe_config(inv.config()).to_json()

    def human(console: Any) -> None:
        import tomli_w

        state = "" if description["exists"] else " (absent: embedded defaults)"
        console.print(f"# {description['path']}{state}")
        console.print(f"# revision {description['revision']}")
        for name, token in description["tokens"].items():
            present = "present" if token["present"] else "MISSING"
            console.print(f"# token {name}: {token['source']} ({present})")
        console.print(tomli_w.dumps(_without_none(description["config"])), markup=False)

    emit(inv.json, description, human)


def _without_none(value: Any) -> Any:
    """TOML has no null: unset keys are left out of the rendering."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value if v is not None]
    return value


@app.command("validate")
def validate(ctx: typer.Context) -> None:
    """Check the configuration file; every problem is named by its key path (exit 2)."""
    inv: Invocation = ctx.obj
    loaded = inv.config()
    result = {"path": str(loaded.path), "exists": loaded.exists, "valid": True}
    message = f"{loaded.path}: valid" + ("" if loaded.exists else " (absent: embedded defaults)")
    emit(inv.json, result, lambda console: console.print(message, markup=False))


@app.command("set")
def set_value(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(help="Dotted key, e.g. shares or forge.url.")],
    value: Annotated[str, typer.Argument(help="A TOML value; bare words are strings.")],
    if_revision: Annotated[
        str | None,
        typer.Option("--if-revision", help="Refuse unless the file is still at this revision."),
    ] = None,
) -> None:
    """Set one key; the file is validated, then replaced atomically (0600)."""
    from aiworker.config.persist import set_config_value

    inv: Invocation = ctx.obj
    before, after = set_config_value(inv.config_path, key, value, if_revision)
    result = {"path": str(inv.config_path), "key": key, "revision": after, "previous": before}
    emit(inv.json, result, lambda c: c.print(f"{key} set; revision {after}", markup=False))
