"""The receipt page the CI status links to (`/receipts/{id}`), and the same record as
JSON (`/api/v1/receipts/{id}`): what ran, at which head and base, how it ended, its
streams' digests and masked tails, and the artifacts kept of it (`/artifacts/{sha256}`,
each payload verified against its digest as it is served). Read-only, rendered on the
server with every value escaped, no script; behind the same Host rules as every route."""

# No `from __future__ import annotations`: FastAPI reads these signatures at runtime.

import html
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path
from fastapi.responses import HTMLResponse, Response

from aiworker.core.context import Environment
from aiworker.core.evidence.artifacts import JSON, MARKDOWN, TEXT
from aiworker.core.evidence.receipts import ReceiptReport, open_artifact, show_receipt
from aiworker.runtime.artifact_files import ArtifactDamaged
from aiworker.web.errors import error_response
from aiworker.web.operator_api import REFUSALS, ErrorDocument

NOT_FOUND = {"model": ErrorDocument, "description": "no receipt has this id"}
ReceiptId = Annotated[int, Path(ge=1, le=2**63 - 1)]
Digest = Annotated[str, Path(pattern="^[0-9a-f]{64}$")]
SHOWN = (JSON, TEXT, MARKDOWN)
POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; frame-ancestors 'none'"
STYLE = (
    "body{font:15px/1.5 system-ui,sans-serif;margin:2rem auto;max-width:60rem;padding:0 1rem}"
    "th{text-align:left;padding-right:1rem;vertical-align:top}td{font-family:monospace;"
    "overflow-wrap:anywhere}pre{background:#f4f4f4;padding:.75rem;overflow:auto;"
    "white-space:pre-wrap}.pass{color:#116329}.fail{color:#a40e26}"
)


def _rows(receipt: ReceiptReport) -> list[tuple[str, Any]]:
    body = receipt.body
    job = body.get("worker_job") or {}
    ran_by = (
        f"worker job {job.get('repository_index')}/{job.get('worker_job_index')} "
        f"attempt {job.get('attempt')} on {job.get('worker_id')}"
        if job
        else None
    )
    ran = "command" in body  # a check's receipt; a merge's records the merge instead
    return [
        ("Task", receipt.task),
        ("Phase", receipt.phase),
        ("Check", receipt.check_id),
        ("Command", " ".join(body["command"]) if ran else None),
        ("Status", body.get("status")),
        ("Exit code", f"{body.get('exit_code')} (expected {body.get('expected_exit_code')})")
        if ran
        else ("Merge commit", body.get("merge_commit")),
        ("Duration", f"{body.get('duration_ms')} ms" if ran else None),
        ("Head", receipt.head),
        ("Base", receipt.base),
        ("stdout SHA-256", body.get("stdout_sha256")),
        ("stderr SHA-256", body.get("stderr_sha256")),
        ("Ran by", ran_by),
        ("Recorded", receipt.created_at),
    ]


def render(receipt: ReceiptReport) -> str:
    e = html.escape
    verdict = "pass" if receipt.outcome in ("pass", "merged") else "fail"
    rows = "".join(
        f"<tr><th scope=row>{e(name)}</th><td>{e(str(value))}</td></tr>"
        for name, value in _rows(receipt)
        if value is not None
    )
    finding = receipt.body.get("finding")
    kept = "".join(
        f"<tr><td>{e(a['name'])}</td><td>"
        + (
            f"removed {e(a['removed_at'])}"
            if a["removed_at"]
            else f"<a href='../artifacts/{e(a['sha256'])}'>{e(a['sha256'])}</a>"
        )
        + f"</td><td>{a['size']}</td></tr>"
        for a in receipt.artifacts
    )
    stored = (
        "<h2 id=artifacts>Artifacts</h2><table aria-labelledby=artifacts><tr><th>Name</th>"
        f"<th>SHA-256</th><th>Bytes</th></tr>{kept}</table>"
        if kept
        else ""
    )
    tails = "".join(
        f"<h2 id={name}>{name} (tail, secrets masked)</h2>"
        f"<pre tabindex=0 aria-labelledby={name}>{e(receipt.body.get(key) or '')}</pre>"
        for name, key in (("stdout", "stdout_tail"), ("stderr", "stderr_tail"))
        if key in receipt.body
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>aiworker receipt {receipt.id}</title><style>{STYLE}</style></head><body>"
        f"<main><h1>Receipt {receipt.id}: <span class={verdict}>{e(receipt.outcome)}</span></h1>"
        f"<table><caption>The check as aiworker ran it</caption>{rows}</table>"
        + (f"<p><strong>Finding:</strong> {e(finding)}</p>" if finding else "")
        + f"{tails}{stored}</main></body></html>"
    )


def add_receipt_routes(app: FastAPI, environment: Callable[[], Environment]) -> None:
    @app.get("/receipts/{receipt_id}", response_class=HTMLResponse, include_in_schema=False)
    def page(receipt_id: ReceiptId) -> Any:
        receipt = show_receipt(environment(), receipt_id)
        if receipt is None:
            return error_response(404, "not_found", f"no receipt {receipt_id}")
        return HTMLResponse(render(receipt), headers={"content-security-policy": POLICY})

    router = APIRouter(prefix="/api/v1", responses={**REFUSALS, 404: NOT_FOUND})

    @router.get("/receipts/{receipt_id}")
    def document(receipt_id: ReceiptId) -> Any:
        receipt = show_receipt(environment(), receipt_id)
        if receipt is None:
            return error_response(404, "not_found", f"no receipt {receipt_id}")
        return receipt.to_json()

    @app.get("/artifacts/{digest}", include_in_schema=False)
    def artifact(digest: Digest) -> Any:
        try:
            payload = open_artifact(environment(), digest)
        except ArtifactDamaged as exc:
            return error_response(500, "damaged", str(exc))
        if payload is None:
            return error_response(404, "not_found", f"no artifact {digest} is kept")
        # Served as the bytes they are: text stays text, everything else is a download,
        # never a page of the control plane's origin.
        media = payload.media_type if payload.media_type in SHOWN else "application/octet-stream"
        headers = {
            "content-security-policy": "default-src 'none'; sandbox",
            "cache-control": "private, max-age=31536000, immutable",
            "x-content-type-options": "nosniff",
        }
        if media not in SHOWN:
            headers["content-disposition"] = f"attachment; filename={digest}"
        return Response(payload.data, media_type=media, headers=headers)

    app.include_router(router)
