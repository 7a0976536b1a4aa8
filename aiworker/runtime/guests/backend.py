"""The `qemu` execution backend: each phase in a fresh guest of the current image.

The host keeps a small workspace (the phase's inputs, the result bundle, the spec of the
remote command); the repository lives in the guest at /home/dev/work/repo, checked out
from a bundle sent over SFTP, and every command runs there as the unprivileged `dev`
with the egress proxy as its only way out. Dependency setup (an executable `ci/setup`)
runs before any credential is in the guest; then the provider's homes are copied into a
tmpfs, and taken back (refreshed logins adopted only for the same identity) and the
tmpfs removed before the phase ends. Forge tokens never enter the guest.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiworker.errors import Unavailable
from aiworker.runtime.artifact_files import ArtifactFiles
from aiworker.runtime.atomic import copy_private
from aiworker.runtime.attempts import remove_attempt
from aiworker.runtime.guests.egress import DecisionLog, EgressPolicy, EgressProxy
from aiworker.runtime.guests.guest import Guest, StartOptions
from aiworker.runtime.guests.images import Image, ImageStore
from aiworker.runtime.guests.lending import KILL_DEV, Lease, lend_homes, take_back
from aiworker.runtime.guests.machine import (
    MODEL_ADDRESS,
    MODEL_PORT,
    PROXY_ADDRESS,
    PROXY_PORT,
    MachineSpec,
)
from aiworker.runtime.guests.ssh import GuestShell
from aiworker.runtime.guests.transfer import fetch_verified
from aiworker.runtime.workspace import (
    Workspace,
    WorkspaceError,
    moved,
    write_inputs,
)

WORK = "/home/dev/work"
# Root-owned places (under /run, which `dev` cannot write): root never works on a path
# the unprivileged user could have replaced with a link.
# Root-owned, as the credentials' tmpfs (lending.py): files the command names go here.
FILES = "/run/aiworker-files"
MAX_BUNDLE_BYTES = 2 << 30
GUEST_PATH = "/usr/local/bin:/usr/bin:/bin"
PROXY = f"http://{PROXY_ADDRESS}:{PROXY_PORT}"
log = logging.getLogger(__name__)


class GuestUnavailable(Unavailable):
    code = "guest_unavailable"


@dataclass(frozen=True)
class GuestSettings:
    machine: MachineSpec = field(default_factory=MachineSpec)
    boot_deadline_s: float = 180
    setup_timeout_s: float = 1800
    model_target: str | None = None
    # The artifact store files from the guest come into (resumable, verified); None: a
    # private one in the workspace, removed with it.
    artifacts: Path | None = None


def as_dev(command: str, env: dict[str, str], cwd: str = f"{WORK}/repo") -> str:
    """COMMAND (a shell line) as the unprivileged user, in CWD, with only ENV."""
    variables = [f"{k}={v}" for k, v in sorted(env.items())]
    return (
        f"cd {shlex.quote(cwd)} && exec setpriv --reuid=1000 --regid=1000 --clear-groups "
        f"env -i {shlex.join(variables)} sh -c {shlex.quote(command)}"
    )


def proxy_env(home: str = f"{WORK}/home") -> dict[str, str]:
    return {
        "PATH": GUEST_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "http_proxy": PROXY,
        "https_proxy": PROXY,
        "HTTP_PROXY": PROXY,
        "HTTPS_PROXY": PROXY,
        "no_proxy": f"localhost,127.0.0.1,{MODEL_ADDRESS}",  # the model forwarder is direct
    }


@dataclass
class Session:
    guest: Guest
    proxy: EgressProxy
    leases: list[Lease] = field(default_factory=list)
    # What `git status` said once the repository's own setup ran (a read-only checkout).
    baseline: frozenset[str] = frozenset()
    mapping: dict[str, str] = field(default_factory=dict)  # host path -> guest path
    home_open: bool = False

    @property
    def shell(self) -> GuestShell:
        assert self.guest.shell is not None
        return self.guest.shell


class QemuBackend:
    name = "qemu"

    def __init__(
        self,
        store: ImageStore,
        image: Image | None,
        phase: str,
        policy: EgressPolicy,
        settings: GuestSettings,
        unavailable: str | None = None,
    ) -> None:
        self.store, self.phase = store, phase
        self.policy, self.settings = policy, settings
        self.sessions: dict[Path, Session] = {}
        # No image or no QEMU: every phase fails (retried, refunded) until provisioned.
        self.unavailable = unavailable if image is not None else unavailable or "no image"
        self._image = image

    @property
    def image(self) -> Image:
        if self._image is None or self.unavailable is not None:
            raise GuestUnavailable(self.unavailable or "no guest image")
        return self._image

    def describe(self) -> dict[str, str]:
        return {
            "backend": self.name,
            "accel": self.settings.machine.accel,
            "image": self.image.name,
        }

    def route_model(self, target: str) -> None:
        """Guests booted from now on forward their model address to TARGET."""
        self.settings = replace(self.settings, model_target=target)

    def start_guest(self, purpose: str) -> Session:
        proxy = EgressProxy(self.policy, DecisionLog(self.store.root / "egress.jsonl", purpose))
        try:
            guest = Guest.start(
                self.store,
                self.image,
                StartOptions(
                    purpose=purpose,
                    proxy_port=proxy.port,
                    machine=self.settings.machine,
                    model_target=self.settings.model_target,
                    boot_deadline_s=self.settings.boot_deadline_s,
                ),
            )
        except BaseException:
            proxy.close()
            raise
        return Session(guest, proxy)

    def prepare(
        self,
        root: Path,
        bundle: Path,
        base_ref: str,
        inputs: dict[str, str | bytes],
        *,
        read_only: bool = False,
    ) -> Workspace:
        self.image  # noqa: B018 - raises GuestUnavailable before anything is made
        if root.exists():
            raise WorkspaceError(f"workspace {root} already exists")
        root.mkdir(mode=0o700, parents=True)
        workspace = Workspace(root)
        workspace.repo.mkdir()  # the job's working folder on this side
        write_inputs(workspace, inputs)
        session = self.sessions[root] = self.start_guest(self.phase)
        session.mapping[str(root)] = WORK
        try:
            self._send(session, workspace, bundle, base_ref, detached=read_only)
            self._setup(session)
            if read_only:
                # After the repository's own setup (what it wrote is the baseline): a
                # read-only bind the job cannot undo (it runs as dev, without
                # capabilities); the files stay dev's for git.
                session.baseline = frozenset(self._status(session))
                session.shell.check(
                    f"mount --bind {WORK}/repo {WORK}/repo && mount -o remount,bind,ro {WORK}/repo"
                )
        except BaseException:
            self.teardown(workspace, preserve=False)
            raise
        return workspace

    def _send(
        self, session: Session, workspace: Workspace, bundle: Path, base_ref: str, detached: bool
    ) -> None:
        shell = session.shell
        shell.check(
            f"install -d -o dev -g dev -m 0700 {WORK} {WORK}/aiworker {WORK}/home && "
            f"mkdir -m 0755 {FILES}"
        )
        shell.put(bundle, f"{WORK}/input.bundle")
        for path in sorted(p for p in workspace.inputs.rglob("*") if p.is_file()):
            target = f"{WORK}/aiworker/{path.relative_to(workspace.inputs)}"
            shell.check(f"mkdir -p {shlex.quote(str(Path(target).parent))}")
            shell.put(path, target)
        shell.check(f"chown -R dev:dev {WORK}")
        ref = shlex.quote(f"{base_ref}:refs/heads/base")
        self._check(
            session,
            f"git init -q {WORK}/repo && cd {WORK}/repo && "
            f"git fetch -q ../input.bundle {ref} && "
            + ("git checkout -q --detach base" if detached else "git checkout -q -b work base"),
            cwd=WORK,
        )

    def altered(self, workspace: Workspace) -> list[str]:
        """What the job changed in a checkout it was to leave as it was (see the local
        backend's): a moved HEAD and every path `git status` reports that it did not
        report once the repository's setup had run."""
        session = self.sessions[workspace.root]
        head = self._check(session, "git rev-parse HEAD base").decode().split()
        found = [f"HEAD moved to {head[0][:12]}"] if head[0] != head[1] else []
        return found + [p for p in self._status(session) if p not in session.baseline]

    def _status(self, session: Session) -> list[str]:
        status = self._check(session, "git status --porcelain --untracked-files=all").decode()
        return [line[3:] for line in status.splitlines() if line.strip()]

    def _check(
        self, session: Session, command: str, *, cwd: str = f"{WORK}/repo", timeout: float = 300
    ) -> bytes:
        return session.shell.check(as_dev(command, proxy_env(), cwd), timeout=timeout)

    def _setup(self, session: Session) -> None:
        """The repository's own dependency setup, before any credential is present; what
        it started is killed before a credential comes in."""
        setup = session.shell.run(f"test -x {WORK}/repo/ci/setup")
        if setup.exit_code != 0:
            return
        done = session.shell.run(
            as_dev("./ci/setup", proxy_env()), timeout=self.settings.setup_timeout_s
        )
        if not done.ok:
            what = "timed out" if done.exit_code is None else f"exited {done.exit_code}"
            raise WorkspaceError(f"the repository's ci/setup {what} in the guest")

    def open_home(self, workspace: Workspace, homes: list[Path]) -> dict[str, str]:
        session = self.sessions[workspace.root]
        leases, leased = lend_homes(session.shell, workspace.root, homes)
        session.home_open = True
        session.leases.extend(leases)
        return leased

    def close_home(self, workspace: Workspace) -> list[str]:
        (workspace.root / "remote.json").unlink(missing_ok=True)  # it names the run's env
        session = self.sessions.get(workspace.root)
        if session is None or not session.home_open or session.guest.shell is None:
            return []
        notes = take_back(session.shell, session.leases)
        session.leases.clear()
        session.home_open = False
        return notes

    def command(
        self, argv: list[str], env: dict[str, str], workspace: Workspace, hidden: list[Path]
    ) -> tuple[list[str], dict[str, str]]:
        session = self.sessions[workspace.root]
        remote = list(argv)
        if remote[0] == sys.executable:
            remote[0] = "python3"
            if remote[1:2] == ["-m"] and remote[2].startswith("aiworker."):
                # A stdlib-only helper of ours (the script provider's agent): its file goes in.
                module = remote[2].removeprefix("aiworker.")
                source = Path(__file__).resolve().parents[2] / f"{module}.py"
                remote[1:3] = [self._upload(session, source)]
        for i, value in enumerate(remote):
            path = Path(value)
            inside = moved(value, {str(workspace.root): WORK}) != value
            if i and path.is_absolute() and path.is_file() and not inside:
                remote[i] = self._upload(session, path)  # a file the command names
        remote = [self._model_route(moved(v, session.mapping)) for v in remote]
        guest_env = {
            **proxy_env(),
            **{
                k: self._model_route(moved(v, session.mapping))
                for k, v in env.items()
                if k != "PATH"
            },
        }
        spec = {
            "port": session.guest.port,
            "host_key": self.image.host_key,
            "client_key": str(self.image.client_key),
            "command": as_dev(shlex.join(remote), guest_env),
        }
        spec_path = workspace.root / "remote.json"
        spec_path.write_text(json.dumps(spec))
        spec_path.chmod(0o600)
        local_env = {
            "PATH": "/usr/bin:/bin",
            "AIWORKER_ATTEMPT_ID": env.get("AIWORKER_ATTEMPT_ID", ""),
        }
        return [sys.executable, "-m", "aiworker.guest_exec", str(spec_path)], local_env

    def _model_route(self, value: str) -> str:
        """The local model server's address, as the guest reaches it: its own forwarder
        (10.0.2.101:8080), which leads to that server and nowhere else."""
        target = self.settings.model_target
        if target is None:
            return value
        return value.replace(f"//{target}", f"//{MODEL_ADDRESS}:{MODEL_PORT}")

    def _upload(self, session: Session, path: Path) -> str:
        """PATH into the root-owned files folder, readable by the unprivileged user."""
        target = f"{FILES}/{len(session.mapping)}-{path.name}"
        session.shell.put(path, target)
        session.shell.check(f"chmod 0644 {shlex.quote(target)}")
        session.mapping[str(path)] = target
        return target

    def _fetch(self, session: Session, remote: str, target: Path, shared: bool = True) -> None:
        """REMOTE to TARGET once no process of the run is left, if it is a regular file of
        at most MAX_BUNDLE_BYTES: into the artifact store first (SHARED: the state
        directory's; else one of the workspace's own, removed with it), by its digest,
        going on from what was received when the connection breaks (guests/transfer.py)."""
        session.shell.check(KILL_DEV, timeout=30)
        own = target.parent / "transfers"
        files = ArtifactFiles(
            self.settings.artifacts if shared and self.settings.artifacts else own
        )
        digest, _size = fetch_verified(session.guest, remote, files, MAX_BUNDLE_BYTES)
        copy_private(files.path(digest), target)

    def changed_lines(self, workspace: Workspace) -> int:
        session = self.sessions[workspace.root]
        total = 0
        for line in self._check(session, "git diff --numstat base...work").decode().splitlines():
            added, removed, _ = line.split("\t", 2)
            total += int(added) + int(removed) if added.isdigit() and removed.isdigit() else 1
        return total

    def result_bundle(self, workspace: Workspace, target: Path) -> Path | None:
        session = self.sessions[workspace.root]
        if self._check(session, "git rev-list --count base..work").strip() == b"0":
            return None
        self._check(session, f"git bundle create -q {WORK}/result.bundle base..work")
        self._fetch(session, f"{WORK}/result.bundle", target)
        return target

    def teardown(self, workspace: Workspace, *, preserve: bool) -> bool:
        """Take the credentials back, keep the work when PRESERVE, stop the guest, remove
        the host side; a failing step is logged and the others still run."""
        session = self.sessions.get(workspace.root)
        if session is not None:
            try:
                _settle(lambda: self.close_home(workspace))
                if preserve and session.guest.shell is not None:
                    _settle(lambda: self._keep(session, workspace))
            finally:
                self.sessions.pop(workspace.root, None)
                session.guest.stop()
                session.proxy.close()
        (workspace.root / "remote.json").unlink(missing_ok=True)
        if preserve:
            return False
        return remove_attempt(workspace.root).removed

    def _keep(self, session: Session, workspace: Workspace) -> None:
        self._check(session, f"git bundle create -q {WORK}/all.bundle --all")
        # Kept with the workspace for an operator, recorded nowhere: not in the shared store.
        self._fetch(session, f"{WORK}/all.bundle", workspace.root / "repo.bundle", shared=False)


def _settle(step: Callable[[], object]) -> None:
    try:
        step()
    except Exception:
        log.exception("a guest teardown step failed; the others still run")
