"""Shared fixtures: a network guard, fake cloud credentials, and a leaked-worker check.

The guard refuses any connection or name lookup that is not loopback or routed to a bridge
this run made (``support/netguard.py``), so a mistake fails fast instead of leaving the
machine. The leak check runs after every test (``support/leaks.py``): a test that leaves a
``skyward.worker`` process alive fails, by name, and the pool it left open is closed there,
so that the tests after it do not fail for it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import dispositions, netguard
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.standins import StandInCloud
from support.leaks import no_leaked_workers as no_leaked_workers  # autouse, every test
from support.pools import PoolFactory, pool_factory
from support.processes import our_namespaces
from support.sshhosts import Hosts, PackageIndex


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        help="also run the long soak tests, and fuzz configuration with 20x more examples",
    )


def pytest_configure(config: pytest.Config) -> None:
    from hypothesis import settings

    settings.register_profile("ci", max_examples=150)
    settings.register_profile("soak", max_examples=3000)
    settings.load_profile("soak" if config.getoption("--soak") else "ci")
    config.addinivalue_line("markers", "soak: a long run, only with --soak")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == 0:
        for made in _made_dirs:
            shutil.rmtree(made, ignore_errors=True)
    if _MADE_LOG_DIR is None:
        return
    if exitstatus == 0:
        shutil.rmtree(_MADE_LOG_DIR, ignore_errors=True)
    else:
        sys.stderr.write(f"\nthe pools' logs of this run are kept in {_MADE_LOG_DIR}\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    kept = [item for item in items if "soak" not in item.keywords]
    config.hook.pytest_deselected(items=[i for i in items if "soak" in i.keywords])
    items[:] = kept


os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_GCE_CHECK": "True",
    }
)
# Pools keep their logs under the user's cache; the suite's thousand pools keep theirs apart,
# in a directory this process makes (xdist's workers inherit it) and removes when the run
# passed (pytest_sessionfinish); a failed run keeps it and says where.
_MADE_LOG_DIR: str | None = None
_made_dirs: list[str] = []  # made by this process for the run; removed when it passed
if "SKYWARD_LOG_DIR" not in os.environ:
    _MADE_LOG_DIR = os.environ["SKYWARD_LOG_DIR"] = tempfile.mkdtemp(prefix="skyward-test-logs-")
# Machines kept warm (keep_warm) are recorded in the user's state directory; the suite keeps
# its own, removed with the logs' when the run passed.
if "SKYWARD_STATE_DIR" not in os.environ:
    _MADE_STATE_DIR = os.environ["SKYWARD_STATE_DIR"] = tempfile.mkdtemp(prefix="skyward-state-")
    _made_dirs.append(_MADE_STATE_DIR)

# Loopback, and addresses only while they route to a bridge this run made (support/netguard).
netguard.install()
# Ctrl-C raises KeyboardInterrupt here even when the run was started with `cmd &` or nohup,
# which start it ignored (support/dispositions.py); tests interrupt the main thread.
dispositions.restore_sigint()


# ── SSH hosts in network namespaces, and the package index they install from ─────────────

_WHEEL_CACHE = Path.home() / ".cache" / "skyward-tests" / "wheels"


@pytest.fixture(scope="session")
def ssh_hosts() -> Iterator[Hosts]:
    hosts = Hosts.start(4)
    namespaces = [h.netns for h in hosts.hosts]
    our_namespaces.add(*namespaces)
    mirror = None
    try:
        # The hosts are this machine: Debian's python3.11 and nothing else. A client on
        # another minor version has its hosts' bootstrap install that version with uv, which
        # a real host downloads from GitHub; these hosts get it from a mirror of this
        # machine's own builds instead (support/pythons.py), set in the user's environment.
        minor = f"{sys.version_info.major}.{sys.version_info.minor}"
        if not any(Path(d, f"python{minor}").exists() for d in ("/usr/local/bin", "/usr/bin")):
            from support.pythons import PythonMirror, build_install_only

            mirror = PythonMirror(
                hosts.root / "python-mirror",
                [build_install_only(minor)],
                bind=hosts.bridge_address,
            )
            hosts.set_environment(mirror.env)
        yield hosts
    finally:
        if mirror is not None:
            mirror.close()
        hosts.close()
        our_namespaces.discard(*namespaces)
    assert not hosts.leftovers(), f"SSH test hosts left behind: {hosts.leftovers()}"


@pytest.fixture(scope="session")
def package_index(ssh_hosts: Hosts) -> Iterator[PackageIndex]:
    """What the hosts may install: the worker's own needs, uv, jax, and test packages."""
    from importlib import metadata

    index = PackageIndex(ssh_hosts.root / "index", ssh_hosts.bridge_address)
    try:
        pins = [f"{n}=={metadata.version(n)}" for n in ("cloudpickle", "pydantic", "jax", "jaxlib")]
        index.download([*pins, "uv"], _WHEEL_CACHE)
        yield index
    finally:
        index.close()


@pytest.fixture(params=["local", "ssh"])
def make_pool(request: pytest.FixtureRequest) -> PoolFactory:
    """Build pools on either transport: the core behaviour suite runs over both."""
    return pool_factory(request.param, request)


@pytest.fixture(scope="module", params=["local", "ssh"])
def make_module_pool(request: pytest.FixtureRequest) -> PoolFactory:
    return pool_factory(request.param, request)


@pytest.fixture(scope="session")
def _shared_tmp() -> Iterator[Path]:
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="skyward-tests-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tmp_path(_shared_tmp: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh directory that SSH workers, who run as another user, can use too.

    Tests hand paths to workers (gates, logs); pytest's own ``tmp_path`` is private to root.
    Like pytest's, it outlives its test (a worker may still be looking at it while the
    pool's fixture closes), and goes at the end of the session.
    """
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=request.node.name[:40] + "-", dir=_shared_tmp))
    path.chmod(0o777)
    return path


# ── the moto server (EC2 and SSM) ───────────────────────────────────────────────────────


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer()
    try:
        yield server
    finally:
        server.close()
    assert server.process.poll() is not None, "moto_server is still running"


@pytest.fixture
def moto(moto_server: MotoServer) -> MotoServer:
    """The moto server, empty but for an AMI published under
    ``support.clouds.aws.fake.AMI_PARAMETER``."""
    moto_server.reset()
    moto_server.seed_ami()
    return moto_server


@pytest.fixture
def standin_cloud(moto: MotoServer, ssh_hosts: Hosts) -> Iterator[StandInCloud]:
    """moto with stand-in VMs for the instances it runs in ``standin_cloud.subnet``."""
    cloud = StandInCloud(moto, ssh_hosts)
    try:
        yield cloud
    finally:
        cloud.close()
    assert not cloud.leftovers(), f"stand-ins left behind: {cloud.leftovers()}"
