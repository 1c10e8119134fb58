"""The client's Python on any host: pools start on hosts whose only Python is another minor
version with no pip and no ensurepip (stock Ubuntu 24.04, the default AMIs), or with no
Python at all, from a 3.11 client and from a 3.13 one.

::

    root namespace                                   hosts on this module's own bridge
    ───────────────────────────────────────────      ─────────────────────────────────────────
    client: this pytest (3.11), or a 3.13            h0, h1  python3 = 3.12 only, no pip, no
      subprocess with its own venv                            ensurepip, no unzip, curl+wget
    PackageIndex  bridge:8700  uv, cloudpickle,      h2      no python3 at all, no unzip
      pydantic (cp311 and cp313)                     h3      as h0, plus a sudo and an apt-get
    PythonMirror  bridge:port  CPython 3.11, 3.13            that says the lock is held once
      built here from pyenv (uv's layout + list)

AWS stand-in VMs (moto's instances, played by namespace hosts on the same bridge) boot with
h0's system too. The hosts reach nothing but the bridge: uv, every package and the managed
CPython come from the index and the mirror this module serves (``support/hostimage.py``
says how the hosts' systems are made to look like the stock image; ``support/pythons.py``
how the mirror is).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from support import TESTS
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import held, nothing, standin_provider
from support.clouds.aws.standins import StandInCloud
from support.hostimage import FAKE_SUDO, HostImage, fake_apt_get
from support.pools import ssh_provider
from support.processes import our_namespaces
from support.pythons import PythonMirror, build_install_only, pyenv_python, venv_uv
from support.reporter import Recorder
from support.sshhosts import USER, Hosts, PackageIndex

import skyward as sky
from skyward.pool.spec import PoolSpec
from skyward.providers.ssh.bootstrap import Plan, render

_CACHE = Path.home() / ".cache" / "skyward-tests"
_APT_LOG = f"/home/{USER}/apt-calls.log"  # as the host sees its own home
_UBUNTU = HostImage(python="3.12", unzip=False)
_IMAGES = [
    _UBUNTU,
    _UBUNTU,
    HostImage(python=None, unzip=False),
    HostImage(
        python="3.12",
        unzip=False,
        tools={"sudo": FAKE_SUDO, "apt-get": fake_apt_get(Path(_APT_LOG), busy=1)},
    ),
]
# What a 3.13 client needs, and its workers: pinned to the 3.11 venv's versions.
_CLIENT_PACKAGES = ("cloudpickle", "pydantic", "paramiko", "click", "rich", "packaging")


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    started = Hosts.start(len(_IMAGES), image=_IMAGES)
    namespaces = [h.netns for h in started.hosts]
    our_namespaces.add(*namespaces)
    try:
        yield started
    finally:
        started.close()
        our_namespaces.discard(*namespaces)
    assert not started.leftovers(), f"test hosts left behind: {started.leftovers()}"


def _download(requirements: list[str], directory: Path, python: str) -> list[Path]:
    """Wheels for ``python`` of ``requirements`` and their dependencies, from the package
    index once, then from the cache ``directory`` (a marker names what it holds)."""
    import hashlib

    directory.mkdir(parents=True, exist_ok=True)
    wanted = hashlib.sha256(f"{python} {sorted(requirements)}".encode()).hexdigest()[:16]
    marker = directory / f".complete-{wanted}"
    if not marker.exists():
        pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
        result = subprocess.run(
            [*pip, "--python-version", python, "-d", str(directory), *requirements],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"pip download failed: {result.stderr[-3000:]}"
        marker.touch()
    return sorted(directory.glob("*.whl"))


@pytest.fixture(scope="module")
def index(hosts: Hosts) -> Iterator[PackageIndex]:
    """uv and the workers' packages for 3.11 and 3.13 workers, and nothing else."""
    served = PackageIndex(hosts.root / "index", hosts.bridge_address)
    try:
        pins = [f"{n}=={metadata.version(n)}" for n in ("cloudpickle", "pydantic")]
        served.download([*pins, f"uv=={metadata.version('uv')}"], _CACHE / "wheels")
        served.add(_download(pins, _CACHE / "wheels-cp313", "3.13"))
        yield served
    finally:
        served.close()


@pytest.fixture(scope="module")
def mirror(hosts: Hosts) -> Iterator[PythonMirror]:
    builds = [build_install_only("3.11"), build_install_only("3.13")]
    with PythonMirror(hosts.root / "mirror", builds, bind=hosts.bridge_address) as served:
        yield served


