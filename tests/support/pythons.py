"""Managed Pythons for uv without the internet: builds made from this machine's pyenv
interpreters, and a mirror that serves them as uv expects.

::

    /root/.pyenv/versions/3.12.1 ── build_install_only("3.12") ──▶ ~/.cache/skyward-tests/pythons/
        copy, trim, strip, RUNPATH -> $ORIGIN,          cpython-3.12.1+20250101-x86_64-unknown-
        prefix -> /install in sysconfig data            linux-gnu-install_only.tar.gz (python/...)
                                                                │
    PythonMirror(root, builds, bind) ── http://bind:port/ ──────┤  /20250101/<that file>
                                                                └  /download-metadata.json
    uv venv --python 3.12 --managed-python
        UV_PYTHON_INSTALL_MIRROR=mirror.url   UV_PYTHON_DOWNLOADS_JSON_URL=mirror.json_url

uv knows which builds exist from a list bundled in its binary (each with a sha256 of the
official archive), so a mirror of builds made here must also serve its own list: the JSON
names the build at its official python-build-standalone address, and uv swaps that prefix for
the install mirror, as it does for a mirror of the official builds.

pyenv's builds are ``--enable-shared`` with an absolute RUNPATH and absolute paths in their
sysconfig data; the archive gets ``$ORIGIN``-relative RUNPATHs and the ``/install`` prefix
python-build-standalone uses, which uv rewrites to the real location when it installs. The
C extensions still link the system's OpenSSL, sqlite and so on, so an archive runs on hosts
like this one (the test namespaces), not on any Linux.

Archives are cached by version (and recipe) across runs; the uv wheel and its binary too.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

CACHE = Path.home() / ".cache" / "skyward-tests"
PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"

# The release tag our builds carry where python-build-standalone puts its release date. Any
# date works; a fixed one keeps file names predictable for the tests that use them.
BUILD = "20250101"
TRIPLE = "x86_64-unknown-linux-gnu"
# What the download list names the builds' home; uv replaces it with the install mirror.
OFFICIAL_PREFIX = "https://github.com/astral-sh/python-build-standalone/releases/download"
# Bump when the archive recipe changes, so cached archives built the old way are not used.
_RECIPE = 1


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (test runs beside ours may build the same thing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# ── uv itself ─────────────────────────────────────────────────────────────────────────────


def venv_uv() -> Path:
    """The uv of the Python running the tests (the ``uv`` package's binary); fails if absent."""
    from uv import find_uv_bin

    return Path(find_uv_bin())


def uv_version() -> str:
    return metadata.version("uv")


def uv_wheel(cache: Path = CACHE / "uv") -> Path:
    """The ``uv`` wheel for this platform, at the tests' uv version, from the package index."""
    version = uv_version()
    directory = cache / version
    with _locked(cache / ".lock"):
        found = sorted(directory.glob(f"uv-{version}-*.whl"))
        if not found:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--only-binary=:all:",
                    "-d",
                    str(directory),
                    f"uv=={version}",
                ],
                check=True,
                timeout=300,
            )
            found = sorted(directory.glob(f"uv-{version}-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download uv=={version} left no wheel in {directory}")
    return found[0]


def standalone_uv(cache: Path = CACHE / "uv") -> Path:
    """uv's binary as unpacked from its wheel (``uv-X.Y.Z.data/scripts/uv``): no Python needed."""
    wheel = uv_wheel(cache)
    binary = wheel.parent / "bin" / "uv"
    with _locked(cache / ".lock"):
        if not binary.exists():
            binary.parent.mkdir(exist_ok=True)
            with zipfile.ZipFile(wheel) as archive:
                member = next(n for n in archive.namelist() if n.endswith(".data/scripts/uv"))
                partial_binary = binary.with_suffix(".part")
                partial_binary.write_bytes(archive.read(member))
            partial_binary.chmod(0o755)
            partial_binary.replace(binary)
    return binary


# ── relocatable builds from pyenv ────────────────────────────────────────────────────────


def pyenv_python(minor: str) -> Path:
    """The prefix of pyenv's newest ``minor`` (``"3.12"``) interpreter; fails if there is none."""
    pattern = re.compile(rf"{re.escape(minor)}\.(\d+)")
    found = [
        (int(m.group(1)), p)
        for p in PYENV_VERSIONS.glob(f"{minor}.*")
        if (m := pattern.fullmatch(p.name)) and (p / "bin" / f"python{minor}").exists()
    ]
    if not found:
        raise FileNotFoundError(f"no pyenv CPython {minor}.* under {PYENV_VERSIONS}")
    return max(found)[1]


@dataclass(frozen=True)
class PythonBuild:
    """An install_only archive of one CPython version, as python-build-standalone names it."""

    version: str  # "3.12.1"
    archive: Path
    sha256: str

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def filename(self) -> str:
        return archive_name(self.version)

    @property
    def key(self) -> str:
        """How uv names this build, and the installation it makes."""
        return f"cpython-{self.version}-linux-x86_64-gnu"

    def metadata(self) -> dict[str, Any]:
        """This build's entry in a download list (the shape of uv's download-metadata.json)."""
        major, minor, patch = (int(part) for part in self.version.split("."))
        return {
            "name": "cpython",
            "arch": {"family": "x86_64", "variant": None},
            "os": "linux",
            "libc": "gnu",
            "major": major,
            "minor": minor,
            "patch": patch,
            "prerelease": "",
            "url": f"{OFFICIAL_PREFIX}/{BUILD}/{self.filename.replace('+', '%2B')}",
            "sha256": self.sha256,
            "variant": None,
            "build": BUILD,
        }


def archive_name(version: str) -> str:
    return f"cpython-{version}+{BUILD}-{TRIPLE}-install_only.tar.gz"


def build_install_only(minor: str, cache: Path = CACHE / "pythons") -> PythonBuild:
    """An install_only archive of pyenv's ``minor`` CPython, built once and then cached.

    The first build takes several seconds (copy, strip, compress); later calls read the
    cache. Concurrent callers wait for each other.
    """
    prefix = pyenv_python(minor)
    version = prefix.name
    directory = cache / f"{version}-r{_RECIPE}"
    archive = directory / archive_name(version)
    with _locked(cache / f".{version}.lock"):
        if not archive.exists():
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=directory) as scratch:
                tree = Path(scratch) / "python"
                _relocatable_copy(prefix, tree, minor)
                _check_runs_elsewhere(tree, minor)
                partial_archive = Path(scratch) / archive.name
                with tarfile.open(partial_archive, "w:gz", compresslevel=6) as tar:
                    tar.add(tree, arcname="python")
                partial_archive.replace(archive)
    return PythonBuild(version, archive, _sha256(archive))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _relocatable_copy(prefix: Path, tree: Path, minor: str) -> None:
    stdlib = f"lib/python{minor}"

    def skip(directory: str, names: list[str]) -> set[str]:
        relative = Path(directory).relative_to(prefix).as_posix()
        skipped = {n for n in names if n.endswith((".opt-1.pyc", ".opt-2.pyc"))}
        if relative == stdlib:
            # The test suite, IDLE and demos are a third of the size and no worker needs them.
            skipped |= {"test", "idlelib", "turtledemo"} & set(names)
        elif relative == f"{stdlib}/site-packages":
            # pip and whatever this machine installed (a venv does not see them anyway).
            skipped |= {n for n in names if n != "README.txt"}
        elif relative.startswith(f"{stdlib}/config-"):
            skipped |= {n for n in names if n.endswith(".a")}  # the static libpython
        elif relative == "bin":
            # Only the interpreter and python-config (which finds its prefix itself); the
            # other scripts' shebangs name pyenv's absolute path.
            skipped |= {n for n in names if not n.startswith("python") or n.endswith("-gdb.py")}
        return skipped

    shutil.copytree(prefix, tree, symlinks=True, ignore=skip)
    strip = shutil.which("strip")
    for path in _elf_files(tree):
        if strip:
            # Debug info is most of the size (3.12's libpython: 30 MB, 7.8 MB without).
            subprocess.run([strip, "--strip-debug", str(path)], check=True, timeout=60)
        origin = os.path.relpath(tree / "lib", path.parent)
        _rewrite_runpath(
            path, str(prefix / "lib"), "$ORIGIN" if origin == "." else f"$ORIGIN/{origin}"
        )
    # uv rewrites the /install prefix (python-build-standalone's) to where it installs.
    for data in [*tree.glob(f"{stdlib}/_sysconfigdata_*.py"), *tree.glob("lib/pkgconfig/*.pc")]:
        data.write_text(data.read_text().replace(str(prefix), "/install"))


