"""uv installs a managed CPython of an exact minor version from a private mirror, offline.

The bootstrap will rely on this when a host lacks the client's minor version: the builds
here are made from this machine's pyenv interpreters and served by ``support.pythons``;
uv runs in an environment that sees nothing but the mirror (and, for packages, a local
index). The failure tests pin what uv prints when the mirror or the network is missing,
which the bootstrap turns into its own error.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from support.pythons import (
    BUILD,
    PythonBuild,
    PythonMirror,
    build_install_only,
    standalone_uv,
    uv_env,
    venv_uv,
)
from support.sshhosts import PackageIndex, build_wheel

# The client's minor version: what the bootstrap asks uv for. This machine also has a system
# Python of that minor, which --managed-python keeps uv from choosing.
MINOR = f"{sys.version_info.major}.{sys.version_info.minor}"

UVS: dict[str, Callable[[], Path]] = {"venv": venv_uv, "wheel": standalone_uv}


@pytest.fixture(scope="module")
def build() -> PythonBuild:
    return build_install_only(MINOR)


@pytest.fixture(scope="module")
def mirror(build: PythonBuild, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PythonMirror]:
    with PythonMirror(tmp_path_factory.mktemp("python-mirror"), [build]) as served:
        yield served


def _run(
    *args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _managed_venv(uv: Path, mirror: PythonMirror, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A venv on a managed Python from the mirror; PATH holds nothing, so no Python either."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    env = uv_env(tmp_path / "home", PATH=str(empty), **mirror.env)
    venv = tmp_path / "venv"
    # cwd: uv venv looks for a project upwards from where it runs; give it none.
    made = _run(uv, "venv", "--managed-python", "--python", MINOR, venv, env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    return venv, env


def test_archive_is_named_and_laid_out_as_python_build_standalone_does(build: PythonBuild) -> None:
    assert build.version.startswith(f"{MINOR}.")
    assert build.archive.name == (
        f"cpython-{build.version}+{BUILD}-x86_64-unknown-linux-gnu-install_only.tar.gz"
    )
    with tarfile.open(build.archive) as archive:
        names = set(archive.getnames())
    assert {n.split("/")[0] for n in names} == {"python"}
    assert {
        f"python/bin/python{MINOR}",
        f"python/lib/libpython{MINOR}.so.1.0",
        f"python/lib/python{MINOR}/os.py",
        f"python/include/python{MINOR}/Python.h",
    } <= names


def test_unpacked_archive_runs_from_another_path_and_makes_a_venv(
    build: PythonBuild, tmp_path: Path
) -> None:
    place = tmp_path / "somewhere" / "else"
    with tarfile.open(build.archive) as archive:
        archive.extractall(place, filter="tar")
    python = place / "python" / "bin" / "python3"
    env = {"PATH": "/usr/bin:/bin"}
    probe = "import sys, ssl, sqlite3; print(sys.prefix); print(ssl.OPENSSL_VERSION)"
    ran = _run(python, "-I", "-c", probe, env=env)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[0] == str(place / "python")

    made = _run(python, "-m", "venv", "--without-pip", tmp_path / "venv", env=env)
    assert made.returncode == 0, made.stderr
    inside = _run(
        tmp_path / "venv" / "bin" / "python", "-c", "import sys; print(sys.base_prefix)", env=env
    )
    assert inside.stdout.strip() == str(place / "python")


@pytest.mark.parametrize("which", sorted(UVS))
def test_uv_venv_installs_the_clients_minor_from_the_mirror(
    which: str, build: PythonBuild, mirror: PythonMirror, tmp_path: Path
) -> None:
    uv = UVS[which]()
    assert uv.read_bytes()[:4] == b"\x7fELF"  # a native binary: it needs no Python to run
    asked_before = len(mirror.requests)
    started = time.monotonic()
    venv, _ = _managed_venv(uv, mirror, tmp_path)
    elapsed = time.monotonic() - started

    assert mirror.requests[asked_before:] == [
        "/download-metadata.json",
        f"/{BUILD}/{quote(build.filename)}",
    ]
    probe = (
        "import sys, ssl, sqlite3; print('%d.%d' % sys.version_info[:2]); print(sys.base_prefix)"
    )
    ran = _run(venv / "bin" / "python", "-c", probe, env={"PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    version, base = ran.stdout.split()
    assert version == MINOR
    assert Path(base).parent == tmp_path / "home" / "pythons"  # uv's managed installs
    assert elapsed < 20, f"installing from the mirror took {elapsed:.1f} s"


def test_uv_pip_installs_into_the_managed_venv_from_a_local_index_only(
    mirror: PythonMirror, tmp_path: Path
) -> None:
    venv, env = _managed_venv(venv_uv(), mirror, tmp_path)
    # Only this index has the package; every other host is unreachable (see uv_env).
    wheel = build_wheel(tmp_path, "skyward_mirror_probe", "1.0", "ANSWER = 42\n")
    index = PackageIndex(tmp_path / "index", "127.0.0.1", port=_unused_port())
    try:
        index.add([wheel])
        env = {**env, "UV_DEFAULT_INDEX": index.url}
        installed = _run(
            venv_uv(),
            "pip",
            "install",
            "--python",
            venv / "bin" / "python",
            "skyward_mirror_probe",
            env=env,
            cwd=tmp_path,
        )
        assert installed.returncode == 0, installed.stderr
    finally:
        index.close()
    ran = _run(venv / "bin" / "python", "-c", "import skyward_mirror_probe as p; print(p.ANSWER)")
    assert ran.stdout.strip() == "42", ran.stderr


def test_uv_fails_at_once_naming_the_list_url_when_the_mirror_is_down(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_unused_port()}"
    env = uv_env(
        tmp_path / "home",
        UV_PYTHON_INSTALL_MIRROR=url,
        UV_PYTHON_DOWNLOADS_JSON_URL=f"{url}/download-metadata.json",
        UV_HTTP_RETRIES="0",  # by default uv retries 3 times, ~8 s against a closed port
    )
    started = time.monotonic()
    failed = _run(
        venv_uv(), "venv", "--managed-python", "-p", MINOR, tmp_path / "v", env=env, cwd=tmp_path
    )
    assert failed.returncode == 2
    assert "Error while fetching remote python downloads json" in failed.stderr
    assert f"{url}/download-metadata.json" in failed.stderr
    assert "Connection refused" in failed.stderr
    assert time.monotonic() - started < 5


def test_uv_names_the_version_the_mirror_does_not_list(
    mirror: PythonMirror, tmp_path: Path
) -> None:
    absent = "3.10" if MINOR != "3.10" else "3.9"
    env = uv_env(tmp_path / "home", **mirror.env)
    failed = _run(
        venv_uv(), "venv", "--managed-python", "-p", absent, tmp_path / "v", env=env, cwd=tmp_path
    )
    assert failed.returncode == 2
    assert f"No interpreter found for Python {absent} in managed installations" in failed.stderr


def test_uv_without_a_mirror_or_network_fails_at_once_naming_the_official_download(
    tmp_path: Path,
) -> None:
    # A network namespace of our own with nothing in it (no route, no name server) stands in
    # for a host without internet, so the proxy guard of uv_env is not needed, nor wanted.
    env = {
        k: v
        for k, v in uv_env(tmp_path / "home", UV_HTTP_RETRIES="0").items()
        if "proxy" not in k.lower()
    }
    started = time.monotonic()
    failed = _run(
        "unshare",
        "--net",
        "--",
        venv_uv(),
        "venv",
        "--managed-python",
        "-p",
        MINOR,
        tmp_path / "v",
        env=env,
        cwd=tmp_path,
    )
    assert failed.returncode == 2
    assert "Failed to download `https://github.com/astral-sh/python-build-standalone/" in (
        failed.stderr
    )
    assert time.monotonic() - started < 5
