"""The sandbox forge driven by a client nobody here wrote: pyforgejo, generated from
Forgejo's OpenAPI document and installed from PyPI by `make install`. Every exchange
is also checked against the vendored document (strict response shapes)."""

from __future__ import annotations

import base64

import httpx
import pytest
import requests
from pyforgejo import PyforgejoApi
from pyforgejo.core.api_error import ApiError

from tests.forge_conformance import check_httpx
from tests.forge_fixtures import git

pytestmark = pytest.mark.slow


@pytest.fixture
def client(forge):
    """pyforgejo clients by login, each on its own httpx session (closed afterwards)."""
    sessions: list[httpx.Client] = []

    def make(login: str) -> PyforgejoApi:
        http = httpx.Client(timeout=30, event_hooks={"response": [check_httpx]})
        sessions.append(http)
        return PyforgejoApi(
            base_url=f"{forge.url}/api/v1", api_key=forge.tokens[login], httpx_client=http
        )

    yield make
    for http in sessions:
        http.close()


def status_of(call) -> int:
    with pytest.raises(ApiError) as failure:
        call()
    return failure.value.status_code


def push_branch(
    forge, tmp_path, branch: str, files: dict[str, str], login: str = "worker-bot"
) -> str:
    work = tmp_path / f"work-{branch.replace('/', '-')}"
    if not work.exists():
        git("clone", "-q", forge.clone_url(login), str(work))
    known = git("rev-parse", "-q", "--verify", f"refs/heads/{branch}", cwd=work, check=False)
    if known.returncode == 0:
        git("checkout", "-q", branch, cwd=work)
    else:
        git("checkout", "-q", "-B", branch, "origin/main", cwd=work)
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    git("add", "-A", cwd=work)
    git("commit", "-qm", f"change on {branch}", cwd=work)
    git("push", "-q", "-f", "origin", f"{branch}:{branch}", cwd=work)
    return git("rev-parse", "HEAD", cwd=work).stdout.strip()


def test_issues_labels_comments_people_and_search(forge, client):
    alice, reader = client("alice"), client("reader")
    repo = alice.repository.repo_get(owner="team", repo="app")
    assert repo.default_branch == "main"
    assert repo.permissions.push
    labels = {label.name: label.id for label in alice.issue.list_labels(owner="team", repo="app")}
    assert alice.issue.get_label(owner="team", repo="app", id=labels["bug"]).name == "bug"

    created = alice.issue.create_issue(
        owner="team",
        repo="app",
        title="Crash on start",
        body="It crashes.",
        labels=[labels["aiworker"]],
        assignees=["worker-bot"],
    )
    number = created.number
    alice.issue.edit_issue(owner="team", repo="app", index=number, title="Crash on every start")
    comment = alice.issue.create_comment(owner="team", repo="app", index=number, body="more")
    alice.issue.edit_comment(owner="team", repo="app", id=comment.id, body="more detail")
    repo_comments = alice.issue.get_repo_comments(owner="team", repo="app")
    assert [c.body for c in repo_comments if c.id == comment.id] == ["more detail"]
    assert (
        status_of(lambda: reader.issue.delete_comment(owner="team", repo="app", id=comment.id))
        == 403
    )
    alice.issue.delete_comment(owner="team", repo="app", id=comment.id)
    assert (
        status_of(lambda: alice.issue.get_comment(owner="team", repo="app", id=comment.id)) == 404
    )

    replaced = alice.issue.replace_labels(
        owner="team", repo="app", index=number, labels=[labels["bug"]]
    )
    assert [label.name for label in replaced] == ["bug"]
    alice.issue.add_label(owner="team", repo="app", index=number, labels=[labels["aiworker-plan"]])
    alice.issue.remove_label(owner="team", repo="app", index=number, identifier="bug")
    assert [lb.name for lb in alice.issue.get_labels(owner="team", repo="app", index=number)] == [
        "aiworker-plan"
    ]
    alice.issue.clear_labels(owner="team", repo="app", index=number)
    assert alice.issue.get_labels(owner="team", repo="app", index=number) == []

    # The timeline holds what Forgejo records: labels and assignees given at creation,
    # the title change, every label change, in Forgejo's full item shape.
    events = alice.issue.get_comments_and_timeline(owner="team", repo="app", index=number)
    kinds = [(e.type, e.user.login) for e in events]
    assert kinds[:3] == [("label", "alice"), ("assignees", "alice"), ("change_title", "alice")]
    title = next(e for e in events if e.type == "change_title")
    assert (title.old_title, title.new_title) == ("Crash on start", "Crash on every start")
    assert [e.label.name for e in events if e.type == "label"] == [
        "aiworker",
        "aiworker",
        "bug",
        "aiworker-plan",
        "bug",
        "aiworker-plan",
    ]
    assert [e.body for e in events if e.type == "label"] == ["1", "", "1", "1", "", ""]

    collaborators = {
        u.login for u in alice.repository.repo_list_collaborators(owner="team", repo="app")
    }
    assert {"alice", "reader", "worker-bot"} <= collaborators
    assert "team" not in collaborators
    alice.repository.repo_check_collaborator(owner="team", repo="app", collaborator="reader")
    assert (
        status_of(
            lambda: alice.repository.repo_check_collaborator(
                owner="team", repo="app", collaborator="admin"
            )
        )
        == 404
    )
    assignees = {u.login for u in alice.repository.repo_get_assignees(owner="team", repo="app")}
    assert "worker-bot" in assignees
    assert "reader" not in assignees
    mine = alice.user.current_list_repos()
    assert [r.full_name for r in mine] == ["team/app"]

    found = alice.issue.search_issues(q="every start", type="issues")
    assert [i.number for i in found] == [number]
    assert alice.issue.search_issues(q="every start", state="closed") == []
    assert [i.number for i in reader.issue.search_issues(created=True)] == [2]


