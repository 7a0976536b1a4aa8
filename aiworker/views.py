"""Human renderings of the task reports (`task list`, `task show`), read at 80 columns:
times to the second and relative to now, long reasons folded, removed files marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiworker.humanize import ago, both, exact, fold, table

TAIL_LINES = 8  # of a failed attempt's output, in `task show`


def task_list(report: dict[str, Any]) -> list[Any]:
    if not report["tasks"]:
        return ["no tasks"]
    rows = table("id", "state", "kind", "issue", "title")
    for t in report["tasks"]:
        issue = f"{t['repository']}#{t['issue']}" if t["issue"] else t["repository"]
        rows.add_row(str(t["id"]), t["state"], t["kind"], issue, t["title"])
    return [rows]


def task_show(report: dict[str, Any]) -> list[str]:
    issue = f"#{report['issue']}" if report["issue"] else ""
    history = report["history"]
    since = f", since {both(history[-1]['at'])}" if history else ""
    lines = [
        f"task {report['id']} ({report['kind']}) {report['repository']}{issue}: {report['title']}",
        f"state {report['state']} (version {report['version']}){since}",
        f"base {_short(report['base'])}, head {_short(report['head'])}",
        "history:",
        *(_event(e) for e in history),
        "attempts:",
        *(line for a in report["attempts"] for line in _attempt(a)),
        "budgets: "
        + (
            ", ".join(f"{k} {v['used']}/{v['limit']}" for k, v in report["budgets"].items())
            or "none used"
        ),
        *(
            f"receipt: {r['phase']} {r['check'] or ''} {r['outcome']} at {_short(r['head'])}"
            f" ({ago(r['at'])})"
            for r in report["receipts"]
        ),
        *(
            f"publication: {p['state']} {p['branch']} PR #{p['pr']} at {_short(p['head'])}"
            for p in report["publications"]
        ),
        *(f"file: {_file(f)}" for f in report["files"]),
    ]
    return [fold(line, indent="      ") for line in lines]


def _short(commit: str | None) -> str:
    return commit[:12] if commit else "-"


def _file(path: str | None) -> str:
    return f"{path} (removed)" if path and not Path(path).exists() else str(path)


def _event(event: dict[str, Any]) -> str:
    line = f"  {exact(event['at'])} {event['kind']}"
    if event["to"]:
        line += f" {event['from'] or ''} -> {event['to']}".replace("  ", " ")
    data = event["data"]
    if data.get("phase"):
        line += f" [{data['phase']}" + (f" #{data['attempt']}]" if data.get("attempt") else "]")
    return line + (f": {data['reason']}" if data.get("reason") else "")


def _attempt(attempt: dict[str, Any]) -> list[str]:
    line = f"  {attempt['id']} {attempt['phase']} {attempt['provider'] or 'host'}: "
    line += attempt["outcome"] or f"running since {exact(attempt['started_at'])}"
    line += f" ({attempt['reason']})" if attempt["reason"] else ""
    if attempt.get("workspace"):
        line += f"; workspace {_file(attempt['workspace'])}"
    lines = [line]
    for name in ("prompt", "result", "log"):
        if attempt.get(name):
            lines.append(f"    {name}: {_file(attempt[name])}")
    if attempt.get("output_tail") and attempt["outcome"] != "succeeded":
        printed = attempt["output_tail"].rstrip("\n").splitlines()[-TAIL_LINES:]
        lines += ["    it printed, at the end:", *(f"      | {text}" for text in printed)]
    return lines
