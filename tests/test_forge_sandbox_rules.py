"""The sandbox forge keeps Forgejo's rules where a client could tell the difference:
hostile requests get a 4xx and change nothing, protection rules match as Forgejo's
do, pending reviews stay private, merged pull requests keep their diff, and pushes to
a pull request's branch are on its timeline."""

from __future__ import annotations

import json

import pytest
import requests

from tests.forge_conformance import check_exchange
from tests.forge_fixtures import git

pytestmark = pytest.mark.slow


@pytest.fixture
def api(forge):
    sessions: list[requests.Session] = []

    def as_user(login: str | None, *, checked: bool = True) -> requests.Session:
        """A session as LOGIN; checked: every exchange validated against the document
        (off where the request is meant to break it)."""
        session = requests.Session()
        if checked:
            session.hooks["response"].append(check_exchange)
        if login:
            session.headers["Authorization"] = f"token {forge.tokens[login]}"
        sessions.append(session)
        return session

    yield as_user
    for session in sessions:
        session.close()


def branch_with_change(forge, tmp_path, branch: str, login: str = "worker-bot") -> str:
    work = tmp_path / f"w-{branch.replace('/', '-')}"
    if not work.exists():
        git("clone", "-q", forge.clone_url(login), str(work))
        git("checkout", "-q", "-b", branch, cwd=work)
    (work / f"{branch.replace('/', '-')}.txt").write_text(f"{branch} {len(list(work.iterdir()))}\n")
    git("add", "-A", cwd=work)
    git("commit", "-qm", f"work on {branch}", cwd=work)
    git("push", "-q", "origin", f"{branch}:{branch}", cwd=work)
    return git("rev-parse", "HEAD", cwd=work).stdout.strip()


def test_hostile_requests_get_4xx_and_create_nothing(forge, api):
    alice = api("alice", checked=False)
    base = f"{forge.url}/api/v1/repos/team/app"
    before = alice.get(f"{base}/issues", params={"state": "all"}).json()
    cases = [
        ("POST", "/issues", {"title": "x", "labels": [[1]]}),
        ("POST", "/issues", {"title": "x", "assignees": 5}),
        ("POST", "/issues", {"title": "x", "body": 7}),
        ("GET", "/commits?path=../outside", None),
        ("GET", "/contents/a%00b", None),
        ("GET", "/commits?sha=main%00x", None),
        ("DELETE", "/branches/a%00b", None),
        ("GET", "/issues/%C2%B2", None),
        ("GET", "/labels/%C2%B2", None),
        ("GET", "/compare/main", None),
    ]
    for method, path, body in cases:
        answer = alice.request(method, base + path, json=body, timeout=10)
        assert 400 <= answer.status_code < 500, (method, path, answer.status_code, answer.text)
        assert str(forge.data) not in answer.text  # never the server's own paths
    assert alice.get(f"{base}/issues", params={"state": "all"}).json() == before


def test_json_field_names_match_as_go_matches_them(forge, api):
    alice = api("alice", checked=False)
    created = alice.post(
        f"{forge.url}/api/v1/repos/team/app/issues", json={"TITLE": "Shouting", "Body": "b"}
    )
    assert created.status_code == 201, created.text
    assert (created.json()["title"], created.json()["body"]) == ("Shouting", "b")
    number = created.json()["number"]
    closed = alice.patch(
        f"{forge.url}/api/v1/repos/team/app/issues/{number}", json={"State": "closed"}
    )
    assert closed.json()["state"] == "closed"


def test_protection_rules_match_globs_and_ignore_case_for_plain_names(forge, api, tmp_path):
    owner, worker = api("team", checked=False), api("worker-bot")
    base = f"{forge.url}/api/v1/repos/team/app"
    for rule in ("feat/*", "RELEASE"):
        assert owner.post(f"{base}/branch_protections", json={"rule_name": rule}).ok
    for branch in ("feat/x", "release", "other/y"):
        branch_with_change(forge, tmp_path, branch)
    refused = [worker.delete(f"{base}/branches/{b}").status_code for b in ("feat/x", "release")]
    assert refused == [403, 403]
    assert worker.delete(f"{base}/branches/other/y").status_code == 204
    # A null field leaves the rule alone; a negative approval count means none.
    patched = owner.patch(
        f"{base}/branch_protections/RELEASE",
        json={"status_check_contexts": None, "required_approvals": -3, "enable_push": None},
    ).json()
    assert (patched["required_approvals"], patched["status_check_contexts"]) == (0, [])


