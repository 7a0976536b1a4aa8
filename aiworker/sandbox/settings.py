"""The sandbox forge's API settings, as Forgejo reports them (GET /settings/api) and
pages its lists by."""

from __future__ import annotations

SETTINGS = {"default_paging_num": 30, "max_response_items": 50}


def settings_payload() -> dict[str, int]:
    return {**SETTINGS, "default_max_blob_size": 10485760, "default_git_trees_per_page": 1000}
