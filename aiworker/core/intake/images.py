"""Issue images: fetched by the host through the forge, checked, handed over as files.

Candidates are the issue's image attachments and the forge attachments its body
references (`/attachments/UUID`). Each is fetched with the worker identity under a
size cap, accepted only when its bytes start with a PNG, JPEG, GIF or WebP
signature, and at most MAX_IMAGES are taken. Whatever is not handed over is listed
with the reason, so the phase knows what it does not see. The workspace gets bytes
and metadata, never the forge or its credentials.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeError
from aiworker.adapters.forgejo.models import Attachment, Issue
from aiworker.core.intake.scope import IMAGE_SUFFIXES

MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_IMAGES = 8
# Downloads stop at this many candidates whatever they turn out to be, and the list of
# what was not given is bounded too (it goes into the phase's context).
MAX_CANDIDATES = 2 * MAX_IMAGES
MAX_LISTED = 50
REFERENCE = re.compile(r"/attachments/([0-9a-fA-F-]{36})")
EXTERNAL = re.compile(r"!\[[^\]]*\]\((https?://[^)\s]+)")


@dataclass
class IssueImages:
    files: dict[str, bytes] = field(default_factory=dict)  # inputs/images/NAME -> bytes
    accepted: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)


def image_type(data: bytes) -> str | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def fetch_images(worker: ForgejoClient, issue: Issue) -> IssueImages:
    found = IssueImages()
    assets = {a.uuid: a for a in issue.assets}
    wanted: list[Attachment] = [a for a in issue.assets if a.name.lower().endswith(IMAGE_SUFFIXES)]
    for uuid in dict.fromkeys(REFERENCE.findall(issue.body or "")):
        if uuid not in assets:
            found.rejected.append({"name": uuid, "reason": "referenced, but no such attachment"})
        elif assets[uuid] not in wanted:
            wanted.append(assets[uuid])
    for url in EXTERNAL.findall(issue.body or ""):
        if not REFERENCE.search(url):
            found.rejected.append({"name": url, "reason": "not an attachment of this forge"})
    for number, attachment in enumerate(wanted):
        if len(found.accepted) >= MAX_IMAGES or number >= MAX_CANDIDATES:
            found.rejected.append({"name": attachment.name, "reason": f"over {MAX_IMAGES} images"})
            continue
        reason = _take(found, worker, attachment)
        if reason:
            found.rejected.append({"name": attachment.name, "reason": reason})
    found.rejected = [
        {"name": r["name"][:200], "reason": r["reason"]} for r in found.rejected[:MAX_LISTED]
    ]
    return found


def _take(found: IssueImages, worker: ForgejoClient, attachment: Attachment) -> str | None:
    """Hand ATTACHMENT over, or say why not."""
    if attachment.size > MAX_IMAGE_BYTES:
        return f"{attachment.size} bytes, over the {MAX_IMAGE_BYTES}-byte cap"
    try:
        data = worker.download_attachment(attachment, MAX_IMAGE_BYTES)
    except ForgeError as exc:
        return f"unavailable: {str(exc)[:200]}"
    kind = image_type(data)
    if kind is None:
        return "its bytes are not a PNG, JPEG, GIF or WebP image"
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", attachment.name)[:80]
    name = f"images/{len(found.accepted) + 1}-{safe}"
    found.files[name] = data
    found.accepted.append(
        {
            "file": name,
            "name": attachment.name,
            "type": kind,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    )
    return None
