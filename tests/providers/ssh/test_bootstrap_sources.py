"""Packages that come from git and from wheel files on the client, through the bootstrap.

MPMD libraries such as JaxPP are installed from a git revision or a wheel, not from an index.
Here a git repository made by the test is served over HTTP from the test bridge, and a
wheel built by the test sits on the client; an SSH host installs both with uv, while an
index scoped to one package still serves it, also as a dependency of the git one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.pools import ssh_provider
from support.reporter import Recorder
from support.sshhosts import Hosts, PackageIndex, build_wheel

import skyward as sky
from skyward.pool.spec import PoolSpec
from skyward.providers.ssh.bootstrap import Plan, render

SNAPSHOTS = Path(__file__).parent / "snapshots"
_WHEEL_CACHE = Path.home() / ".cache" / "skyward-tests" / "wheels"


def _provision(provider: sky.SSH, image: sky.Image) -> str:
    """Bring a node up and down again, as a pool's start does; what its bootstrap printed."""
    recorder = Recorder()
    spec = PoolSpec(provider=provider, image=image, quiet=True)
    provider.provision(spec.request(image), recorder).terminate()
    return recorder.text(0)


def _git(*args: str, cwd: Path) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip()


@pytest.fixture(scope="module")
def git_repository(ssh_hosts: Hosts, tmp_path_factory: Any) -> Iterator[tuple[str, str]]:
    """``skygit`` 0.1, a flit project that needs ``skyscope``, in a bare repository served
    over git's plain HTTP protocol from the bridge; its URL and the commit."""
    assert shutil.which("git"), "these tests need git on this machine (apt-get install git)"
    source = tmp_path_factory.mktemp("skygit")
    (source / "skygit.py").write_text(
        '"""A package from git."""\n\n__version__ = "0.1"\n\n\ndef where():\n'
        "    import skyscope\n\n    return 'git', skyscope.VERSION\n"
    )
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["flit_core>=3.2"]\nbuild-backend = "flit_core.buildapi"\n'
        '[project]\nname = "skygit"\nversion = "0.1"\ndescription = "from git"\n'
        'dependencies = ["skyscope"]\n'
    )
    _git("init", "-q", "-b", "main", cwd=source)
    _git("add", ".", cwd=source)
    _git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "0.1", cwd=source)
    revision = _git("rev-parse", "HEAD", cwd=source)
    served = tmp_path_factory.mktemp("git")
    served.chmod(0o755)
    _git("clone", "-q", "--bare", str(source), str(served / "skygit.git"), cwd=served)
    _git("update-server-info", cwd=served / "skygit.git")  # what plain HTTP clients read
    # PackageIndex is http.server over a directory: here, the repository's files.
    server = PackageIndex(served, ssh_hosts.bridge_address, port=8711)
    try:
        yield f"http://{ssh_hosts.bridge_address}:8711/skygit.git", revision
    finally:
        server.close()


@pytest.fixture(scope="module")
def scoped_indexes(
    ssh_hosts: Hosts, package_index: PackageIndex, tmp_path_factory: Any
) -> Iterator[tuple[str, str]]:
    """flit_core (to build skygit) and ``skyscope`` 1.0 and 3.0 on the main index; 2.0 alone
    on a second one, to which an image scopes skyscope."""
    package_index.download(["flit_core"], _WHEEL_CACHE)
    wheels = tmp_path_factory.mktemp("scope-wheels")
    package_index.add(
        build_wheel(wheels, "skyscope", version, f"VERSION = {version!r}\n")
        for version in ("1.0", "3.0")
    )
    extra = PackageIndex(tmp_path_factory.mktemp("scope"), ssh_hosts.bridge_address, port=8712)
    try:
        extra.add(
            [build_wheel(tmp_path_factory.mktemp("x"), "skyscope", "2.0", "VERSION = '2.0'\n")]
        )
        yield package_index.url, extra.url
    finally:
        extra.close()


def _large_wheel(directory: Path) -> Path:
    """``skywheel`` 1.0 with 3 MiB that do not compress: more than an SSH channel's window."""
    wheel = build_wheel(directory, "skywheel", "1.0", "WHERE = 'wheel'\n")
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("skywheel_data.bin", os.urandom(3 << 20))
    return wheel


def _where() -> tuple[tuple[str, str], str]:
    import skygit  # type: ignore[import-not-found]
    import skywheel  # type: ignore[import-not-found]

    return skygit.where(), skywheel.WHERE


