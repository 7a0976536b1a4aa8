"""The Forgejo adapter against the sandbox forge over real HTTP; every exchange schema-checked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aiworker.adapters.forgejo.errors import ForgeConflict, ForgeForbidden, ForgeNotFound
from tests.forge_fixtures import git


def push_branch(forge, tmp_path, login, branch, edit, name="work"):
    work = tmp_path / name
    git("clone", "-q", forge.clone_url(login), str(work))
    git("checkout", "-q", "-b", branch, cwd=work)
    for path, text in edit.items():
        (work / path).write_text(text)
    git("commit", "-qam", f"change on {branch}", cwd=work)
    git("push", "-q", "origin", branch, cwd=work)
    return git("rev-parse", "HEAD", cwd=work).stdout.strip()


def test_identity_repository_and_settings(forge):
    worker = forge.client("worker-bot")
    assert worker.current_user().login == "worker-bot"
    repo = worker.repository("team", "app")
    assert (repo.full_name, repo.default_branch) == ("team/app", "main")
    assert repo.permissions.push is True
    assert worker.settings.max_response_items == 50
    reader = forge.client("reader").repository("team", "app")
    assert reader.permissions.push is False


def test_issues_filters_comments_and_labels(forge):
    worker = forge.client("worker-bot")
    issues = worker.list_issues("team", "app")
    assert [i.number for i in issues] == [2, 1]
    mine = worker.list_issues("team", "app", assignee="worker-bot")
    assert [i.number for i in mine] == [1]
    assert mine[0].assignees[0].login == "worker-bot"
    labels = worker.ensure_labels("team", "app", ["aiworker", "needs-triage"])
    assert "needs-triage" in [lb.name for lb in worker.repo_labels("team", "app")]
    worker.add_labels("team", "app", 1, [labels["aiworker"].id, "needs-triage"])
    assert worker.issue("team", "app", 1).label_names == ["aiworker", "needs-triage"]
    assert [i.number for i in worker.list_issues("team", "app", labels=["aiworker"])] == [1]
    worker.remove_label("team", "app", 1, "needs-triage")
    assert worker.issue("team", "app", 1).label_names == ["aiworker"]
    comment = worker.create_comment("team", "app", 1, "Picking this up.")
    edited = worker.edit_comment("team", "app", comment.id, "Picking this up (edited).")
    assert edited.body.endswith("(edited).")
    assert [c.body for c in worker.comments("team", "app", 1)] == [edited.body]
    kinds = [(e.type, e.user.login) for e in worker.timeline("team", "app", 1)]
    assert ("label", "worker-bot") in kinds
    assert ("assignees", "alice") in kinds


def test_since_returns_only_changed_issues(forge):
    worker = forge.client("worker-bot")
    later = datetime.now(UTC) + timedelta(seconds=2)
    assert worker.list_issues("team", "app", since=later) == []
    assert len(worker.list_issues("team", "app", since=later - timedelta(hours=1))) == 2


def test_pagination_follows_link_headers(forge):
    alice = forge.client("alice")
    state = forge.app.state
    repo = state.repo("team", "app")
    for number in range(120):
        state.add_issue(repo, "alice", f"bulk {number}")
    before = alice.http.requests_sent
    issues = alice.list_issues("team", "app")
    assert len(issues) == 122
    assert len({i.number for i in issues}) == 122
    # settings once, then 3 pages of at most 50
    assert alice.http.requests_sent - before == 4


def test_attachments_are_listed_and_downloaded_within_a_bound(forge):
    import requests

    token = forge.tokens["alice"]
    payload = b"log line\n" * 100
    created = requests.post(
        f"{forge.url}/api/v1/repos/team/app/issues/1/assets",
        params={"name": "build.log"},
        data=payload,
        headers={"Authorization": f"token {token}"},
        timeout=10,
    )
    assert created.status_code == 201
    worker = forge.client("worker-bot")
    [attachment] = worker.attachments("team", "app", 1)
    assert (attachment.name, attachment.size) == ("build.log", len(payload))
    assert worker.download_attachment(attachment, max_bytes=10_000) == payload
    with pytest.raises(Exception, match="over 100"):
        worker.download_attachment(attachment, max_bytes=100)


def test_permissions_follow_forgejo_rules(forge):
    admin = forge.client("admin")
    assert admin.collaborator_permission("team", "app", "reader").permission == "read"
    assert admin.collaborator_permission("team", "app", "worker-bot").permission == "write"
    worker = forge.client("worker-bot")
    assert worker.collaborator_permission("team", "app", "worker-bot").permission == "write"
    with pytest.raises(ForgeForbidden) as caught:
        worker.collaborator_permission("team", "app", "alice")
    assert caught.value.status == 403
    owner = forge.client("team")
    owner.add_collaborator("team", "app", "reader", "write")
    assert admin.collaborator_permission("team", "app", "reader").permission == "write"
    with pytest.raises(ForgeForbidden):
        worker.add_collaborator("team", "app", "reader", "admin")


def test_branches_refs_pull_request_review_status_merge(forge, tmp_path):
    worker = forge.client("worker-bot")
    head = push_branch(
        forge, tmp_path, "worker-bot", "fix-add", {"calc.py": "def add(a, b):\n    return a + b\n"}
    )
    assert worker.branch("team", "app", "fix-add").commit.id == head
    assert {b.name for b in worker.branches("team", "app")} == {"main", "fix-add"}
    made = worker.create_branch("team", "app", "spare", "main")
    assert made.name == "spare"
    assert [r.ref for r in worker.refs("team", "app", "refs/heads/fix")] == ["refs/heads/fix-add"]
    assert worker.refs("team", "app", "refs/heads/none") == []
    pull = worker.create_pull(
        "team", "app", head="fix-add", base="main", title="Fix add", body="marker: task-1"
    )
    assert (pull.head.sha, pull.mergeable, pull.merged) == (head, True, False)
    with pytest.raises(ForgeConflict):
        worker.create_pull("team", "app", head="fix-add", base="main", title="again")
    assert [p.number for p in worker.pulls("team", "app")] == [pull.number]
    updated = worker.update_pull("team", "app", pull.number, body="marker: task-1 intent-2")
    assert updated.body.endswith("intent-2")
    status = worker.create_status("team", "app", head, state="pending", context="aiworker / ci")
    assert status.status == "pending"
    worker.create_status(
        "team",
        "app",
        head,
        state="success",
        context="aiworker / ci",
        target_url="http://127.0.0.1/evidence",
    )
    combined = worker.combined_status("team", "app", head)
    assert (combined.state, combined.total_count) == ("success", 1)
    reviewer = forge.client("reviewer-bot")
    review = reviewer.create_review(
        "team", "app", pull.number, event="APPROVED", body="Looks right.", commit_id=head
    )
    assert (review.state, review.commit_id, review.official) == ("APPROVED", head, True)
    assert [r.state for r in worker.reviews("team", "app", pull.number)] == ["APPROVED"]
    assert worker.is_merged("team", "app", pull.number) is False
    reviewer.merge_pull("team", "app", pull.number, style="merge", head_commit_id=head)
    assert worker.is_merged("team", "app", pull.number) is True
    merged = worker.pull("team", "app", pull.number)
    assert merged.merged
    assert merged.state == "closed"
    main = worker.branch("team", "app", "main").commit.id
    assert main == merged.merge_commit_sha
    bare = forge.data / "git" / "team" / "app.git"
    parents = git("--git-dir", str(bare), "rev-list", "--parents", "-n", "1", main).stdout.split()
    assert parents[2] == head  # a real merge commit whose second parent is the PR head
    assert "a + b" in git("--git-dir", str(bare), "show", f"{main}:calc.py").stdout


def test_conflicting_merge_is_refused_with_409(forge, tmp_path):
    worker = forge.client("worker-bot")
    push_branch(forge, tmp_path, "worker-bot", "one", {"calc.py": "one\n"}, name="w1")
    push_branch(forge, tmp_path, "alice", "two", {"calc.py": "two\n"}, name="w2")
    first = worker.create_pull("team", "app", head="one", base="main", title="one")
    second = forge.client("alice").create_pull("team", "app", head="two", base="main", title="two")
    worker.merge_pull("team", "app", first.number, style="squash")
    assert worker.pull("team", "app", second.number).mergeable is False
    main_before = worker.branch("team", "app", "main").commit.id
    with pytest.raises(ForgeConflict) as caught:
        worker.merge_pull("team", "app", second.number, style="merge")
    assert caught.value.status == 409
    assert worker.branch("team", "app", "main").commit.id == main_before


def test_moved_head_and_missing_write_refuse_merge(forge, tmp_path):
    worker = forge.client("worker-bot")
    head = push_branch(forge, tmp_path, "worker-bot", "feature", {"README.md": "x\n"})
    pull = worker.create_pull("team", "app", head="feature", base="main", title="f")
    with pytest.raises(ForgeConflict):
        worker.merge_pull("team", "app", pull.number, head_commit_id="0" * 40)
    with pytest.raises(ForgeForbidden) as caught:
        forge.client("reader").merge_pull("team", "app", pull.number)
    assert caught.value.status == 403
    assert worker.is_merged("team", "app", pull.number) is False
    with pytest.raises(ForgeNotFound):
        worker.pull("team", "app", 999)
    # The guarded merge still succeeds with the right head.
    worker.merge_pull("team", "app", pull.number, head_commit_id=head)
    assert worker.is_merged("team", "app", pull.number) is True


@pytest.mark.parametrize("style", ["rebase", "rebase-merge", "squash", "fast-forward-only"])
def test_every_merge_style_lands_the_change(forge, tmp_path, style):
    worker = forge.client("worker-bot")
    head = push_branch(forge, tmp_path, "worker-bot", f"s-{style}", {"README.md": f"{style}\n"})
    pull = worker.create_pull("team", "app", head=f"s-{style}", base="main", title=style)
    worker.merge_pull("team", "app", pull.number, style=style)
    bare = forge.data / "git" / "team" / "app.git"
    main = worker.branch("team", "app", "main").commit.id
    assert git("--git-dir", str(bare), "show", f"{main}:README.md").stdout == f"{style}\n"
    if style == "fast-forward-only":
        assert main == head