def _image(index: PackageIndex, mirror: PythonMirror, **options: Any) -> sky.Image:
    return sky.Image(
        index_url=index.url,
        python_mirror=mirror.url,
        python_downloads_json_url=mirror.json_url,
        **options,
    )


def _provider(hosts: Hosts, *ranks: int) -> sky.SSH:
    workdir = f"~/.cache/skyward-{uuid.uuid4().hex[:8]}"  # nothing there yet
    return ssh_provider(hosts, *(hosts.hosts[r].target for r in ranks), workdir=workdir)


class _Timed(Recorder):
    """A recorder that also notes when each node first reached each phase."""

    def __init__(self) -> None:
        super().__init__()
        self.started = time.perf_counter()
        self.at: dict[tuple[int, str], float] = {}

    def phase(self, node: int, phase: str, detail: str = "") -> None:
        self.at.setdefault((node, phase), time.perf_counter() - self.started)
        super().phase(node, phase, detail)


def _start(provider: sky.SSH, image: sky.Image, nodes: int) -> tuple[_Timed, float]:
    """Bring ``nodes`` up and down, as a pool's start does: what they reported, how long."""
    recorder = _Timed()
    spec = PoolSpec(provider=provider, nodes=nodes, image=image, quiet=True)
    made = provider.provision(spec.request(image), recorder)
    elapsed = time.perf_counter() - recorder.started
    made.terminate()
    return recorder, elapsed


def _where() -> tuple[tuple[int, int], str, str]:
    import shutil

    return sys.version_info[:2], sys.base_prefix, str(shutil.which("python3.11"))


@pytest.mark.timeout(300)
def test_a_311_client_starts_a_pool_on_hosts_whose_only_python_is_312_without_ensurepip(
    hosts: Hosts, index: PackageIndex, mirror: PythonMirror
) -> None:
    image = _image(index, mirror)
    provider = _provider(hosts, 0, 1)
    asked = len(mirror.requests)

    recorder, elapsed = _start(provider, image, nodes=2)

    for node in (0, 1):
        log = recorder.text(node)
        assert "skyward: downloading uv" in log, log
        assert "no Python 3.11 on this host" in log and "using a uv-managed CPython 3.11" in log
        assert mirror.url in log
        assert re.search(r"^skyward: image \w+ installed$", log, re.M), log
    archive = build_install_only("3.11").filename.replace("+", "%2B")
    assert sum(r.endswith(archive) for r in mirror.requests[asked:]) == 2  # once per host
    bootstrapped = max(recorder.at[(n, "bootstrapping")] for n in (0, 1))
    print(f"2 nodes from nothing: {elapsed:.2f} s (connected by {bootstrapped:.2f} s)")

    with sky.ComputePool(provider=provider, nodes=2, image=image, quiet=True) as pool:
        for version, base, system in pool.broadcast(_where):
            assert version == (3, 11)
            assert "/pythons/cpython-3.11" in base  # uv's, under the workdir
            assert system == "None"  # the host itself still has no 3.11


@pytest.mark.timeout(300)
def test_a_host_with_no_python_and_no_unzip_gets_uv_and_cpython_with_the_shell_alone(
    hosts: Hosts, index: PackageIndex, mirror: PythonMirror
) -> None:
    provider = _provider(hosts, 2)
    image = _image(index, mirror)
    recorder, _ = _start(provider, image, nodes=1)
    assert "skyward: downloading uv" in recorder.text(0)
    with sky.ComputePool(provider=provider, nodes=1, image=image, quiet=True) as pool:
        assert pool.run(_where)[0] == (3, 11)


@pytest.mark.timeout(300)
def test_an_aws_pool_starts_on_stand_ins_that_boot_like_the_default_ami(
    moto: MotoServer, hosts: Hosts, index: PackageIndex, mirror: PythonMirror
) -> None:
    """The same through the AWS provider: moto makes the instances, stand-ins whose system
    is stock Ubuntu's play them (cloud-init's parts, the watchdog, the pinned host key)."""
    with StandInCloud(moto, hosts, image=_UBUNTU) as cloud:
        with sky.ComputePool(
            provider=standin_provider(cloud),
            nodes=2,
            image=_image(index, mirror),
            name="ubuntu-standins",
            quiet=True,
        ) as pool:
            assert [v for v, _, _ in pool.broadcast(_where)] == [(3, 11), (3, 11)]
        cloud.wait_for(lambda: all(s.ended for s in cloud.standins.values()), 30, "stand-ins down")
        assert nothing(held(moto, "ubuntu-standins"))
    assert not cloud.leftovers()