def test_pending_reviews_stay_private_and_requests_are_reviews(forge, api, tmp_path):
    worker, reviewer, reader = api("worker-bot"), api("reviewer-bot"), api("reader")
    base = f"{forge.url}/api/v1/repos/team/app"
    branch_with_change(forge, tmp_path, "topic")
    pull = worker.post(
        f"{base}/pulls", json={"head": "topic", "base": "main", "title": "Topic"}
    ).json()
    reviews = f"{base}/pulls/{pull['number']}/reviews"
    draft = reviewer.post(reviews, json={"body": "half a thought"}).json()
    assert draft["state"] == "PENDING"
    assert [r["id"] for r in reader.get(reviews).json()] == []
    assert reader.get(f"{reviews}/{draft['id']}").status_code == 404
    assert [r["id"] for r in reviewer.get(reviews).json()] == [draft["id"]]
    worker.post(f"{base}/pulls/{pull['number']}/requested_reviewers", json={"reviewers": ["alice"]})
    listed = reader.get(reviews).json()
    assert [(r["user"]["login"], r["state"]) for r in listed] == [("alice", "REQUEST_REVIEW")]
    comment = api("alice").post(reviews, json={"event": "COMMENT", "body": "looks fine"}).json()
    assert comment["official"] is False  # only approvals and change requests are official
    states = [(r["user"]["login"], r["state"]) for r in reader.get(reviews).json()]
    assert states == [("alice", "COMMENT")]  # the review answered the request
    assert (
        reader.post(
            f"{base}/pulls/{pull['number']}/requested_reviewers", json={"reviewers": ["alice"]}
        ).status_code
        == 403
    )


def test_a_merged_pull_request_keeps_its_files_and_pushes_are_recorded(forge, api, tmp_path):
    worker = api("worker-bot")
    base = f"{forge.url}/api/v1/repos/team/app"
    first = branch_with_change(forge, tmp_path, "fix")
    pull = worker.post(f"{base}/pulls", json={"head": "fix", "base": "main", "title": "Fix"}).json()
    second = branch_with_change(forge, tmp_path, "fix")  # a plain git push to the head
    events = worker.get(f"{base}/issues/{pull['number']}/timeline").json()
    pushes = [json.loads(e["body"]) for e in events if e["type"] == "pull_push"]
    assert pushes == [{"is_force_push": False, "commit_ids": [second]}]
    assert worker.post(f"{base}/pulls/{pull['number']}/merge", json={"Do": "merge"}).ok
    files = worker.get(f"{base}/pulls/{pull['number']}/files").json()
    assert [f["filename"] for f in files] == ["fix.txt"]
    commits = worker.get(f"{base}/pulls/{pull['number']}/commits").json()
    assert [c["sha"] for c in commits] == [first, second]


def test_commit_listing_options_and_branch_deletion_closing_its_pulls(forge, api, tmp_path):
    worker = api("worker-bot")
    base = f"{forge.url}/api/v1/repos/team/app"
    root = worker.get(f"{base}/commits", params={"sha": "main", "limit": 0}).json()
    assert root[-1]["parents"] == []
    assert {f["status"] for f in root[-1]["files"]} == {"added"}  # a root commit adds all
    bare = worker.get(f"{base}/commits", params={"files": "false", "stat": "false"}).json()
    assert "files" not in bare[0]
    assert "stats" not in bare[0]
    assert worker.get(f"{base}/commits", params={"path": "no/such/file"}).status_code == 404
    unknown = worker.get(f"{base}/statuses/{'0' * 40}")
    assert (unknown.status_code, unknown.json()) == (200, [])
    branch_with_change(forge, tmp_path, "doomed")
    pull = worker.post(
        f"{base}/pulls", json={"head": "doomed", "base": "main", "title": "Doomed"}
    ).json()
    assert worker.delete(f"{base}/branches/doomed").status_code == 204
    assert worker.get(f"{base}/pulls/{pull['number']}").json()["state"] == "closed"
