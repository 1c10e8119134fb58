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
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skyward._bootstrap import MARKER, Plan, render, shell_path
from skyward._errors import BootstrapError
from skyward._ssh import Connection

_LOG_TAIL_LINES = 30


def runtime_requirements() -> tuple[str, ...]:
    """What the worker imports besides the standard library, at the client's versions.

    Pinned because values pickled on one side are unpickled on the other.
    """
    from importlib import metadata

    return tuple(f"{name}=={metadata.version(name)}" for name in ("cloudpickle", "pydantic"))


def bootstrap(connection: Connection, plan: Plan, on_line: Any) -> None:
    """Run the image's script on the host, streaming its output; ``BootstrapError`` if it fails."""
    tail: list[str] = []
    command: list[str] = []

    def line(text: str) -> None:
        if text.startswith(MARKER):
            command[:] = [text[len(MARKER) :]]
        tail.append(text)
        del tail[:-_LOG_TAIL_LINES]
        on_line(text)

    # On stdin: no limit on the script's length, and no quoting through the login shell.
    status, _ = connection.run("sh -s", stdin=render(plan).encode(), on_line=line)
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
    home = shell_path(plan.workdir)
    directory = f"{plan.workdir}/pkg/{digest}"
    status, output = connection.run(
        f"mkdir -p {home}/pkg && if [ -d {home}/pkg/{digest} ]; then echo present; fi"
    )
    if status != 0:
        raise BootstrapError(f"{connection.target}: cannot create {plan.workdir}/pkg: {output}")
    if "present" not in output:
        on_line(f"skyward: uploading this skyward ({len(data) // 1024} KiB) to {directory}")
        # A name of its own: another client may be uploading the same package right now.
        upload = f"{digest}.{secrets.token_hex(4)}"
        connection.upload(data, f"{_sftp_path(plan.workdir)}/pkg/{upload}.zip")
        status, output = connection.run(
            f"{shell_path(plan.env_dir)}/bin/python -c {shlex.quote(_UNPACK)} "
            f"{home}/pkg/{upload}.zip {home}/pkg/{upload}.tmp {home}/pkg/{digest}"
        )
        if status != 0:
            raise BootstrapError(
                f"{connection.target}: cannot unpack skyward into {plan.workdir}/pkg: {output}"
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