def _elf_files(tree: Path) -> Iterator[Path]:
    for path in tree.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    yield path


_DT_NULL, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 5, 15, 29
_PT_LOAD, _PT_DYNAMIC = 1, 2


def _rewrite_runpath(path: Path, old: str, new: str) -> None:
    """Replace ``old`` in an ELF file's RUNPATH (or RPATH) by ``new``, in place.

    The string lives in ``.dynstr``; a shorter one fits where the old one was (NUL-padded),
    so no section moves. Only 64-bit little-endian files (this machine's) are handled.
    """
    data = bytearray(path.read_bytes())
    if data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    segments = [struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize) for i in range(phnum)]
    dynamic = [s for s in segments if s[0] == _PT_DYNAMIC]
    if not dynamic:
        return  # statically linked: nothing to find at run time
    entries: dict[int, int] = {}
    offset = dynamic[0][2]
    while (tag_value := struct.unpack_from("<qQ", data, offset))[0] != _DT_NULL:
        entries.setdefault(tag_value[0], tag_value[1])
        offset += 16
    strtab = entries[_DT_STRTAB]
    load = next(s for s in segments if s[0] == _PT_LOAD and s[3] <= strtab < s[3] + s[5])
    strtab_offset = strtab - load[3] + load[2]
    for tag in (_DT_RUNPATH, _DT_RPATH):
        if tag not in entries:
            continue
        start = strtab_offset + entries[tag]
        end = data.index(b"\0", start)
        paths = data[start:end].decode().split(":")
        if old not in paths:
            continue
        updated = ":".join(new if p == old else p for p in paths).encode()
        if len(updated) > end - start:
            raise ValueError(f"{path}: {updated!r} is longer than the RUNPATH it replaces")
        data[start:end] = updated.ljust(end - start, b"\0")
        path.write_bytes(data)


