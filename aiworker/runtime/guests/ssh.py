"""SSH to a guest over its loopback-forwarded port: the pinned host key only (RejectPolicy:
an unknown or different key is refused, never learnt), key login, commands with
deadlines and bounded output, files over SFTP."""

from __future__ import annotations

import base64
import contextlib
import logging
import shlex
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiworker.errors import AiworkerError

if TYPE_CHECKING:
    import paramiko

# paramiko logs each refused attempt of a booting guest from its own thread; the
# outcome is reported by the caller.
logging.getLogger("paramiko").setLevel(logging.CRITICAL)
STALL_S = 60.0  # no SFTP answer for this long: the connection is taken as broken
REQUEST_S = 60.0  # no answer to a command's or a subsystem's request: the same
DRAIN_S = 10.0  # output a command's background children write after it exited


class GuestUnreachable(AiworkerError):
    code = "guest_unreachable"


class HostKeyRefused(AiworkerError):
    code = "guest_host_key"


@dataclass
class Completed:
    exit_code: int | None  # None: the deadline passed first
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _public_key(line: str) -> paramiko.PKey:
    import paramiko

    kind, data = line.split()[:2]
    if kind != "ssh-ed25519":
        raise HostKeyRefused(f"the pinned host key is {kind}, not ssh-ed25519")
    return paramiko.Ed25519Key(data=base64.b64decode(data))


