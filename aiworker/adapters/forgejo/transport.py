"""HTTP to one Forgejo base URL as one identity: timeouts, retries, pagination, errors.

Connection errors, 429 and 5xx are retried with exponential backoff and full
jitter, never sooner than a Retry-After the server sent; other 4xx are final. A
POST that makes something (a comment, a review, a pull request, a merge) is sent again
here only when the forge cannot have acted on it: no connection was made, or it
answered 429 or 503. After a 500, 502 or 504, a timeout or a connection lost once the
request went out, the change may have been made (a proxy's 504 often comes after the
forge did the work), and a second POST would make it twice: ForgeAnswerLost, and the
client looks for what was made before it sends it again. A POST that may be repeated
(a commit status, labels) is retried as a read is.
The token travels only in the Authorization header and never appears in an
error or a log line.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypedDict
from urllib.parse import quote, urljoin, urlsplit

import requests
import urllib3
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from aiworker.adapters.causes import before_sending, connection_cause, retry_after_seconds
from aiworker.adapters.forgejo.errors import (
    BY_STATUS,
    SCOPE_REFUSAL,
    ForgeAnswerLost,
    ForgeError,
    ForgeForbidden,
    ForgeTokenScope,
    ForgeUnavailable,
    ForgeUnreachable,
)
from aiworker.runtime.answers import AnswerLate, AnswerRefused, read_whole
from aiworker.secrets import redact, register_secret

log = logging.getLogger(__name__)
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
NOT_ACTED_ON = frozenset({429, 503})  # the forge (or its proxy) did not take the request
MAY_HAVE_ACTED = "the forge may have acted on it before its answer was lost"
# One answer arrives whole within this many timeouts (a server that sends a byte at a
# time never trips the timeout of each read) and is at most this big.
DEADLINE_TIMEOUTS = 4
MAX_ANSWER_BYTES = 64 * 1024 * 1024
# A listing longer than this is a server that never stops paging (at 50 a page, 50,000).
MAX_PAGES = 1000
RELISTS = 3  # readings of a listing that changes while it is read
MAX_REDIRECTS = 5  # of a read, on the forge's own host


class _Retryable(Exception):
    def __init__(
        self,
        status: int | None,
        reason: str,
        retry_after: float | None,
        final: type[ForgeError] = ForgeUnavailable,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after
        self.final = final  # what it becomes when the retries run out


def _port(parts: Any) -> int | None:
    try:
        return int(parts.port) if parts.port else None
    except ValueError:
        return None


def segment(value: str | int, *, slashes: bool = False) -> str:
    return quote(str(value), safe="/" if slashes else "")


class TransportOptions(TypedDict, total=False):
    """What a Transport may be given beyond its address and token (ForgejoClient passes
    them on)."""

    timeout: float
    attempts: int
    backoff_base: float
    backoff_max: float
    sleep: Callable[[float], None]


class Transport:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        attempts: int = 5,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base = base_url.rstrip("/")
        self.api = self.base + "/api/v1"
        parts = urlsplit(self.base)
        # For messages: the forge's address without any user:password@ in it.
        self.shown_base = f"{parts.scheme}://{parts.hostname or ''}" + (
            f":{parts.port}" if _port(parts) else ""
        )
        # Where git is sent (its remote is on a command line): the path kept, no password.
        host = parts.netloc.rpartition("@")[2]
        self.plain_base = f"{parts.scheme}://{host}{parts.path.rstrip('/')}"
        self.timeout = timeout
        self.attempts = attempts
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._sleep = sleep
        register_secret(token)
        self.session = requests.Session()
        self.session.headers.update(
            {
                "Authorization": f"token {token}",
                "Accept": "application/json",
                # As it is: a compressed answer could trickle in a way no read ends.
                "Accept-Encoding": "identity",
                "User-Agent": "aiworker",
            }
        )
        self.requests_sent = 0
        self.bytes_received = 0

    def pause(self, attempt: int) -> None:
        """Wait as the ATTEMPTth retry would (a caller's own retry of a change)."""
        self._sleep(self._backoff(attempt))

    def _backoff(self, attempt: int) -> float:
        return random.uniform(0, min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1)))

    def _wait(self, state: RetryCallState) -> float:
        delay = self._backoff(state.attempt_number)
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        if isinstance(error, _Retryable) and error.retry_after is not None:
            delay = max(delay, min(error.retry_after, self.backoff_max))
        return delay

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        ok: tuple[int, ...] = (200,),
        url: str | None = None,
        stream: bool = False,
        repeatable: bool = False,
    ) -> requests.Response:
        """Send one API call (PATH below /api/v1, or a full same-host URL); REPEATABLE: a
        POST that may be sent twice, retried as a read is."""
        target = url or self.api + path
        shown = urlsplit(target).path
        retrying = Retrying(
            retry=retry_if_exception_type(_Retryable),
            stop=stop_after_attempt(self.attempts),
            wait=self._wait,
            sleep=self._sleep,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    once = method == "POST" and not repeatable
                    response = self._send(method, target, shown, params, json, stream, once)
        except _Retryable as exc:
            raise exc.final(method, shown, exc.status, exc.reason, forge=self.shown_base) from None
        if response.status_code not in ok:
            raise self._error(method, shown, response)
        return response

    def _send(
        self,
        method: str,
        target: str,
        shown: str,
        params: Mapping[str, Any] | None,
        body: Any,
        stream: bool,
        once: bool = False,
    ) -> requests.Response:
        """One try; ONCE: a change the forge may have made is not tried again."""
        started = time.monotonic()
        self.requests_sent += 1
        try:
            # A redirect of a change would be sent on as a GET (requests follows 301 and
            # 302 so): only reads follow one; a download (STREAM) as requests does, its
            # caller bounding what it reads; an API read here, so that each answer on the
            # way is bounded too.
            response = self.session.request(
                method,
                target,
                params=params,
                json=body,
                timeout=self.timeout,
                stream=True,
                allow_redirects=method == "GET" and stream,
            )
            for _ in range(MAX_REDIRECTS if method == "GET" else 0):
                following = self._follow(target, response)
                if following is None:
                    break
                response.close()
                target, params = following, None
                response = self.session.get(
                    target, timeout=self.timeout, stream=True, allow_redirects=False
                )
            if not stream and not response.is_redirect:
                self._read_whole(response, started, method, shown)
        except AnswerLate as exc:  # not tried again: each try could take as long
            raise ForgeUnavailable(method, shown, None, str(exc), forge=self.shown_base) from None
        except (requests.ConnectionError, requests.Timeout) as exc:
            cause, curable = connection_cause(exc, self.timeout)
            final = ForgeUnavailable if curable else ForgeUnreachable
            if once and not before_sending(exc):
                said = f"{cause}; {MAY_HAVE_ACTED}"
                raise ForgeAnswerLost(method, shown, None, said, forge=self.shown_base) from None
            log.info("%s %s at %s: %s; retrying", method, shown, self.shown_base, cause)
            raise _Retryable(None, cause, None, final) from None
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema) as exc:
            raise ForgeUnreachable(
                method,
                shown,
                None,
                f"the URL is malformed ({type(exc).__name__})",
                forge=self.shown_base,
            ) from None
        except requests.RequestException as exc:
            # Anything else (a header requests refuses, say) is named by its type only: its
            # message may quote the request's headers, token included.
            raise ForgeUnavailable(
                method, shown, None, type(exc).__name__, forge=self.shown_base
            ) from None
        if response.is_redirect:
            response.close()  # its body is not read: the connection goes back
            where = urlsplit(response.headers.get("Location", ""))
            raise ForgeUnreachable(
                method,
                shown,
                response.status_code,
                f"the forge redirects {method} to {where.scheme}://{where.netloc}{where.path}; "
                "set forge.url to the address it answers on",
                forge=self.shown_base,
            )
        log.debug(
            "%s %s -> %d in %.0f ms",
            method,
            shown,
            response.status_code,
            (time.monotonic() - started) * 1000,
        )
        if response.status_code in RETRY_STATUSES:
            after = retry_after_seconds(response.headers.get("Retry-After"))
            if after is not None and after > self.backoff_max:
                # Longer than a try waits: asking again sooner would not be honouring it.
                said = self._message(response)
                raise ForgeUnavailable(
                    method,
                    shown,
                    response.status_code,
                    (f"{said}; " if said else "")
                    + f"it asks to be asked again in {after:g} s (Retry-After)",
                    forge=self.shown_base,
                )
            said = self._message(response)
            if once and response.status_code not in NOT_ACTED_ON:
                said = (f"{said}; " if said else "") + MAY_HAVE_ACTED
                status = response.status_code
                raise ForgeAnswerLost(method, shown, status, said, forge=self.shown_base)
            raise _Retryable(response.status_code, said, after)
        return response

    def _follow(self, target: str, response: requests.Response) -> str | None:
        """Where a redirect of a read leads, when it stays on the forge (its host and port,
        never from https to http); None when RESPONSE is no redirect or leads elsewhere
        (that redirect is refused as the answer)."""
        if not response.is_redirect:
            return None
        following = urljoin(target, response.headers.get("Location", ""))
        there, base = urlsplit(following), urlsplit(self.base)
        downgrade = base.scheme == "https" and there.scheme != "https"
        if there.netloc.rpartition("@")[2] != base.netloc.rpartition("@")[2] or downgrade:
            return None
        return following

    def _read_whole(
        self, response: requests.Response, started: float, method: str, shown: str
    ) -> None:
        """Read RESPONSE's body into it within the answer's deadline and size."""
        if getattr(response, "_content_consumed", False):  # a hook of the session read it
            self.bytes_received += len(response.content)
            return
        spent = self.timeout * DEADLINE_TIMEOUTS
        try:
            data = read_whole(response, started=started, seconds=spent, limit=MAX_ANSWER_BYTES)
        except AnswerLate:
            raise
        except AnswerRefused as exc:
            raise ForgeError(
                method, shown, response.status_code, str(exc), forge=self.shown_base
            ) from None
        except urllib3.exceptions.ReadTimeoutError as exc:
            raise requests.Timeout(str(exc)) from None
        except urllib3.exceptions.HTTPError as exc:
            raise requests.ConnectionError(str(exc)) from None
        response._content = data  # what .content and .json() read from now on
        self.bytes_received += len(data)

    @staticmethod
    def _message(response: requests.Response) -> str:
        """Forgejo's own message from an error answer (JSON `message`), if it sent one."""
        try:
            body = response.json()
        except ValueError:
            return ""
        if isinstance(body, dict):
            # A server may echo what it got; the token must not come back through us.
            return redact(str(body.get("message", ""))[:300])
        return ""

    def _error(self, method: str, shown: str, response: requests.Response) -> ForgeError:
        kind = BY_STATUS.get(response.status_code, ForgeError)
        detail = self._message(response)
        if kind is ForgeForbidden and SCOPE_REFUSAL in detail:
            kind = ForgeTokenScope
        return kind(method, shown, response.status_code, detail, forge=self.shown_base)

    def pages(self, path: str, params: Mapping[str, Any] | None, page_size: int) -> Iterator[Any]:
        """Every item of a list endpoint, following Link rel="next". A listing whose total
        (X-Total-Count) changes between its pages is read again from its first: an item
        closed meanwhile shifts the rest up a place, and the one that moved onto a page
        already read would be missed (at most RELISTS times; then the last reading)."""
        for _ in range(RELISTS):
            items, steady = self._reading(path, params, page_size)
            if steady:
                break
            log.info("GET %s changed while it was read; reading it again", path)
        yield from items

    def _reading(
        self, path: str, params: Mapping[str, Any] | None, page_size: int
    ) -> tuple[list[Any], bool]:
        """One reading of a listing, page by page; whether its total held throughout."""
        query = {**(params or {}), "limit": page_size, "page": 1}
        response = self.request("GET", path, params=query)
        totals = {response.headers.get("X-Total-Count")}
        items: list[Any] = []
        visited: set[str] = set()
        for _ in range(MAX_PAGES):
            page = response.json() or []
            items.extend(page)
            following = response.links.get("next", {}).get("url")
            if not following or len(page) < page_size:
                return items, len(totals) == 1
            following = self._same_host(following)
            if following in visited:
                break
            visited.add(following)
            response = self.request("GET", "", url=following)
            totals.add(response.headers.get("X-Total-Count"))
        raise ForgeError(
            "GET",
            urlsplit(self.api + path).path,
            None,
            f"the listing does not end (a page repeats, or more than {MAX_PAGES} pages)",
            forge=self.shown_base,
        )

    def _same_host(self, url: str) -> str:
        """Link URLs come from the server's ROOT_URL, which may name another host and path
        than forge.url (its public name, where aiworker uses an internal address): the API
        path in it, on our base URL."""
        parts = urlsplit(url)
        base = urlsplit(self.base)
        ours = (parts.scheme, parts.netloc) == (base.scheme, base.netloc)
        if ours and parts.path.startswith(urlsplit(self.api).path + "/"):
            return url
        _, api, rest = parts.path.partition("/api/v1/")
        path = f"/api/v1/{rest}" if api else parts.path
        return f"{self.base}{path}" + (f"?{parts.query}" if parts.query else "")
