"""Repository access from the web plane against the sandbox forge: check reads each bot's
permission with its own token; repair grants a missing Write with a token given for that
call only (never stored or shown), only against the revision the operator saw; newly
saved repositories are provisioned alone."""

from __future__ import annotations

import requests

from tests.helpers import configure
from tests.test_web_api import serving, session


def test_check_and_repair_access(forge, upgraded, tmp_path, monkeypatch):
    config = configure(tmp_path, forge, monkeypatch)
    owner = forge.client("team")
    requests.delete(
        f"{forge.url}/api/v1/repos/team/app/collaborators/worker-bot",
        headers={"Authorization": f"token {forge.tokens['team']}"},
        timeout=10,
    ).raise_for_status()
    with serving() as url:
        client = session(url)
        checked = client.post(f"{url}/api/v1/access/check").json()
        ok = {e["login"]: e["ok"] for e in checked["access"]}
        assert ok == {"planner-bot": True, "worker-bot": False, "reviewer-bot": True}
        revision = checked["revision"]

        stale = client.post(
            f"{url}/api/v1/access/repair",
            json={"revision": "0" * 64, "admin_token": forge.tokens["team"]},
        )
        assert (stale.status_code, stale.json()["error"]["code"]) == (409, "conflict")
        assert forge.tokens["team"] not in stale.text
        weak = client.post(
            f"{url}/api/v1/access/repair",
            json={"revision": revision, "admin_token": forge.tokens["reader"]},
        )
        assert weak.status_code == 200, weak.text
        assert weak.json()["granted"] == []
        assert any("could not grant worker-bot write" in w for w in weak.json()["warnings"])
        assert forge.tokens["reader"] not in weak.text

        repaired = client.post(
            f"{url}/api/v1/access/repair",
            json={"revision": revision, "admin_token": forge.tokens["team"]},
        )
        assert repaired.status_code == 200, repaired.text
        body = repaired.json()
        assert body["granted"] == [
            {"repository": "team/app", "role": "worker", "login": "worker-bot"}
        ]
        assert body["warnings"] == []
        assert all(e["ok"] for e in body["access"])
        assert forge.tokens["team"] not in repaired.text
        permission = owner.collaborator_permission("team", "app", "worker-bot").permission
        assert permission == "write"

        # A newly added repository: the save names it, and a repair provisions it alone.
        with forge.app.state.lock:
            forge.app.state.add_repo("team", "second")
            forge.app.state.save()
        repositories = [
            {"index": 1, "owner": "team", "name": "app"},
            {"index": 2, "owner": "team", "name": "second"},
        ]
        saved = client.put(
            f"{url}/api/v1/settings",
            json={"revision": revision, "values": {"repositories": repositories}},
        ).json()
        assert saved["added_repositories"] == [2]
        provisioned = client.post(
            f"{url}/api/v1/access/repair",
            json={
                "revision": saved["revision"],
                "admin_token": forge.tokens["team"],
                "repositories": saved["added_repositories"],
            },
        ).json()
        assert {g["repository"] for g in provisioned["granted"]} == {"team/second"}
        assert {e["repository"] for e in provisioned["access"]} == {"team/second"}
    assert "index = 2" in config.read_text()
