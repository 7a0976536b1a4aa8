"""The runner tokens the runner API accepts: read from `runners.tokens`, kept as digests
only, compared in constant time, and revoked when their source goes."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from pathlib import Path

from aiworker.config.identities import Identity
from aiworker.config.loader import LoadedConfig, read_token, token_path
from aiworker.errors import ConfigInvalid

log = logging.getLogger(__name__)
MIN_TOKEN_LENGTH = 32


def usable_token(identity: Identity, base: Path) -> str | None:
    """The runner token a source holds; None when it is missing, malformed or shorter
    than MIN_TOKEN_LENGTH (and `doctor` names it)."""
    try:
        token = read_token(identity, base)
    except ConfigInvalid as exc:
        log.warning("a runner token source is skipped: %s", exc.message)
        return None
    return token if token is not None and len(token) >= MIN_TOKEN_LENGTH else None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def holder_of(token: str) -> str:
    """Who holds a lease, as the runner API records it: a prefix of the runner token's
    digest (never the token), so a lease answers only the token that claimed it."""
    return _digest(token).hex()[:16]


def _changed_within(path: Path, seconds: float) -> bool:
    """Whether PATH exists and was written less than SECONDS ago."""
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False


class AcceptedTokens:
    REWRITE_S = 5.0  # how long a token file without a whole token may be mid-rewrite

    def __init__(self) -> None:
        self._digests: list[bytes | None] = []  # one per configured source, in order

    def read(self, loaded: LoadedConfig) -> None:
        """Each source's token digest, read again. A token file caught half rewritten
        (there, changed less than REWRITE_S ago, not yet one whole token) keeps the
        digest it had; one that stays so (emptied, or overwritten with what is no token)
        revokes it, as a removed file does."""
        base = loaded.path.parent
        digests: list[bytes | None] = []
        for n, identity in enumerate(loaded.config.runners.tokens):
            token = usable_token(identity, base)
            kept = self._digests[n] if n < len(self._digests) else None
            if token is None and identity.token_file and kept is not None:
                if _changed_within(token_path(identity, base), self.REWRITE_S):
                    digests.append(kept)
                    continue
                log.warning(
                    "runners.tokens[%d]: %s has no whole token: its old token is refused",
                    n,
                    identity.token_file,
                )
            digests.append(_digest(token) if token is not None else None)
        self._digests = digests

    def accepts(self, presented: str | None) -> bool:
        """Whether PRESENTED is an accepted token; every token is compared, by digest, so
        the time taken says nothing of which matched or how long they are."""
        if not presented:
            return False
        given = _digest(presented)
        found = False
        for digest in self._digests:
            found |= digest is not None and hmac.compare_digest(given, digest)
        return found
