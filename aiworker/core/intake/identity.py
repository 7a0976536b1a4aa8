"""Which repository on the forge a configured index stands for.

The index is a repository's stable name in aiworker: its tasks, cursor and jobs hang on
it, and a rename on the forge updates only the owner and name recorded for it. So that a
rename is told apart from another repository put at that index (a configuration edited
by mistake, or two installations sharing one database with different repositories),
which would rebind every task of the index to another repository's issues, the forge's
own id of the repository is recorded with the index and compared whenever the name
changes.
"""

from __future__ import annotations

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeNotFound
from aiworker.errors import InvalidInput
from aiworker.store.discovery import repository_at
from aiworker.store.engine import Database
from aiworker.store.task_records import FORGE_ID


def forge_id_to_record(
    db: Database, client: ForgejoClient, index: int, owner: str, name: str
) -> int | None:
    """The forge's id of OWNER/NAME to record for INDEX (None: recorded and unchanged, no
    request made); InvalidInput when it is another repository than INDEX was recorded for."""
    with db.read() as session:
        recorded = repository_at(session, index)
        was = (recorded.owner, recorded.name) if recorded else None
        known = (recorded.settings or {}).get(FORGE_ID) if recorded else None
    if was == (owner, name) and known is not None:
        return None
    now = client.repository(owner, name).id
    if was is None or was == (owner, name):
        return now
    if known is None:  # recorded before ids were: the forge says what the old name is now
        try:
            known = client.repository(*was).id
        except ForgeNotFound:
            return now  # gone under that name: renamed
    if known != now:
        raise InvalidInput(
            f"repositories[index={index}] is {owner}/{name}, but index {index} stands for "
            f"{was[0]}/{was[1]} (forge repository {known}), and {owner}/{name} is another "
            f"repository (forge repository {now}), not a rename of it: give it an index of "
            "its own (every installation sharing this database must give each repository "
            "the same index)"
        )
    return now
