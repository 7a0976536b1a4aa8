"""The fixed harness: state and config under tmp_path, plain output, helpers to run the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from aiworker.cli import main
from tests.fake_forge import fake  # noqa: F401 - shared fixture
from tests.forge_fixtures import forge  # noqa: F401 - shared fixture
from tests.helpers import Result, run_process  # noqa: F401 - re-exported for the tests
from tests.pg_fixtures import configure_database, postgres, postgres_url  # noqa: F401
from tests.provider_clis import bin_dir  # noqa: F401 - shared fixture

REPO_ROOT = Path(__file__).resolve().parent.parent

# Hypothesis's timing checks measure the machine, not the code: on a loaded 2-core machine
# (four test workers, guests under TCG) generating one input took 1.2 s and failed a run.
settings.register_profile("loaded", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("loaded")


# The longest tests, started first: with -n 4 a 20-minute test that starts last would
# add its whole length to the run.
FIRST = ("test_systemd_guest.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in FIRST)  # stable: the rest keep order


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state"
    monkeypatch.setenv("AIWORKER_STATE_DIR", str(state))
    monkeypatch.delenv("AIWORKER_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "80")
    return state


@pytest.fixture
def state_dir(isolated_environment: Path) -> Path:
    return isolated_environment


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run the CLI in this process, as the console script does."""

    def run(*args: str) -> Result:
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def upgraded(cli, state_dir: Path) -> Path:
    """A state directory whose database is at head; returns the database path."""
    result = cli("db", "upgrade")
    assert result.exit_code == 0, result
    return state_dir / "aiworker.db"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, cli, state_dir: Path, tmp_path: Path, monkeypatch) -> str:
    """An upgraded store on each engine, named to the CLI by its configuration; returns
    its URL. The store's tests take it to run unchanged on SQLite and PostgreSQL."""
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
        configure_database(url, tmp_path / "postgresql.toml", monkeypatch)
    else:
        url = f"sqlite:///{state_dir / 'aiworker.db'}"
    result = cli("db", "upgrade")
    assert result.exit_code == 0, result
    return url


# Imported last: these fixtures use the helpers above.
from tests.delivery_fixtures import claimed  # noqa: E402, F401 - shared fixture
from tests.guest_fixtures import guests_dir, shared_image  # noqa: E402, F401 - shared fixtures
from tests.llama_fixtures import (  # noqa: E402, F401 - shared fixtures
    llama_files,
    llama_server,
    opencode_on_path,
)

HOLDER = """
import sys, time
from pathlib import Path
from aiworker.runtime.locks import SETTLE_SECONDS, LockDir
lock = LockDir(Path(sys.argv[1])).lock(sys.argv[2])
assert lock.try_share() if sys.argv[3:] == ["--share"] else lock.try_acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def hold_in_child():
    """Hold a named lock of a state directory in a child process (killed at the end)."""
    children = []

    def start(state_dir, name, *, shared=False):
        mode = ["--share"] if shared else []
        argv = [sys.executable, "-c", HOLDER, str(state_dir), name, *mode]
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        children.append(child)
        assert child.stdout.readline().strip() == "held"
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()
        child.stdout.close()
