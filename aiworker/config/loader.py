"""Reading, validating and describing the configuration file."""

from __future__ import annotations

import hashlib
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from aiworker.config.defaults import CONFIG_MAX_BYTES
from aiworker.config.identities import Identity
from aiworker.config.models import PATTERN_WORDS, Config
from aiworker.errors import ConfigInvalid, key_path, short_of
from aiworker.secrets import TOKEN, register_secret, url_passwords


@dataclass(frozen=True)
class LoadedConfig:
    config: Config
    path: Path
    exists: bool
    # sha256 of the file's bytes; "absent" when there is no file yet.
    revision: str


def revision_of(data: bytes | None) -> str:
    return "absent" if data is None else hashlib.sha256(data).hexdigest()


def problems_of(error: ValidationError) -> list[str]:
    """One line per problem, naming the key path; input values are never echoed."""
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and "[" in p))
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "string_pattern_mismatch":
            message = PATTERN_WORDS.get(item["ctx"]["pattern"], message)
        # A check across keys (the whole document's) names its keys itself.
        lines.append(f"{key_path(loc)}: {message}" if loc else message)
    return lines


def parse_toml(data: bytes, origin: str) -> dict[str, Any]:
    """The TOML document in DATA; a clear error naming ORIGIN and the line otherwise."""
    if data.startswith(b"\xef\xbb\xbf"):  # an editor's mark, invisible in it
        raise ConfigInvalid(
            f"{origin}: starts with a UTF-8 byte-order mark, which TOML does not allow; "
            "save it as UTF-8 without one"
        )
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigInvalid(f"{origin}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigInvalid(f"{origin}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigInvalid(f"{origin}: nested too deeply to be a configuration") from None


def parse_config(data: bytes, origin: str) -> Config:
    return validate_document(parse_toml(data, origin), origin)


def validate_document(document: dict[str, Any], origin: str) -> Config:
    try:
        return Config.model_validate(document)
    except RecursionError:
        raise ConfigInvalid(f"{origin}: nested too deeply to be a configuration") from None
    except ValidationError as exc:
        problems = problems_of(exc)
        count = f"{len(problems)} problem" + ("s" if len(problems) != 1 else "")
        raise ConfigInvalid(f"{origin}: invalid configuration ({count})", problems) from None


TOKEN_MAX_BYTES = 8192  # a token is at most 4096 characters: more is a malformed source


def read_config_bytes(path: Path) -> bytes:
    """PATH's bytes; ConfigInvalid for a file larger than any configuration."""
    with path.open("rb") as handle:
        data = handle.read(CONFIG_MAX_BYTES + 1)
    if len(data) > CONFIG_MAX_BYTES:
        raise ConfigInvalid(f"{path}: larger than 1 MiB; not a configuration file")
    return data


def load_config(path: Path, *, required: bool) -> LoadedConfig:
    """Load PATH; a missing file gives embedded defaults unless REQUIRED."""
    try:
        data = read_config_bytes(path)
    except FileNotFoundError:
        if required:
            raise ConfigInvalid(
                f"no configuration file at {path}: write one with `aiworker --config {path} "
                "config set forge.url URL` and the keys in the README's Configuration section"
            ) from None
        return LoadedConfig(Config(), path, exists=False, revision=revision_of(None))
    except OSError as exc:
        raise short_of(exc, f"{path}: cannot read") or ConfigInvalid(
            f"{path}: cannot read: {exc.strerror}"
        ) from None
    config = parse_config(data, str(path))
    loaded = LoadedConfig(config, path, exists=True, revision=revision_of(data))
    register_config_secrets(loaded)
    return loaded


def token_source(identity: Identity, base: Path) -> str:
    """Where an identity's token comes from, as an operator writes it (never the value)."""
    if identity.token_env is not None:
        return f"env:{identity.token_env}"
    return f"file:{token_path(identity, base)}"


def token_path(identity: Identity, base: Path) -> Path:
    assert identity.token_file is not None
    path = Path(identity.token_file).expanduser()
    return path if path.is_absolute() else base / path


def _raw_token(identity: Identity, base: Path) -> str:
    return _read_token(identity, base)[0]


def _read_token(identity: Identity, base: Path) -> tuple[str, str]:
    """The identity's token as its source holds it (stripped), or "" and why not."""
    if identity.token_env is not None:
        name = identity.token_env
        value = os.environ.get(name, "").strip()
        return value, "" if value else f"${name} is {'empty' if name in os.environ else 'not set'}"
    path = token_path(identity, base)
    try:
        # Read no more than a token can be: more (or a device) is a malformed source.
        with path.open("rb") as handle:
            value = handle.read(TOKEN_MAX_BYTES + 1).decode("utf-8").strip()
    except IsADirectoryError:
        return "", f"{path} is a directory, not a file"
    except PermissionError:
        return "", f"{path}: this user may not read it"
    except OSError as exc:
        return "", f"{path}: {exc.strerror or exc}"
    except UnicodeDecodeError:
        return "", f"{path}: not UTF-8 text"
    return value, "" if value else f"{path} is empty"


def why_no_token(identity: Identity, base: Path) -> str:
    """Why no token can be read from the identity's source (not set, no such file, not
    readable by this user, empty): for the error that says so."""
    return _read_token(identity, base)[1] or f"no token in {token_source(identity, base)}"


def token_state(identity: Identity, base: Path) -> str:
    """present | missing | malformed: what `config show` and `doctor` report."""
    value = _raw_token(identity, base)
    if not value:
        return "missing"
    return "present" if TOKEN.match(value) else "malformed"


def read_token(identity: Identity, base: Path) -> str | None:
    """The token an identity names, or None when its source is empty or missing.

    A source that holds anything but exactly one token raises ConfigInvalid naming the
    source, never its content."""
    value = _raw_token(identity, base)
    if value and not TOKEN.match(value):
        raise ConfigInvalid(
            f"{token_source(identity, base)}: must hold exactly one token on one line "
            "(printable characters, no spaces)"
        )
    return value or None


def register_config_secrets(loaded: LoadedConfig) -> None:
    """Teach the redactor every secret this configuration can reach."""
    if identities_of(loaded.config):
        for _name, identity in identities_of(loaded.config):
            # Raw, so that even a malformed source (refused where it is used) is masked
            # whole and line by line.
            token = _raw_token(identity, loaded.path.parent)
            for part in {token, *token.split()}:
                register_secret(part)
    for url in config_urls(loaded.config):
        for password in url_passwords(url):
            register_secret(password)


def config_urls(config: Config) -> list[str]:
    """Every URL the configuration holds that may carry a password: the database's, the
    forge's and each provider's base_url."""
    forge = config.forge
    found = [config.database.url, forge.url if forge is not None else None]
    found += [options.base_url for options in config.provider_options.values()]
    return [str(url) for url in found if url]


def identities_of(config: Config) -> list[tuple[str, Identity]]:
    """Every token source: the forge identities and the runner tokens (runner-N)."""
    runners = [(f"runner-{n}", ident) for n, ident in enumerate(config.runners.tokens, 1)]
    if config.forge is None:
        return runners
    ids = config.forge.identities
    pairs = [
        ("planner", ids.planner),
        ("worker", ids.worker),
        ("reviewer", ids.reviewer),
        ("operator", ids.operator),
        ("ci", ids.ci),
    ]
    return [(name, ident) for name, ident in pairs if ident is not None] + runners
