"""Sandbox API: commits, compare, contents, status listings, branch deletion and protection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiworker.sandbox import render_code, render_git
from aiworker.sandbox.api_repos import page
from aiworker.sandbox.http import HttpError, Reply, Request
from aiworker.sandbox.protection import rule_for
from aiworker.sandbox.state import now_iso

if TYPE_CHECKING:
    from aiworker.sandbox.app import SandboxApp
    from aiworker.sandbox.gitrepo import BareRepo

MAX_COMMITS = 50


def resolve(git: BareRepo, ref: str) -> str:
    sha = git.branch_sha(ref) or git.resolve(ref)
    if sha is None:
        raise HttpError(404, f"ref {ref!r} not found")
    return sha


def register(app: SandboxApp) -> None:  # noqa: PLR0915 - one route table
    route, state, render = app.tools()

    @route("GET", "/repos/{owner}/{repo}/commits")
    def commits(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        git = app.git(found)
        head = resolve(git, req.arg("sha") or found["default_branch"])
        path = req.arg("path") or ""
        limit = req.int_arg("limit", 30)
        limit = min(limit if limit > 0 else 30, MAX_COMMITS)
        number = max(req.int_arg("page", 1), 1)
        total = git.count(head, path)
        if path and total == 0:
            raise HttpError(404, f"no commit touches {path!r}")
        entries = git.log(head, path=path, skip=(number - 1) * limit, limit=limit)
        with_files = req.arg("files", "true") != "false"
        with_stat = req.arg("stat", "true") != "false"
        rows = []
        for entry in entries:
            files = git.changes(entry.parents[0] if entry.parents else "", entry.sha)
            shaped = render_git.commit(render, found, entry, files)
            if not with_files:
                shaped.pop("files")
            if not with_stat:
                shaped.pop("stats")
            rows.append(shaped)
        more = str(number * limit < total).lower()
        headers = [("X-Total-Count", str(total)), ("X-HasMore", more)]
        return Reply(200, rows, headers)

    @route("GET", "/repos/{owner}/{repo}/git/commits/{sha}")
    def single_commit(req: Request, owner: str, repo: str, sha: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        git = app.git(found)
        entry = git.log(resolve(git, sha), limit=1)[0]
        files = git.changes(entry.parents[0] if entry.parents else "", entry.sha)
        return Reply(200, render_git.commit(render, found, entry, files))

    @route("GET", "/repos/{owner}/{repo}/compare/{basehead...}")
    def compare(req: Request, owner: str, repo: str, basehead: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        base, dots, head = basehead.partition("...")
        if not dots:
            base, dots, head = basehead.partition("..")
        if not dots or not base or not head:
            raise HttpError(404, "compare needs BASE...HEAD")
        git = app.git(found)
        base_sha, head_sha = resolve(git, base), resolve(git, head)
        entries = git.log(f"{base_sha}..{head_sha}", limit=MAX_COMMITS)
        changes = git.changes(base_sha, head_sha)
        return Reply(
            200,
            {
                "total_commits": git.count(f"{base_sha}..{head_sha}"),
                "commits": [render_git.commit(render, found, e) for e in entries],
                "files": [{"filename": c.filename, "status": c.status} for c in changes],
            },
        )

    def contents_reply(req: Request, owner: str, repo: str, filepath: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        git = app.git(found)
        ref = req.arg("ref") or found["default_branch"]
        sha = resolve(git, ref)
        entries = git.tree(sha, filepath)
        if entries is None:
            raise HttpError(404, f"{filepath!r} does not exist at {ref}")

        def shaped(entry: Any, with_content: bool) -> dict[str, Any]:
            last = git.log(sha, path=entry.path, limit=1)
            return render_git.contents(
                render, found, git, entry, ref, last[0] if last else None, with_content=with_content
            )

        single = len(entries) == 1 and entries[0].path == filepath.strip("/")
        if single and entries[0].kind != "tree":
            return Reply(200, shaped(entries[0], True))
        return Reply(200, [shaped(e, False) for e in entries])

    @route("GET", "/repos/{owner}/{repo}/contents")
    def root_contents(req: Request, owner: str, repo: str) -> Reply:
        return contents_reply(req, owner, repo, "")

    @route("GET", "/repos/{owner}/{repo}/contents/{filepath...}")
    def file_contents(req: Request, owner: str, repo: str, filepath: str) -> Reply:
        return contents_reply(req, owner, repo, filepath)

    def statuses_reply(req: Request, owner: str, repo: str, ref: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        git = app.git(found)
        sha = git.branch_sha(ref) or git.resolve(ref) or ref  # unknown: no statuses, 200
        items = list(reversed(found["statuses"].get(sha, [])))
        wanted = req.arg("state")
        if wanted:
            items = [i for i in items if i["state"] == wanted]
        if req.arg("sort") == "oldest":
            items.reverse()
        return page(app, req, [render_code.status(render, found, i) for i in items])

    @route("GET", "/repos/{owner}/{repo}/statuses/{sha}")
    def list_statuses(req: Request, owner: str, repo: str, sha: str) -> Reply:
        return statuses_reply(req, owner, repo, sha)

    @route("GET", "/repos/{owner}/{repo}/commits/{ref...}/statuses")
    def list_statuses_by_ref(req: Request, owner: str, repo: str, ref: str) -> Reply:
        return statuses_reply(req, owner, repo, ref)

    def protected(found: dict[str, Any], branch: str) -> dict[str, Any] | None:
        rules = found.setdefault("protections", [])
        return next((r for r in rules if r["rule_name"] == branch), None)

    @route("DELETE", "/repos/{owner}/{repo}/branches/{branch...}")
    def delete_branch(req: Request, owner: str, repo: str, branch: str) -> Reply:
        found = app.repo_for(req, owner, repo, "write")
        git = app.git(found)
        if branch == found["default_branch"]:
            raise HttpError(403, "the default branch cannot be deleted")
        if rule_for(found, branch) is not None:
            raise HttpError(403, "branch protected")
        if git.branch_sha(branch) is None:
            raise HttpError(404, "branch not found")
        git.delete_branch(branch)
        assert req.user is not None
        for issue in found["issues"]:  # Forgejo closes the pull requests from it
            meta = issue["pull"]
            if meta and meta["head"] == branch and issue["state"] == "open":
                issue["state"], issue["closed_at"] = "closed", now_iso()
                state.record(issue, "close", req.user)
                state.touch(issue)
        state.save()
        return Reply(204)

    @route("GET", "/repos/{owner}/{repo}/branch_protections")
    def protections(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo, "admin")
        return Reply(200, [render_git.protection(r) for r in found.get("protections", [])])

    def edit_rule(rule: dict[str, Any], body: dict[str, Any]) -> None:
        """Apply BODY's fields; a missing or null field leaves the rule's value alone (Go
        pointer fields), a negative approval count is read as none."""
        kinds: dict[str, Any] = {
            **dict.fromkeys(render_git.PROTECTION_FLAGS, bool),
            **dict.fromkeys(render_git.PROTECTION_LISTS, list),
            "required_approvals": int,
            "protected_file_patterns": str,
            "unprotected_file_patterns": str,
        }
        for name, kind in kinds.items():
            value: Any = body.get(name)
            if value is None:
                continue
            wrong = isinstance(value, bool) if kind is int else False
            if wrong or not isinstance(value, kind):
                raise HttpError(422, f"{name} must be of type {kind.__name__}")
            if kind is list and not all(isinstance(v, str) for v in value):
                raise HttpError(422, f"{name} must be a list of strings")
            rule[name] = max(value, 0) if kind is int else value
        rule["updated_at"] = now_iso()

    @route("POST", "/repos/{owner}/{repo}/branch_protections")
    def create_protection(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo, "admin")
        body = req.json()
        name = body.get("rule_name") or body.get("branch_name")
        if not isinstance(name, str) or not name:
            raise HttpError(400, "rule_name is required")
        if protected(found, name) is not None:
            raise HttpError(403, "branch protection already exists")
        rule: dict[str, Any] = {"rule_name": name, "created_at": now_iso()}
        edit_rule(rule, body)
        found["protections"].append(rule)
        state.save()
        return Reply(201, render_git.protection(rule))

    def existing_rule(
        req: Request, owner: str, repo: str, name: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        found = app.repo_for(req, owner, repo, "admin")
        rule = protected(found, name)
        if rule is None:
            raise HttpError(404, "branch protection not found")
        return found, rule

    @route("GET", "/repos/{owner}/{repo}/branch_protections/{name...}")
    def get_protection(req: Request, owner: str, repo: str, name: str) -> Reply:
        _found, rule = existing_rule(req, owner, repo, name)
        return Reply(200, render_git.protection(rule))

    @route("PATCH", "/repos/{owner}/{repo}/branch_protections/{name...}")
    def patch_protection(req: Request, owner: str, repo: str, name: str) -> Reply:
        _found, rule = existing_rule(req, owner, repo, name)
        edit_rule(rule, req.json())
        state.save()
        return Reply(200, render_git.protection(rule))

    @route("DELETE", "/repos/{owner}/{repo}/branch_protections/{name...}")
    def delete_protection(req: Request, owner: str, repo: str, name: str) -> Reply:
        found, rule = existing_rule(req, owner, repo, name)
        found["protections"].remove(rule)
        state.save()
        return Reply(204)