def _client_313(tmp: Path) -> tuple[Path, float]:
    """A 3.13 interpreter with skyward's needs (this worktree's skyward on its path), made
    from pyenv's 3.13 and wheels cached from the package index, with the network guard."""
    python = pyenv_python("3.13") / "bin" / "python3.13"
    _download(
        [f"{n}=={metadata.version(n)}" for n in _CLIENT_PACKAGES], _CACHE / "wheels-cp313", "3.13"
    )
    started = time.perf_counter()
    venv = tmp / "client-313"
    uv = venv_uv()
    subprocess.run([uv, "venv", "-q", "-p", python, venv], check=True, timeout=120)
    install: list[str | Path] = [uv, "pip", "install", "-q", "--python", venv / "bin" / "python"]
    subprocess.run(
        [*install, "--offline", "--no-index", "--find-links", _CACHE / "wheels-cp313"]
        + [f"{n}=={metadata.version(n)}" for n in _CLIENT_PACKAGES],
        check=True,
        timeout=300,
    )
    elapsed = time.perf_counter() - started
    guard = Path("/work/shared/netguard")
    if guard.is_dir():
        (site,) = venv.glob("lib/python3.13/site-packages")
        for name in ("_skyward_netguard.py", "_skyward_netguard.pth"):
            (site / name).write_bytes((guard / name).read_bytes())
    return venv / "bin" / "python", elapsed


_CHILD = """
import json, sys
import skyward as sky

def where():
    import sys
    return list(sys.version_info[:2]), sys.base_prefix

hosts, key, known_hosts, workdir, image = json.loads(sys.argv[1])
provider = sky.SSH(hosts=hosts, key=key, known_hosts=known_hosts, workdir=workdir)
with sky.ComputePool(provider=provider, nodes=len(hosts), image=sky.Image(**image),
                     quiet=True) as pool:
    print(json.dumps(pool.broadcast(where)))
"""