def _check_runs_elsewhere(tree: Path, minor: str) -> None:
    """Run the copy from its new place, with pyenv's copy out of reach of its loader paths."""
    moved = tree.parent / "moved" / "python"
    moved.parent.mkdir()
    tree.rename(moved)
    try:
        probe = (
            "import sys, ssl, sqlite3, ctypes, zlib, venv; "
            "assert sys.prefix == sys.argv[1], (sys.prefix, sys.argv[1]); "
            "print(sys.version)"
        )
        subprocess.run(
            [str(moved / "bin" / f"python{minor}"), "-I", "-c", probe, str(moved)],
            check=True,
            capture_output=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""},
        )
    finally:
        moved.rename(tree)
        moved.parent.rmdir()


# ── the mirror ────────────────────────────────────────────────────────────────────────────


class PythonMirror:
    """Serves builds over http as a python-build-standalone mirror, with a download list.

    ``url`` is what ``UV_PYTHON_INSTALL_MIRROR`` takes (``<url>/<BUILD>/<file>`` is a build),
    ``json_url`` what ``UV_PYTHON_DOWNLOADS_JSON_URL`` takes; ``env`` gives both.
    ``requests`` lists the paths asked for, in order, so a test can show where uv
    downloaded from. Serves from a thread of the test process until ``close()``.
    """

    def __init__(
        self, root: Path, builds: Iterable[PythonBuild], bind: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.root = root
        self.builds = tuple(builds)
        self.requests: list[str] = []  # appended by handler threads; list.append is atomic
        (root / BUILD).mkdir(parents=True, exist_ok=True)
        listing = {}
        for build in self.builds:
            # A copy, not a link: a test may damage what the mirror serves, never the cache.
            shutil.copyfile(build.archive, root / BUILD / build.filename)
            listing[build.key] = build.metadata()
        (root / "download-metadata.json").write_text(json.dumps(listing, indent=1))

        requests = self.requests

        class Handler(SimpleHTTPRequestHandler):
            # Called once per answered request (errors too); log_message is called twice
            # for an error, once to log it and once for the response line.
            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                requests.append(self.path)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((bind, port), partial(Handler, directory=str(root)))
        self._server.daemon_threads = True
        self.url = f"http://{bind}:{self._server.server_port}"
        self.json_url = f"{self.url}/download-metadata.json"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="python-mirror", daemon=True
        )
        self._thread.start()

    @property
    def env(self) -> dict[str, str]:
        return {"UV_PYTHON_INSTALL_MIRROR": self.url, "UV_PYTHON_DOWNLOADS_JSON_URL": self.json_url}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> PythonMirror:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ── a clean environment for uv ────────────────────────────────────────────────────────────

# Where a stray request would go instead of leaving the machine: a closed loopback port.
_NOWHERE = "http://127.0.0.1:9"


def uv_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment in which uv sees only ``home`` and what ``extra`` names.

    No user or system uv configuration, caches and managed Pythons under ``home``, no pyenv
    on PATH. Every request to a host other than loopback or the test bridges goes to a
    closed loopback port (uv honours the proxy variables), so a missing setting fails at
    once rather than reaching the internet.
    """
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "UV_NO_CONFIG": "1",
        "UV_CACHE_DIR": str(home / "uv-cache"),
        "UV_PYTHON_INSTALL_DIR": str(home / "pythons"),
        "UV_PYTHON_BIN_DIR": str(home / "bin"),
        "UV_PYTHON_CACHE_DIR": str(home / "python-downloads"),
        "UV_NO_PROGRESS": "1",
    }
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        env[name] = env[name.upper()] = _NOWHERE
    env["no_proxy"] = env["NO_PROXY"] = "localhost,127.0.0.0/8,::1,10.123.0.0/16"
    env.update(extra)
    return env
