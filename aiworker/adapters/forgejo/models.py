"""Typed views of the Forgejo responses aiworker reads; field names as in the OpenAPI document.

Unknown fields are ignored here (Forgejo sends many more); nulls Forgejo sends
for empty lists become empty lists.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


def _list_or_empty(value: Any) -> Any:
    return [] if value is None else value


class User(Model):
    id: int
    login: str
    full_name: str = ""
    email: str = ""
    is_admin: bool = False


class ServerVersion(Model):
    version: str = ""


class Permission(Model):
    admin: bool = False
    push: bool = False
    pull: bool = False


class Repository(Model):
    id: int
    name: str
    full_name: str
    owner: User
    default_branch: str
    private: bool = False
    archived: bool = False
    clone_url: str = ""
    html_url: str = ""
    permissions: Permission | None = None


class Label(Model):
    id: int
    name: str
    color: str = ""
    description: str = ""


class Attachment(Model):
    id: int
    uuid: str
    name: str
    size: int
    browser_download_url: str


class PullRequestMeta(Model):
    merged: bool = False
    merged_at: datetime | None = None
    draft: bool = False
    html_url: str = ""


class Thread(Model):
    """What an issue and a pull request (an issue with code) both carry."""

    id: int
    number: int
    title: str
    body: str = ""
    state: str
    user: User
    labels: list[Label] = []
    html_url: str = ""
    updated_at: datetime

    _labels = field_validator("labels", mode="before")(_list_or_empty)

    @property
    def label_names(self) -> list[str]:
        return [label.name for label in self.labels]


class Issue(Thread):
    assignees: list[User] = []
    created_at: datetime
    closed_at: datetime | None = None
    pull_request: PullRequestMeta | None = None
    assets: list[Attachment] = []

    _lists = field_validator("assignees", "assets", mode="before")(_list_or_empty)


class Comment(Model):
    id: int
    body: str
    user: User
    html_url: str = ""
    created_at: datetime
    updated_at: datetime


class TimelineComment(Model):
    id: int
    type: str
    body: str = ""
    user: User | None = None
    created_at: datetime
    label: Label | None = None
    assignee: User | None = None
    removed_assignee: bool = False


class CollaboratorPermission(Model):
    permission: str
    role_name: str = ""
    user: User | None = None


class PayloadCommit(Model):
    id: str
    message: str = ""


class Branch(Model):
    name: str
    commit: PayloadCommit
    protected: bool = False
    user_can_push: bool = False


class GitObject(Model):
    sha: str
    type: str


class Reference(Model):
    ref: str
    object: GitObject


class PRBranchInfo(Model):
    ref: str
    sha: str
    label: str = ""


class PullRequest(Thread):
    head: PRBranchInfo
    base: PRBranchInfo
    mergeable: bool = False
    merged: bool = False
    merged_at: datetime | None = None
    merged_by: User | None = None
    merge_commit_sha: str | None = None


class PullReview(Model):
    id: int
    user: User | None = None
    state: str
    body: str = ""
    commit_id: str = ""
    official: bool = False
    submitted_at: datetime | None = None


class CommitStatus(Model):
    id: int
    status: str
    context: str = ""
    description: str = ""
    target_url: str = ""
    creator: User | None = None


class CombinedStatus(Model):
    state: str
    sha: str
    total_count: int = 0
    statuses: list[CommitStatus] = []

    _lists = field_validator("statuses", mode="before")(_list_or_empty)


class ApiSettings(Model):
    default_paging_num: int = 30
    max_response_items: int = 50