def test_pull_request_review_protection_and_merge(forge, client, tmp_path):
    worker, reviewer, admin = (client(n) for n in ("worker-bot", "reviewer-bot", "team"))
    head = push_branch(forge, tmp_path, "feat/y", {"calc.py": "def add(a, b):\n    return a + b\n"})
    pull = worker.repository.repo_create_pull_request(
        owner="team",
        repo="app",
        head="feat/y",
        base="main",
        title="Fix add",
    )
    assert pull.head.sha == head
    by_refs = worker.repository.repo_get_pull_request_by_base_head(
        owner="team", repo="app", base="main", head="feat/y"
    )
    assert by_refs.number == pull.number
    files = worker.repository.repo_get_pull_request_files(
        owner="team", repo="app", index=pull.number
    )
    assert [(f.filename, f.status, f.additions, f.deletions) for f in files] == [
        ("calc.py", "modified", 1, 1)
    ]
    commits = worker.repository.repo_get_pull_request_commits(
        owner="team", repo="app", index=pull.number
    )
    assert [c.sha for c in commits] == [head]
    diff = requests.get(f"{forge.url}/api/v1/repos/team/app/pulls/{pull.number}.diff", timeout=10)
    assert "-    return a - b\n+    return a + b" in diff.text
    # The branch named with an encoded slash, as generated clients send it.
    branch = requests.get(f"{forge.url}/api/v1/repos/team/app/branches/feat%2Fy", timeout=10)
    assert branch.json()["commit"]["id"] == head

    for state in ("pending", "failure", "success"):
        worker.repository.repo_create_status(
            owner="team", repo="app", sha=head, state=state, context="aiworker / ci"
        )
    listed = worker.repository.repo_list_statuses(owner="team", repo="app", sha=head)
    assert [s.status for s in listed] == ["success", "failure", "pending"]
    by_ref = worker.repository.repo_list_statuses_by_ref(
        owner="team", repo="app", ref="feat/y", state="failure"
    )
    assert [s.status for s in by_ref] == ["failure"]
    combined = worker.repository.repo_get_combined_status_by_ref(owner="team", repo="app", ref=head)
    assert combined.state == "success"

    admin.repository.repo_create_branch_protection(
        owner="team",
        repo="app",
        rule_name="main",
        required_approvals=1,
        enable_status_check=True,
        status_check_contexts=["aiworker / ci"],
    )
    assert [
        p.rule_name for p in admin.repository.repo_list_branch_protection(owner="team", repo="app")
    ] == ["main"]
    worker.repository.repo_create_pull_review_requests(
        owner="team", repo="app", index=pull.number, reviewers=["reviewer-bot", "alice"]
    )
    worker.repository.repo_delete_pull_review_requests(
        owner="team", repo="app", index=pull.number, reviewers=["alice"]
    )
    requested = worker.repository.repo_get_pull_request(owner="team", repo="app", index=pull.number)
    assert [u.login for u in requested.requested_reviewers] == ["reviewer-bot"]
    # Protection holds: no approval yet.
    assert (
        status_of(
            lambda: worker.repository.repo_merge_pull_request(
                owner="team", repo="app", index=pull.number, do="merge"
            )
        )
        == 405
    )

    asked = reviewer.repository.repo_create_pull_review(
        owner="team",
        repo="app",
        index=pull.number,
        event="REQUEST_CHANGES",
        body="name it",
        comments=[{"path": "calc.py", "body": "why?", "new_position": 2}],
    )
    one = reviewer.repository.repo_get_pull_review(
        owner="team", repo="app", index=pull.number, id=asked.id
    )
    assert (one.state, one.comments_count, one.commit_id) == ("REQUEST_CHANGES", 1, head)
    notes = reviewer.repository.repo_get_pull_review_comments(
        owner="team", repo="app", index=pull.number, id=asked.id
    )
    assert [(n.path, n.body, n.position) for n in notes] == [("calc.py", "why?", 2)]
    dismissed = admin.repository.repo_dismiss_pull_review(
        owner="team", repo="app", index=pull.number, id=asked.id, message="outdated"
    )
    assert dismissed.dismissed
    reviewer.repository.repo_create_pull_review(
        owner="team", repo="app", index=pull.number, event="APPROVED", body="ok"
    )

    # main moves: the pull request is brought up to date by a merge of the base.
    push_branch(forge, tmp_path, "main", {"README.md": "moved\n"}, login="alice")
    worker.repository.repo_update_pull_request(
        owner="team", repo="app", index=pull.number, style="merge"
    )
    updated = worker.repository.repo_get_pull_request(owner="team", repo="app", index=pull.number)
    assert updated.head.sha != head
    assert updated.merge_base == updated.base.sha
    # The approval is kept, but the required check is missing at the new head.
    assert (
        status_of(
            lambda: worker.repository.repo_merge_pull_request(
                owner="team", repo="app", index=pull.number, do="merge"
            )
        )
        == 405
    )
    worker.repository.repo_create_status(
        owner="team", repo="app", sha=updated.head.sha, state="success", context="aiworker / ci"
    )
    # Go decodes JSON field names case-insensitively: `do` is as good as `Do`.
    merged = requests.post(
        f"{forge.url}/api/v1/repos/team/app/pulls/{pull.number}/merge",
        json={"do": "merge", "delete_branch_after_merge": True},
        headers={"Authorization": f"token {forge.tokens['worker-bot']}"},
        timeout=30,
    )
    assert merged.status_code == 200, merged.text
    worker.repository.repo_pull_request_is_merged(owner="team", repo="app", index=pull.number)
    events = worker.issue.get_comments_and_timeline(owner="team", repo="app", index=pull.number)
    kinds = [e.type for e in events]
    assert kinds == [
        "review_request",
        "review_request",
        "review_request",
        "review",
        "dismiss_review",
        "review",
        "pull_push",
        "merge_pull",
        "delete_branch",
    ]
    assert [e.removed_assignee for e in events[:3]] == [False, False, True]
    assert events[-1].old_ref == "feat/y"
    assert (
        status_of(
            lambda: worker.repository.repo_get_branch(owner="team", repo="app", branch="feat/y")
        )
        == 404
    )


