"""What `doctor` says about guests: the accelerator, the image and its age, the backend
phases get (a warning where it falls back to local), and the egress proxy answering."""

from __future__ import annotations

import socket
from functools import partial

from aiworker.core.context import Environment
from aiworker.core.guests.backends import (
    backend_choice,
    guest_store,
    isolation_refusal,
    missing_tools,
)
from aiworker.runtime.accel import kvm_static_verdict
from aiworker.runtime.guests.egress import DecisionLog, EgressPolicy, EgressProxy

STALE_DAYS = 30
# (name, status, detail), status ok | warn | fail.
Finding = tuple[str, str, str]


def guest_findings(env: Environment) -> list[Finding]:
    found = [_accelerator(env), _image(env), _backend(env)]
    if "socat" not in missing_tools():
        found.append(_proxy(env))
    return found


def _accelerator(env: Environment) -> Finding:
    image = guest_store(env).current()
    verdict = kvm_static_verdict()
    if image is not None:
        accel = image.manifest().get("accel", "tcg")
        return ("accelerator", "ok", f"{accel} (probed at provisioning; {verdict.reason})")
    status = "ok" if verdict.kvm else "warn"
    return ("accelerator", status, f"{verdict.reason}{'' if verdict.kvm else '; TCG'}")


def _image(env: Environment) -> Finding:
    image = guest_store(env).current()
    if image is None:
        return ("guest-image", "warn", "none provisioned (`aiworker qemu provision`)")
    days = image.age_s() / 86_400
    fast = "saved state for fast starts" if image.restorable else "cold boots only"
    detail = f"{image.name}, {days:.1f} days old, {fast}"
    if days > STALE_DAYS:
        return ("guest-image", "warn", f"{detail}: older than {STALE_DAYS} days, provision anew")
    return ("guest-image", "ok", detail)


def _backend(env: Environment) -> Finding:
    backend, why = backend_choice(env)
    configured = env.loaded.config.execution.backend is not None
    refused = [r for r in map(partial(isolation_refusal, env), env.loaded.config.providers) if r]
    if refused:
        return ("execution", "fail", "; ".join(refused))
    if backend == "local" and not configured:
        return ("execution", "warn", f"local: {why}; only the script provider runs, on this host")
    if backend == "qemu" and missing_tools():
        return ("execution", "fail", f"qemu configured, but {', '.join(missing_tools())} missing")
    if backend == "qemu" and guest_store(env).current() is None:
        return ("execution", "fail", "qemu configured, but no guest image is provisioned")
    return ("execution", "ok", f"{backend}: {why}")


def _proxy(env: Environment) -> Finding:
    """Start the proxy and ask it for the metadata address, allowlisted for the probe (and
    within a trusted network, if one covers it): the address rule must refuse it."""
    execution = env.loaded.config.execution
    hosts = (*execution.allowlist("default"), "169.254.169.254")
    policy = EgressPolicy(hosts, tuple(execution.trusted_networks))
    proxy = EgressProxy(policy, DecisionLog(None, "doctor"))
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            client.sendall(
                b"CONNECT 169.254.169.254:80 HTTP/1.1\r\nHost: 169.254.169.254:80\r\n\r\n"
            )
            answer = client.recv(200).split(b"\r\n", 1)[0].decode(errors="replace")
    except OSError as exc:
        return ("egress-proxy", "fail", f"the proxy did not answer: {exc}")
    finally:
        proxy.close()
    if " 403 " not in f"{answer} ":
        return ("egress-proxy", "fail", f"the proxy let the metadata address through: {answer}")
    allowed = len(policy.hosts) - 1
    return (
        "egress-proxy",
        "ok",
        f"answers and refuses the metadata address; {allowed} hosts allowed",
    )
