"""Cache layers: optional overlays of the current image that hold what a script put
there (a browser, dependency caches), without rewriting the base. `qemu provision
--layer NAME --script FILE` boots the image cold with the layer's own disk (backed by
the base), runs FILE as root with the `setup` egress allowlist, and saves the booted
state; `execution.cache_layer = NAME` starts every guest from it."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from aiworker.core.context import Environment
from aiworker.core.guests.backends import accel_of, require_image
from aiworker.core.guests.paths import for_the_owner
from aiworker.core.guests.provision import boot_and_save, checked_wait, sha256_of, wait_for_jobs
from aiworker.core.progress import Stages, quiet
from aiworker.core.report import Report
from aiworker.errors import AiworkerError, InvalidInput, Unavailable
from aiworker.runtime.guests.backend import proxy_env
from aiworker.runtime.guests.egress import EgressPolicy
from aiworker.runtime.guests.images import Image, ImageStore
from aiworker.runtime.guests.machine import MachineSpec
from aiworker.runtime.guests.ssh import GuestShell

LAYER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
SCRIPT = "/root/aiworker-layer-script"


@dataclass
class LayerReport(Report):
    image: str
    layer: str
    build_s: float
    script_sha256: str


def provision_layer(
    env: Environment, name: str, script: Path, *, wait_s: float = 0, stages: Stages = quiet
) -> LayerReport:
    checked_wait(wait_s)
    if not LAYER_NAME.match(name):
        raise InvalidInput(f"layer name {name!r}: 1-32 of a-z 0-9 - (starting with one of a-z 0-9)")
    if not script.is_file():
        raise InvalidInput(f"--script {script}: no such file")
    store, image = require_image(env, layered=False)
    layer = image.with_layer(name)
    with for_the_owner(env):
        return _under_the_gate(env, store, layer, name, script, wait_s, stages)


def _under_the_gate(
    env: Environment,
    store: ImageStore,
    layer: Image,
    name: str,
    script: Path,
    wait_s: float,
    stages: Stages,
) -> LayerReport:
    maintenance = env.locks.maintenance()
    try:
        wait_for_jobs(env, store, wait_s)
        users = [g.name for g in store.guests() if g.record.get("layer") == name and g.alive]
        if users:
            raise Unavailable(f"guests still run from layer {name}: {', '.join(users)}")
        shutil.rmtree(layer.layer_dir, ignore_errors=True)
        layer.layer_dir.mkdir(mode=0o700, parents=True)
        try:
            return _build(env, store, layer, script, stages)
        except BaseException:
            shutil.rmtree(layer.layer_dir, ignore_errors=True)
            raise
    finally:
        maintenance.release()


def _build(
    env: Environment, store: ImageStore, layer: Image, script: Path, stages: Stages
) -> LayerReport:
    execution = env.loaded.config.execution
    data = script.read_bytes()
    machine = MachineSpec(execution.memory_mib, execution.cpus, accel_of(layer))
    policy = EgressPolicy(tuple(execution.allowlist("setup")), tuple(execution.trusted_networks))

    def run_script(shell: GuestShell) -> None:
        stages(f"running {script} in the guest (setup egress allowlist)")
        shell.put_bytes(data, SCRIPT, mode=0o700)
        variables = " ".join(f"{k}={shlex.quote(v)}" for k, v in proxy_env("/root").items())
        done = shell.run(f"env {variables} {SCRIPT}", timeout=execution.setup_timeout_s)
        if not done.ok:
            what = "timed out" if done.exit_code is None else f"exited {done.exit_code}"
            tail = done.stderr.decode(errors="replace").strip()[-400:]
            raise AiworkerError(f"the layer script {what}: {tail}")
        shell.check(f"rm -f {SCRIPT}")
        stages("saving the layer's booted state")

    started = time.monotonic()
    stages(f"booting {layer.name} cold with layer {layer.layer}")
    boot_and_save(store, layer, machine, execution.boot_deadline_s, True, run_script, policy)
    digest = sha256_of(script)
    record = {
        "layer": layer.layer,
        "script_sha256": digest,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": asdict(machine),
        "files": {
            n: {"sha256": sha256_of(layer.layer_dir / n)} for n in ("warm.qcow2", "state.bin")
        },
    }
    (layer.layer_dir / "layer.json").write_text(json.dumps(record, indent=2) + "\n")
    return LayerReport(layer.name, str(layer.layer), round(time.monotonic() - started, 1), digest)