def test_commits_compare_contents_and_branches(forge, client, tmp_path):
    worker, admin = client("worker-bot"), client("team")
    first = push_branch(forge, tmp_path, "topic", {"docs/guide.md": "# Guide\n"})
    second = push_branch(forge, tmp_path, "topic", {"docs/more.md": "more\n"})
    history = worker.repository.repo_get_all_commits(owner="team", repo="app", sha="topic", limit=1)
    assert [c.sha for c in history] == [second]
    guide_history = worker.repository.repo_get_all_commits(
        owner="team", repo="app", sha="topic", path="docs/guide.md"
    )
    assert [c.sha for c in guide_history] == [first]
    single = worker.repository.repo_get_single_commit(owner="team", repo="app", sha=second)
    assert single.parents[0].sha == first
    assert [f.filename for f in single.files] == ["docs/more.md"]
    compared = worker.repository.repo_compare_diff(
        owner="team", repo="app", basehead="main...topic"
    )
    assert compared.total_commits == 2
    assert sorted(f.filename for f in compared.files) == ["docs/guide.md", "docs/more.md"]

    guide = worker.repository.repo_get_contents(
        owner="team", repo="app", filepath="docs/guide.md", ref="topic"
    )
    assert base64.b64decode(guide.content) == b"# Guide\n"
    assert guide.type == "file"
    assert guide.last_commit_sha == first
    listing = worker.repository.repo_get_contents_list(owner="team", repo="app", ref="topic")
    assert {"calc.py", "docs"} <= {entry.name for entry in listing}
    assert (
        status_of(
            lambda: worker.repository.repo_get_contents(
                owner="team", repo="app", filepath="nope.txt"
            )
        )
        == 404
    )

    admin.repository.repo_create_branch_protection(owner="team", repo="app", rule_name="topic")
    assert (
        status_of(
            lambda: worker.repository.repo_delete_branch(owner="team", repo="app", branch="topic")
        )
        == 403
    )
    admin.repository.repo_delete_branch_protection(owner="team", repo="app", name="topic")
    worker.repository.repo_delete_branch(owner="team", repo="app", branch="topic")
    assert (
        status_of(
            lambda: worker.repository.repo_delete_branch(owner="team", repo="app", branch="topic")
        )
        == 404
    )
    assert (
        status_of(
            lambda: worker.repository.repo_delete_branch(owner="team", repo="app", branch="main")
        )
        == 403
    )


def test_routes_are_not_captured_by_wider_patterns(forge):
    """`/repos/issues/search` is not a repository named issues/search, and
    `/repos/{o}/{r}/issues/comments` is not an issue numbered "comments"."""
    headers = {"Authorization": f"token {forge.tokens['alice']}"}
    search = requests.get(f"{forge.url}/api/v1/repos/issues/search", headers=headers, timeout=10)
    assert search.status_code == 200
    assert {i["number"] for i in search.json()} == {1, 2}
    comments = requests.get(
        f"{forge.url}/api/v1/repos/team/app/issues/comments", headers=headers, timeout=10
    )
    assert comments.status_code == 200
    assert comments.json() == []
