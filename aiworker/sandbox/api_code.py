"""Sandbox API: commits, compare, contents, status listings, branch deletion and protection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiworker.sandbox import render_code, render_git
from aiworker.sandbox.api_repos import page
from aiworker.sandbox.http import HttpError, Reply, Request
from aiworker.sandbox.state import now_iso

if TYPE_CHECKING:
    from aiworker.sandbox.gitrepo import BareRepo
    from aiworker.sandbox.server import SandboxApp

MAX_COMMITS = 50


def resolve(git: BareRepo, ref: str) -> str:
    sha = git.branch_sha(ref) or git.resolve(ref)
    if sha is None:
        raise HttpError(404, f"ref {ref!r} not found")
    return sha


def register(app: SandboxApp) -> None:  # noqa: PLR0915 - one route table
    route = app.router.add
    state = app.state
    render = app.render

    @route("GET", "/repos/{owner}/{repo}/commits")
    def commits(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        git = app.git(found)
        head = resolve(git, req.arg("sha") or found["default_branch"])
        path = req.arg("path") or ""
        limit = min(max(req.int_arg("limit", 30), 1), MAX_COMMITS)
        number = max(req.int_arg("page", 1), 1)
        entries = git.log(head, path=path, skip=(number - 1) * limit, limit=limit)
        with_files = req.arg("stat", "true") != "false" or req.arg("files", "true") != "false"
        rows = []
        for entry in entries:
            files = git.changes(entry.parents[0], entry.sha) if with_files and entry.parents else []
            rows.append(render_git.commit(render, found, entry, files))
        total = git.count(head, path)
        more = str(number * limit < total).lower()
        headers = [("X-Total-Count", str(total)), ("X-HasMore", more)]
        return Reply(200, rows, headers)

    @route("GET", "/repos/{owner}/{repo}/git/commits/{sha}")
    def single_commit(req: Request, owner: str, repo: str, sha: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        git = app.git(found)
        entry = git.log(resolve(git, sha), limit=1)[0]
        files = git.changes(entry.parents[0], entry.sha) if entry.parents else []
        return Reply(200, render_git.commit(render, found, entry, files))

    @route("GET", "/repos/{owner}/{repo}/compare/{basehead...}")
    def compare(req: Request, owner: str, repo: str, basehead: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        base, dots, head = basehead.partition("...")
        if not dots:
            base, dots, head = basehead.partition("..")
        if not dots or not base or not head:
            raise HttpError(422, "compare needs BASE...HEAD")
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
        sha = resolve(app.git(found), ref)
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
        if protected(found, branch) is not None:
            raise HttpError(403, "branch protected")
        if git.branch_sha(branch) is None:
            raise HttpError(404, "branch not found")
        git.delete_branch(branch)
        return Reply(204)

    @route("GET", "/repos/{owner}/{repo}/branch_protections")
    def protections(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo, "admin")
        return Reply(200, [render_git.protection(r) for r in found.get("protections", [])])

    def edit_rule(rule: dict[str, Any], body: dict[str, Any]) -> None:
        for name in render_git.PROTECTION_FLAGS:
            if name in body:
                rule[name] = _typed(body, name, bool)
        for name in render_git.PROTECTION_LISTS:
            if name in body:
                values = body.get(name) or []
                if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                    raise HttpError(422, f"{name} must be a list of strings")
                rule[name] = values
        if "required_approvals" in body:
            rule["required_approvals"] = _typed(body, "required_approvals", int)
        for name in ("protected_file_patterns", "unprotected_file_patterns"):
            if name in body:
                rule[name] = _typed(body, name, str)
        rule["updated_at"] = now_iso()

    @route("POST", "/repos/{owner}/{repo}/branch_protections")
    def create_protection(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo, "admin")
        body = req.json()
        name = body.get("rule_name") or body.get("branch_name")
        if not isinstance(name, str) or not name:
            raise HttpError(422, "rule_name is required")
        if protected(found, name) is not None:
            raise HttpError(403, "branch protection already exists")
        rule: dict[str, Any] = {"rule_name": name, "created_at": now_iso()}
        edit_rule(rule, body)
        found["protections"].append(rule)
        state.save()
        return Reply(201, render_git.protection(rule))

    @route("GET", "/repos/{owner}/{repo}/branch_protections/{name...}")
    def get_protection(req: Request, owner: str, repo: str, name: str) -> Reply:
        rule = protected(app.repo_for(req, owner, repo, "admin"), name)
        if rule is None:
            raise HttpError(404, "branch protection not found")
        return Reply(200, render_git.protection(rule))

    @route("PATCH", "/repos/{owner}/{repo}/branch_protections/{name...}")
    def patch_protection(req: Request, owner: str, repo: str, name: str) -> Reply:
        rule = protected(app.repo_for(req, owner, repo, "admin"), name)
        if rule is None:
            raise HttpError(404, "branch protection not found")
        edit_rule(rule, req.json())
        state.save()
        return Reply(200, render_git.protection(rule))

    @route("DELETE", "/repos/{owner}/{repo}/branch_protections/{name...}")
    def delete_protection(req: Request, owner: str, repo: str, name: str) -> Reply:
        found = app.repo_for(req, owner, repo, "admin")
        rule = protected(found, name)
        if rule is None:
            raise HttpError(404, "branch protection not found")
        found["protections"].remove(rule)
        state.save()
        return Reply(204)


def _typed(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise HttpError(422, f"{name} must be a non-negative integer")
    if not isinstance(value, kind):
        raise HttpError(422, f"{name} must be a {kind.__name__}")
    return value
