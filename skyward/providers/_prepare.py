"""Make a reached host able to run workers: run the image's bootstrap script, put this very
skyward package there, count its GPUs. Each step is cached on the host by hash, so a second
pool with the same image and the same skyward costs two quick commands.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import shlex
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skyward._bootstrap import MARKER, Plan, render, shell_path
from skyward._errors import BootstrapError
from skyward._image import Image
from skyward._ssh import Connection

_LOG_TAIL_LINES = 30
_TIMED_OUT = 124  # coreutils' timeout: the command ran past its bound


def runtime_requirements() -> tuple[str, ...]:
    """What the worker imports besides the standard library, at the client's versions.

    Pinned because values pickled on one side are unpickled on the other.
    """
    from importlib import metadata

    return tuple(f"{name}=={metadata.version(name)}" for name in ("cloudpickle", "pydantic"))


def bootstrap(connection: Connection, plan: Plan, on_line: Any) -> None:
    """Run the image's script on the host, streaming its output; ``BootstrapError`` if it
    fails or outlasts the image's ``bootstrap_timeout``."""
    tail: list[str] = []
    command: list[str] = []

    def line(text: str) -> None:
        if text.startswith(MARKER):
            command[:] = [text[len(MARKER) :]]
        tail.append(text)
        del tail[:-_LOG_TAIL_LINES]
        on_line(text)

    # On stdin: no limit on the script's length, and no quoting through the login shell.
    bound = plan.image.bootstrap_timeout
    shell = "sh -s"
    if bound is not None:
        # coreutils' timeout ends the script's whole process group, then kills it 5 s later;
        # a host without it (not a Linux distribution) runs the script unbounded.
        shell = (
            f"if command -v timeout >/dev/null 2>&1; then exec timeout -k 5 {bound:g} sh -s; "
            f"else exec sh -s; fi"
        )
    started = time.monotonic()
    status, _ = connection.run(shell, stdin=render(plan).encode(), on_line=line)
    if bound is not None and status == _TIMED_OUT and time.monotonic() - started >= bound:
        running = command[0] if command else "the bootstrap script"
        raise BootstrapError(
            f"{connection.target}: the bootstrap did not finish within the image's "
            f"bootstrap_timeout ({bound:g} s); `{running}` was running\n"
            f"--- last lines of its output ---\n" + "\n".join(tail),
            command=running,
            exit_status=None,
            log_tail="\n".join(tail),
        )
    if status != 0:
        failed = command[0] if command else "the bootstrap script"
        log = "\n".join(tail)
        if status < 0 or not connection.alive:
            raise BootstrapError(
                f"{connection.target}: the SSH connection dropped during the bootstrap, "
                f"while `{failed}` ran\n--- last lines of its output ---\n{log}",
                command=failed,
                exit_status=None,
                log_tail=log,
            )
        raise BootstrapError(
            f"{connection.target}: bootstrap failed: `{failed}` exited with {status}\n"
            f"--- last lines of its output ---\n{log}",
            command=failed,
            exit_status=status,
            log_tail=log,
        )


_package: tuple[str, bytes] | None = None
_package_lock = threading.Lock()  # guards: _package


def package_archive() -> tuple[str, bytes]:
    """This skyward package as a zip (its hash, its bytes); made once per process."""
    global _package
    with _package_lock:
        if _package is None:
            root = Path(__file__).resolve().parents[1]
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sorted(root.rglob("*")):
                    if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                        name = f"skyward/{path.relative_to(root).as_posix()}"
                        # A fixed timestamp: the same sources give the same hash.
                        archive.writestr(
                            zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), path.read_bytes()
                        )
            data = buffer.getvalue()
            _package = (hashlib.sha256(data).hexdigest()[:16], data)
        return _package


def upload_package(connection: Connection, plan: Plan, on_line: Callable[[str], None]) -> str:
    """Put this skyward on the host, unless the same one is there; returns its directory."""
    digest, data = package_archive()
    return _upload(connection, plan, "pkg", digest, data, "this skyward", on_line)


def upload_includes(
    connection: Connection, plan: Plan, image: Image, on_line: Callable[[str], None]
) -> str | None:
    """Put the image's ``includes`` on the host, unless the same files are there; returns
    the directory to put on the workers' path (None: nothing to include)."""
    if not image.includes:
        return None
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for local, name in image.included_files():
            archive.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), Path(local).read_bytes())
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    return _upload(connection, plan, "inc", digest, data, "the image's includes", on_line)


def _upload(
    connection: Connection,
    plan: Plan,
    kind: str,
    digest: str,
    data: bytes,
    what: str,
    on_line: Callable[[str], None],
) -> str:
    """Unzip ``data`` into ``workdir/kind/digest`` unless it is there; returns that."""
    home = shell_path(plan.workdir)
    directory = f"{plan.workdir}/{kind}/{digest}"
    status, output = connection.run(
        f"mkdir -p {home}/{kind} && if [ -d {home}/{kind}/{digest} ]; then echo present; fi"
    )
    if status != 0:
        raise BootstrapError(f"{connection.target}: cannot create {plan.workdir}/{kind}: {output}")
    if "present" not in output:
        on_line(f"skyward: uploading {what} ({len(data) // 1024} KiB) to {directory}")
        # A name of its own: another client may be uploading the same archive right now.
        upload = f"{digest}.{secrets.token_hex(4)}"
        connection.upload(data, f"{_sftp_path(plan.workdir)}/{kind}/{upload}.zip")
        status, output = connection.run(
            f"{shell_path(plan.env_dir)}/bin/python -c {shlex.quote(_UNPACK)} "
            f"{home}/{kind}/{upload}.zip {home}/{kind}/{upload}.tmp {home}/{kind}/{digest}"
        )
        if status != 0:
            raise BootstrapError(
                f"{connection.target}: cannot unpack {what} into {plan.workdir}/{kind}: {output}"
            )
    return directory


# Unpack next to the final directory and rename into place; whoever renames first wins, and
# the loser's copy (identical) goes. Nothing is left behind on any path.
_UNPACK = """
import os, shutil, sys, zipfile
archive, scratch, final = sys.argv[1:]
try:
    zipfile.ZipFile(archive).extractall(scratch)
    try:
        os.rename(scratch, final)
    except OSError:
        if not os.path.isdir(final):
            raise
finally:
    shutil.rmtree(scratch, ignore_errors=True)
    os.remove(archive)
"""


def _sftp_path(workdir: str) -> str:
    # SFTP resolves relative paths from the login directory, which is where ~ points.
    if workdir == "~":
        return "."
    return workdir[2:] if workdir.startswith("~/") else workdir


def count_gpus(connection: Connection) -> int:
    status, output = connection.run("nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true")
    try:
        return int(output.strip() or 0) if status == 0 else 0
    except ValueError:
        return 0