class GuestShell:
    def __init__(self, client: paramiko.SSHClient) -> None:
        self.client = client

    @classmethod
    def connect(
        cls,
        port: int,
        host_key: str,
        client_key: Path,
        deadline: float,
        user: str = "root",
        alive: Callable[[], bool] = lambda: True,
    ) -> GuestShell:
        """Log in as USER before DEADLINE (monotonic), retrying while the guest boots and
        ALIVE (its QEMU still runs) holds. paramiko is imported only now: a restoring
        guest's first moments pay for it, not the command's start."""
        import paramiko

        key = paramiko.Ed25519Key.from_private_key_file(str(client_key))
        last = "no answer"
        while time.monotonic() < deadline and alive():
            client = paramiko.SSHClient()
            client.get_host_keys().add(f"[127.0.0.1]:{port}", "ssh-ed25519", _public_key(host_key))
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            wait = max(0.5, min(5.0, deadline - time.monotonic()))
            try:
                client.connect(
                    "127.0.0.1",
                    port,
                    username=user,
                    pkey=key,
                    look_for_keys=False,
                    allow_agent=False,
                    timeout=wait,
                    banner_timeout=wait,
                    auth_timeout=wait,
                )
                return cls(client)
            except paramiko.BadHostKeyException as exc:
                client.close()
                raise HostKeyRefused(
                    "the guest presented a host key other than the pinned one; refused"
                ) from exc
            except paramiko.AuthenticationException as exc:
                client.close()
                raise GuestUnreachable(f"the guest refused the control key: {exc}") from exc
            except (paramiko.SSHException, OSError, EOFError) as exc:
                client.close()
                last = str(exc) or type(exc).__name__
                time.sleep(0.05)
        raise GuestUnreachable(f"no SSH login before the deadline ({last})")

    def run(
        self,
        command: str,
        *,
        timeout: float = 60,
        stdin: bytes | None = None,
        limit: int = 1 << 20,
    ) -> Completed:
        """COMMAND (a shell line) with a deadline; at most LIMIT bytes of each stream."""
        channel = self._transport().open_session(timeout=10)
        try:
            request(channel, "exec_command", command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = bytearray(), bytearray()

            def keep(into: bytearray) -> Callable[[bytes], None]:
                return lambda data: into.extend(data[: max(0, limit - len(into))])

            status = pump(channel, keep(out), keep(err), time.monotonic() + timeout)
            return Completed(status, bytes(out), bytes(err))
        finally:
            channel.close()

    def check(self, command: str, *, timeout: float = 60, stdin: bytes | None = None) -> bytes:
        done = self.run(command, timeout=timeout, stdin=stdin)
        if not done.ok:
            what = "timed out" if done.exit_code is None else f"exited {done.exit_code}"
            detail = done.stderr.decode(errors="replace").strip()[-300:]
            raise GuestUnreachable(f"`{command[:80]}` in the guest {what}: {detail}")
        return done.stdout

    def put_tree(self, local: Path, remote: str, timeout: float = 600) -> None:
        """LOCAL's tree (links kept as links) into REMOTE, owned by the unprivileged user."""
        channel = self._transport().open_session(timeout=10)
        try:
            channel.settimeout(timeout)
            target = shlex.quote(remote)
            unpack = f"mkdir -p {target} && tar -x -C {target} --no-same-owner"
            request(channel, "exec_command", f"{unpack} && chown -R dev:dev {target}")
            with channel.makefile("wb") as stream, tarfile.open(fileobj=stream, mode="w|") as tar:
                tar.add(local, arcname=".")
            channel.shutdown_write()
            if not channel.status_event.wait(timeout):
                raise GuestUnreachable(f"unpacking the tree into the guest took over {timeout} s")
            status = channel.recv_exit_status()
        finally:
            channel.close()
        if status != 0:
            raise GuestUnreachable(f"unpacking the tree into the guest exited {status}")

    def put(self, local: Path, remote: str) -> None:
        with self.sftp() as sftp:
            sftp.put(str(local), remote)

    def put_bytes(self, data: bytes, remote: str, mode: int = 0o600) -> None:
        with self.sftp() as sftp, sftp.open(remote, "wb") as handle:
            handle.write(data)
            handle.chmod(mode)

    def get(self, remote: str, local: Path) -> None:
        with self.sftp() as sftp:
            sftp.get(remote, str(local))

    def open_sftp(self, stall_s: float = STALL_S) -> paramiko.SFTPClient:
        """An SFTP session each of whose answers, its opening handshake included, comes
        within STALL_S, else a TimeoutError: a guest whose SFTP server never answers is a
        broken connection, not a job that hangs."""
        import paramiko

        channel = self._transport().open_session(timeout=10)
        channel.settimeout(stall_s)
        try:
            request(channel, "invoke_subsystem", "sftp")
            return paramiko.SFTPClient(channel)
        except BaseException:
            channel.close()
            raise

    @contextlib.contextmanager
    def sftp(self, stall_s: float = STALL_S) -> Iterator[paramiko.SFTPClient]:
        """open_sftp for the block, closed after it; a broken or stalled session is
        GuestUnreachable (a missing or refused file is the guest's answer, as it is)."""
        import paramiko

        try:
            client = self.open_sftp(stall_s)
            try:
                yield client
            finally:
                client.close()
        except (paramiko.SSHException, EOFError, TimeoutError, ConnectionError) as exc:
            why = str(exc) or type(exc).__name__
            raise GuestUnreachable(f"SFTP with the guest broke: {why}") from None

    def _transport(self) -> paramiko.Transport:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise GuestUnreachable("the SSH connection to the guest is closed")
        return transport

    def close(self) -> None:
        self.client.close()


def request(channel: paramiko.Channel, name: str, argument: str) -> None:
    """Make CHANNEL's request NAME (exec_command, invoke_subsystem) with ARGUMENT, whose
    answer must come within REQUEST_S, else the channel is closed and the guest is
    unreachable: paramiko waits for the answer without a limit, and a guest that froze
    after the channel opened (its memory spent, its sshd stopped) would hold the job for
    ever, its heartbeat beating."""
    unanswered = threading.Event()

    def give_up() -> None:
        unanswered.set()
        with contextlib.suppress(Exception):  # the connection may be broken already
            channel.close()  # marks it closed and wakes the waiting request, which fails

    timer = threading.Timer(REQUEST_S, give_up)
    timer.daemon = True
    timer.start()
    unreachable = GuestUnreachable(f"the guest did not answer {name} within {REQUEST_S:.0f} s")
    try:
        getattr(channel, name)(argument)
    except Exception:
        if unanswered.is_set():
            raise unreachable from None
        raise
    finally:
        timer.cancel()
    if unanswered.is_set():  # answered as the limit passed: the channel is closed all the same
        raise unreachable


def pump(
    channel: paramiko.Channel,
    stdout: Callable[[bytes], None],
    stderr: Callable[[bytes], None],
    deadline: float | None,
) -> int | None:
    """Hand CHANNEL's output to STDOUT and STDERR as it comes, until its command has
    exited and its output ended, or DEADLINE (monotonic; None: none) passed: the exit
    status, or None at the deadline. What the command left running that holds its output
    open may write for DRAIN_S after its exit, no longer (as the local backend drains).
    Once its output ended it waits for the exit status; it never spins."""
    channel.settimeout(0.2)
    ended, drained_by = False, None
    while deadline is None or time.monotonic() < deadline:
        if ended:
            channel.status_event.wait(0.2)
        else:
            try:
                chunk = channel.recv(65536)
            except TimeoutError:
                pass
            else:
                ended = not chunk
                if chunk:
                    stdout(chunk)
        while channel.recv_stderr_ready():
            stderr(channel.recv_stderr(65536))
        if channel.exit_status_ready():
            drained_by = drained_by or time.monotonic() + DRAIN_S
            if ended or time.monotonic() >= drained_by:
                while channel.recv_stderr_ready():
                    stderr(channel.recv_stderr(65536))
                return int(channel.recv_exit_status())
    return None