@pytest.mark.timeout(300)
def test_a_git_revision_and_a_local_wheel_install_on_a_host_with_index_scoping_intact(
    ssh_hosts: Hosts,
    package_index: PackageIndex,
    git_repository: tuple[str, str],
    scoped_indexes: tuple[str, str],
    tmp_path: Path,
) -> None:
    url, revision = git_repository
    main, extra = scoped_indexes
    wheel = _large_wheel(tmp_path)
    image = sky.Image(
        pip=[f"skygit @ git+{url}@{revision}", str(wheel)],
        pip_indexes=[sky.PipIndex(url=extra, packages=["skyscope"])],
        index_url=main,
    )
    assert image.pip[1] == f"skywheel @ {wheel.as_uri()}"
    provider = ssh_provider(ssh_hosts, workdir=f"~/.cache/skyward-{uuid.uuid4().hex[:8]}")

    first = _provision(provider, image)
    again = _provision(provider, image)  # the script, wheel included, is sent again

    assert re.search(r"write skywheel-1.0-py3-none-any.whl \(307\d KiB\)", first), first
    assert "uv pip install" in first
    assert re.search(r"^skyward: image \w+ installed$", first, re.M), first
    assert "is already installed" in again and "write skywheel" not in again
    with sky.ComputePool(provider=provider, image=image, quiet=True) as pool:
        # skyscope, which only skygit asks for, comes from the index scoped to it
        assert pool.run(_where) == (("git", "2.0"), "wheel")


def test_a_wheel_path_is_a_requirement_on_the_file_and_unusable_sources_are_refused(
    tmp_path: Path,
) -> None:
    wheel = build_wheel(tmp_path, "skywheel", "1.0", "WHERE = 'wheel'\n")
    relative = os.path.relpath(wheel)
    assert sky.Image(pip=[relative]).pip == (f"skywheel @ {wheel.as_uri()}",)
    assert sky.Image(pip=[wheel.as_uri()]).pip == (f"skywheel @ {wheel.as_uri()}",)
    refused = {
        "x @ git+git://example.com/x.git": "cannot fetch git:// URLs",
        str(tmp_path / "gone-1.0-py3-none-any.whl"): "no wheel file at",
        f"gone @ {(tmp_path / 'gone-1.0-py3-none-any.whl').as_uri()}": "no wheel file at",
        str(tmp_path / "notawheel.whl"): "is not a wheel file name",
    }
    for requirement, message in refused.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            sky.Image(pip=[requirement])


def _fixed_wheel(directory: Path) -> Path:
    """A wheel whose bytes never change (fixed timestamps), for the snapshot."""
    wheel = directory / "jaxpp-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in (
            ("jaxpp.py", "VERSION = '0.1'\n"),
            ("jaxpp-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: jaxpp\nVersion: 0.1\n"),
        ):
            archive.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), text)
    return wheel


def test_the_bootstrap_with_git_and_wheel_sources_matches_its_snapshot(tmp_path: Path) -> None:
    """The jax plugin's scoping (CUDA wheels from JAX's release page) next to a git
    revision and a client wheel. Set SKYWARD_UPDATE_SNAPSHOTS=1 to accept a change."""
    pool = sky.ComputePool(
        provider=sky.SSH(hosts=["h1"]),  # never started: the transforms run when it is built
        accelerator="H100",
        image=sky.Image(
            pip=[
                "mpmd @ git+https://github.example/mpmd/mpmd.git@0123abc",
                str(_fixed_wheel(tmp_path)),
            ]
        ),
        plugins=[sky.plugins.jax(index_url="https://storage.example/jax_cuda_releases.html")],
    )
    plan = Plan(
        image=pool.image,
        python_version="3.11",
        python=None,
        workdir="~/.cache/skyward",
        runtime=("cloudpickle==3.1.1", "pydantic==2.11.7"),
    )
    script = render(plan)
    path = SNAPSHOTS / "bootstrap-sources.sh"
    if os.environ.get("SKYWARD_UPDATE_SNAPSHOTS"):
        path.write_text(script)
    assert script == path.read_text()
    assert str(tmp_path) not in script  # the client's paths stay on the client
    # Valid POSIX shell, heredocs included.
    subprocess.run(["sh", "-n"], input=script, text=True, check=True, timeout=10)