@pytest.mark.timeout(420)
def test_a_313_client_starts_a_pool_on_the_same_hosts(
    hosts: Hosts, index: PackageIndex, mirror: PythonMirror, tmp_path: Path
) -> None:
    python, made_in = _client_313(tmp_path)
    print(f"a 3.13 client's venv, from cached wheels: {made_in:.2f} s")
    image = {
        "index_url": index.url,
        "python_mirror": mirror.url,
        "python_downloads_json_url": mirror.json_url,
    }
    asked = len(mirror.requests)
    settings = [
        [h.target for h in hosts.hosts[:2]],
        str(hosts.client_key),
        str(hosts.known_hosts),
        f"~/.cache/skyward-{uuid.uuid4().hex[:8]}",
        image,
    ]
    tests = TESTS
    result = subprocess.run(
        [python, "-c", _CHILD, json.dumps(settings)],
        capture_output=True,
        text=True,
        timeout=360,
        env={**os.environ, "PYTHONPATH": f"{tests.parent}:{tests}"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    assert [version for version, _ in answers] == [[3, 13], [3, 13]]
    assert all("/pythons/cpython-3.13" in base for _, base in answers)
    archive = build_install_only("3.13").filename.replace("+", "%2B")
    assert sum(r.endswith(archive) for r in mirror.requests[asked:]) == 2


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["unreachable", "no such version"])
def test_a_python_that_cannot_be_downloaded_is_a_bootstrap_error_naming_the_mirror(
    fault: str, hosts: Hosts, index: PackageIndex, tmp_path: Path
) -> None:
    if fault == "unreachable":
        url = f"http://{hosts.bridge_address}:9"  # nothing listens there
        image = sky.Image(index_url=index.url, python_mirror=url)
        expected = "Connection refused"
        mirror = None
    else:  # a mirror of 3.13 only
        mirror = PythonMirror(
            tmp_path / "only-313", [build_install_only("3.13")], bind=hosts.bridge_address
        )
        url = mirror.url
        image = sky.Image(
            index_url=index.url, python_mirror=url, python_downloads_json_url=mirror.json_url
        )
        expected = "No interpreter found for Python 3.11"
    try:
        started = time.perf_counter()
        with pytest.raises(sky.BootstrapError) as caught:
            with sky.ComputePool(provider=_provider(hosts, 0), image=image, quiet=True):
                pass
        elapsed = time.perf_counter() - started
    finally:
        if mirror is not None:
            mirror.close()
    error = caught.value
    first = str(error).splitlines()[0]
    assert error.exit_status == 2 and error.command is not None
    assert "--managed-python --python 3.11" in error.command
    assert f"uv could not install CPython 3.11 from {url}" in first, first
    assert "Image(python_mirror=...)" in first
    assert expected in error.log_tail, error.log_tail
    assert elapsed < 60, f"the failure took {elapsed:.1f} s"


@pytest.mark.timeout(180)
def test_apt_packages_wait_while_another_apt_holds_its_lock(
    hosts: Hosts, index: PackageIndex, mirror: PythonMirror
) -> None:
    """h3's apt-get says, once, that another process holds the lock (as during a first
    boot's unattended-upgrades): the bootstrap tries again and goes on."""
    calls = hosts.hosts[3].home / "apt-calls.log"
    calls.unlink(missing_ok=True)
    provider = _provider(hosts, 3)
    recorder, _ = _start(provider, _image(index, mirror, apt=["libskyward-test1"]), nodes=1)
    log = recorder.text(0)
    assert log.count("holds its lock; trying again in 5 s") == 1, log
    assert calls.read_text().splitlines() == [
        "-o DPkg::Lock::Timeout=300 update -q",
        "-o DPkg::Lock::Timeout=300 update -q",
        "-o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends libskyward-test1",
    ]


# ── the script alone ─────────────────────────────────────────────────────────────────────


def test_the_script_takes_a_managed_python_of_exactly_the_clients_version() -> None:
    image = sky.Image(
        python_mirror="https://mirror.example/pbs/", python_downloads_json_url="file:///srv/l.json"
    )
    plan = Plan(
        image=image,
        python_version="3.13",
        python=None,
        workdir="~/.cache/skyward",
        runtime=("cloudpickle==3.1.2",),
    )
    script = render(plan)
    assert "for candidate in python3.13 python3; do" in script
    assert "--managed-python --python 3.13" in script
    assert "UV_PYTHON_INSTALL_MIRROR=https://mirror.example/pbs " in script
    assert "UV_PYTHON_DOWNLOADS_JSON_URL=file:///srv/l.json" in script
    assert 'UV_PYTHON_INSTALL_DIR="$home/pythons"' in script
    assert "ensurepip" not in script and "-m venv" not in script and "/bin/pip " not in script
    # Where the build comes from is not what it is: the environment is the same one.
    assert plan.digest == Plan(**{**plan.__dict__, "image": sky.Image()}).digest


@pytest.mark.parametrize("url", ["mirror.example/pbs", "/srv/pythons", "ftp://x/y", "http://a b"])
def test_a_python_mirror_must_be_a_url(url: str) -> None:
    with pytest.raises(ValueError, match="is not an http://, https:// or file:// URL"):
        sky.Image(python_mirror=url)
    with pytest.raises(ValueError, match="is not an http://, https:// or file:// URL"):
        sky.Image(python_downloads_json_url=url)


@pytest.mark.timeout(300)
def test_the_environment_cache_carries_the_uv_managed_cpython_to_a_host_without_it(
    hosts: Hosts, index: PackageIndex, mirror: PythonMirror
) -> None:
    """Built on h0 (python3 = 3.12 only) with a managed 3.11, uploaded with that CPython;
    h1, in another workdir, unpacks both and points them at its own directory: neither the
    mirror nor the index is asked."""
    from support.objectstores import S3Server

    s3 = S3Server(hosts.bridge_address)
    try:
        for host in hosts.hosts[:2]:
            _write_environment(host.home, s3.env)
        image = _image(index, mirror, cache=s3.cache_url("managed"), cache_endpoint=s3.url)
        built, _ = _start(_provider(hosts, 0), image, nodes=1)
        assert "skyward: cache: uploaded" in built.text(0), built.text(0)
        asked = len(mirror.requests)

        provider = _provider(hosts, 1)
        fetched, _ = _start(provider, image, nodes=1)

        log = fetched.text(0)
        assert "installed from the cache" in log and "downloading uv" not in log, log
        assert len(mirror.requests) == asked
        with sky.ComputePool(provider=provider, nodes=1, image=image, quiet=True) as pool:
            version, base, system = pool.run(_where)
        assert version == (3, 11) and system == "None"
        workdir = provider.workdir.removeprefix("~/")
        assert f"{workdir}/pythons/cpython-3.11" in base, base  # its own, relocated
    finally:
        for host in hosts.hosts[:2]:
            _write_environment(host.home, {})
        s3.close()


def _write_environment(home: Path, variables: dict[str, str]) -> None:
    import shutil

    ssh = home / ".ssh"
    ssh.mkdir(exist_ok=True)
    (ssh / "environment").write_text("".join(f"{k}={v}\n" for k, v in variables.items()))
    shutil.chown(ssh, USER, USER)
    shutil.chown(ssh / "environment", USER, USER)
