"""`aiworker web serve`: bind, build the application for exactly that address, run it.

Loopback by default. A non-loopback address needs an explicit flag and is announced
with the warning that an authenticated HTTPS reverse proxy must sit in front: the
operator API itself has no login. The configuration is read afresh for every request,
so a setting saved from the page or with `config set` shows at once.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiworker.config.origins import http_origin
from aiworker.core.context import Environment
from aiworker.errors import InvalidInput, Unavailable
from aiworker.runtime.listen import is_loopback, parse_listen
from aiworker.secrets import register_secret

# How long a stop waits for requests in flight: within the unit's TimeoutStopSec (15 s).
STOP_GRACE_S = 10


def allowed_hosts(host: str, port: int) -> set[str]:
    """The Host headers this server answers to: its own address (and, on loopback, the
    other loopback names a local browser uses)."""
    names = {host}
    if is_loopback(host):
        names |= {"localhost", "127.0.0.1"} if ":" not in host else {"localhost"}
    return {f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in names}


def public_origin_of(origin: str) -> tuple[str, str]:
    """(origin, host) of the address a reverse proxy serves this under."""
    checked = http_origin(origin, "--public-origin")
    return checked, urlsplit(checked).netloc


def _bind(listen: str) -> tuple[socket.socket, str, int]:
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio then sets TCP_NODELAY on each connection (with proto 0 it
    # does not, and a kept-alive request waits 40 ms for the delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1" if host == "localhost" else host, port))
    except OSError as exc:
        sock.close()
        raise Unavailable(f"cannot listen on {listen}: {exc.strerror}") from None
    sock.listen(2048)  # connections made once the address is printed wait for the server
    return sock, host, sock.getsockname()[1]


def _announce(shown: dict[str, str | None], *, remote: bool, json_mode: bool) -> None:
    """Where it serves, once everything is bound: one JSON document with --json."""
    warning = (
        "listening beyond loopback; an authenticated HTTPS reverse proxy must sit in front "
        "of this server"
        if remote
        else None
    )
    if json_mode:
        sys.stdout.write(json.dumps({**shown, "warning": warning}) + "\n")
    else:
        sys.stdout.write(f"aiworker web at {shown['web']}\n")
        if warning:
            sys.stdout.write(f"warning: {warning}\n")
        if shown["runner_api"]:
            sys.stdout.write(f"aiworker runner API at {shown['runner_api']}\n")
    sys.stdout.flush()


def _shown(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(
    config_path: Path,
    config_required: bool,
    state_dir: Path,
    listen: str,
    allow_remote: bool,
    public_origin: str | None = None,
    runner_listen: str | None = None,
    json_mode: bool = False,
) -> None:

    import uvicorn

    from aiworker.config.loader import load_config
    from aiworker.web.app import create_app
    from aiworker.web.connections import allow_descriptors
    from aiworker.web.runner_api import create_runner_app

    host, _ = parse_listen(listen)
    if not is_loopback(host) and not allow_remote:
        raise InvalidInput(
            f"{host} is not a loopback address; pass --allow-remote to bind it, behind an "
            "authenticated HTTPS reverse proxy"
        )
    if public_origin is not None:
        public_origin_of(public_origin)  # refused before anything is bound
    if runner_listen is not None:
        runner_host, _ = parse_listen(runner_listen, "--runner-listen")
        if not is_loopback(runner_host) and not allow_remote:
            raise InvalidInput(
                f"--runner-listen {runner_listen}: not a loopback address; pass --allow-remote "
                "to let runners on other hosts reach it (behind TLS: tokens travel in headers)"
            )

    def environment() -> Environment:
        loaded = load_config(config_path, required=config_required)
        return Environment(state_dir.absolute(), loaded)

    env = environment()  # a broken configuration is reported now, not later
    env.ensure_state_dir()  # as every command refuses it: another user's, read-only
    loaded = env.loaded
    # The origin the configuration publishes (status links) is one the server answers to.
    public_origin = public_origin or loaded.config.web.public_url
    # Provider keys are registered where the providers run; this process masks them too.
    for options in loaded.config.provider_options.values():
        if options.api_key_env and (key := os.environ.get(options.api_key_env)):
            register_secret(key)
    allow_descriptors()
    sock, host, port = _bind(listen)
    hosts = allowed_hosts(host, port)
    origins = {f"http://{h}" for h in hosts}
    if public_origin is not None:
        # Behind the reverse proxy the browser names the proxy's address, not ours.
        origin, proxied = public_origin_of(public_origin)
        hosts, origins = hosts | {proxied}, origins | {origin}
    servers = [(create_app(environment, hosts, origins), sock)]
    running: list[uvicorn.Server] = []  # once serving: a stop sets should_exit on each
    shown = {"web": _shown(host, port), "runner_api": None}
    if runner_listen is not None:
        # The runner API alone, on its own address (it may face other hosts); bound before
        # anything is announced, so that a refusal is the only thing said.
        try:
            runner_sock, runner_host, runner_port = _bind(runner_listen)
        except BaseException:
            sock.close()
            raise
        stopping = lambda: any(server.should_exit for server in running)  # noqa: E731
        servers.append((create_runner_app(environment, stopping), runner_sock))
        shown["runner_api"] = _shown(runner_host, runner_port)
    _announce(shown, remote=not is_loopback(host), json_mode=json_mode)

    _serve_all(servers, running)


def _serve_all(servers: list[tuple[Any, socket.socket]], running: list[Any]) -> None:
    """Serve each app on its socket until a signal stops them all; RUNNING gets their
    servers as they are made (the runner API's waiting claims watch them)."""
    import asyncio

    import uvicorn

    from aiworker.web.connections import KEEP_ALIVE_S, HeadLimited

    running += [
        uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="off",
                # Longer than a runner's heartbeat interval: a connection it keeps for the
                # next beat is not closed under it (a reset, not retried).
                timeout_keep_alive=KEEP_ALIVE_S,
                http=HeadLimited,  # a head that does not come in time closes it
                timeout_graceful_shutdown=STOP_GRACE_S,  # then what is in flight ends
            )
        )
        for app, _ in servers
    ]

    async def stop_together() -> None:
        """A signal reaches one server (each takes the handlers over from the last): the
        others stop with it, so that they wind down at once, within one grace."""
        while not any(server.should_exit for server in running):
            await asyncio.sleep(0.1)
        for server in running:
            server.should_exit = True

    async def run_all() -> None:
        sockets = (bound for _, bound in servers)
        serving = (s.serve(sockets=[b]) for s, b in zip(running, sockets, strict=True))
        await asyncio.gather(*serving, stop_together())

    asyncio.run(run_all())
