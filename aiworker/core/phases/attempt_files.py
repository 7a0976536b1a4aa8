"""What an attempt leaves for the operator: its prompt, its result document and the end
of what the provider printed, under $STATE_DIR/attempts/task-N-attempt-M/.

Kept while the task is not delivered (cleanup removes them with the task's other
files: at once once it is done, after the retention period when it failed or was
cancelled), recorded in the attempt's prompt_path, result_path and log_path, shown by
`task show` and the web page. What the provider printed can hold anything its CLI
knows: it is bounded (the last KEPT_TAIL bytes of each stream) and masked: the
forge tokens, every value in a provider home's credential files, and anything shaped
like a key or a bearer token.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aiworker.contracts.runner import ArtifactRef
from aiworker.core.context import Environment
from aiworker.core.evidence.artifacts import (
    JSON,
    MARKDOWN,
    TEXT,
    artifact_files,
    record,
    record_received,
    store,
)
from aiworker.core.guests.backends import provider_homes
from aiworker.core.intake.images import image_type
from aiworker.core.phases.run import KEPT_TAIL, RunReport
from aiworker.runtime.atomic import write_private_file
from aiworker.runtime.credentials import credential_files
from aiworker.runtime.evidence import mask_secrets
from aiworker.secrets import MASK, redact
from aiworker.store.attempts import set_attempt_files
from aiworker.store.engine import Database

# Shapes of credentials whatever their source: provider keys and tokens by prefix, and
# the value after "Bearer", "api_key", "token", "secret" or "password".
PREFIXED = re.compile(r"\b(?:sk|pk|rk|ghp|gho|ghs|glpat|xoxb|xoxp|hf)[-_][A-Za-z0-9_-]{16,}")
LABELLED = re.compile(
    r"(?i)(bearer\s+|(?:api[_-]?key|token|secret|password)[\"']?\s*[:=]\s*[\"']?)"
    r"([A-Za-z0-9._~+/=-]{8,})"
)
MIN_CREDENTIAL = 8


def attempt_folder(env: Environment, task_id: int, attempt: int) -> Path:
    return env.state_dir / "attempts" / f"task-{task_id}-attempt-{attempt}"


def keep_attempt_files(
    env: Environment,
    db: Database,
    task_id: int,
    attempt: int,
    prompt: str,
    run: RunReport,
    handed: dict[str, str | bytes] | None = None,
) -> None:
    """Write the attempt's files, keep the same bytes in the artifact store (they outlive
    the workspace and the attempt's folder) and record both; nothing unused is written.
    HANDED (the documents and images the phase was given) go to the store only: text
    masked like the rest, images as their bytes."""
    folder = attempt_folder(env, task_id, attempt)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    secrets = provider_secrets(provider_homes(env))
    documents = [("prompt.md", masked(prompt.encode(), secrets), MARKDOWN)]
    if run.result is not None:
        result = masked(json.dumps(run.result, indent=2).encode(), secrets)
        documents.append(("result.json", result, JSON))
    if run.stdout or run.stderr:
        # Each stream masked whole, then cut to what is kept; stderr last: the end of
        # the file, which `task show` quotes, is how it ended.
        sections = [
            b"--- stdout (its end) ---\n" + masked(run.stdout, secrets)[-KEPT_TAIL:],
            b"--- stderr (its end) ---\n" + masked(run.stderr, secrets)[-KEPT_TAIL:],
        ]
        documents.append(("output.log", masked(b"\n".join(sections), secrets), TEXT))
    paths: dict[str, str] = {}
    files = artifact_files(env.state_dir)
    kept = []
    for name, data, media_type in documents:
        write_private_file(folder / name, data)
        paths[name] = str(folder / name)
        kept.append(store(files, name, data, media_type))
    for name, given in sorted((handed or {}).items()):
        data = given.encode() if isinstance(given, str) else given
        image = image_type(data) if name.startswith("images/") else None
        if image is None:
            data = masked(data, secrets)
        media_type = image or (JSON if name.endswith(".json") else TEXT)
        kept.append(store(files, f"input/{name}", data, media_type))
    days = env.loaded.config.retention.artifact_days
    with db.write() as session:
        set_attempt_files(
            session,
            attempt,
            paths["prompt.md"],
            paths.get("result.json"),
            paths.get("output.log"),
        )
        for stored in kept:
            record(session, stored, days, task_id=task_id, attempt_id=attempt)


def masked(data: bytes, secrets: list[bytes]) -> bytes:
    text = redact(mask_secrets(data, secrets).decode(errors="replace"))
    text = PREFIXED.sub(MASK, text)
    return LABELLED.sub(lambda m: m.group(1) + MASK, text).encode()


def provider_secrets(homes: list[Path]) -> list[bytes]:
    """Every value in the providers' credential files (JSON strings; else each line's
    value after `=` or `:`), long enough to be a credential."""
    values: set[str] = set()
    for home in homes:
        for content in credential_files(home).values():
            values.update(_values_in(content.decode(errors="replace")))
    return sorted((v.encode() for v in values if len(v) >= MIN_CREDENTIAL), key=len, reverse=True)


def _values_in(text: str) -> list[str]:
    try:
        return list(_strings(json.loads(text)))
    except ValueError:
        return [re.split(r"[=:]", line, maxsplit=1)[-1].strip(" \"'") for line in text.splitlines()]


def _strings(document: object) -> list[str]:
    if isinstance(document, str):
        return [document]
    if isinstance(document, dict):
        return [s for value in document.values() for s in _strings(value)]
    if isinstance(document, list):
        return [s for item in document for s in _strings(item)]
    return []


BUNDLE = "application/x-git-bundle"


def fetch_result_bundle(
    env: Environment, db: Database, backend: Any, task_id: int, run: Any
) -> Path | None:
    """The attempt's commits as a bundle from its workspace (from a guest: through the
    artifact store, resumable and verified), kept in the store with the attempt, so they
    outlive the workspace; None when it made no commits. RUN is the phase's ModelRun."""
    bundle: Path | None = backend.result_bundle(run.workspace, run.workspace.root / "result.bundle")
    if bundle is None:
        return None
    files = artifact_files(env.state_dir)
    digest, size = files.put_file(bundle)  # already there when it came from a guest
    ref = ArtifactRef(name="result.bundle", sha256=digest, size=size, media_type=BUNDLE)
    days = env.loaded.config.retention.artifact_days
    with db.write() as session:
        record_received(session, files, ref, days, task_id=task_id, attempt_id=run.attempt)
    return bundle
