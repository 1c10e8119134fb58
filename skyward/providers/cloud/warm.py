"""Machines kept warm between pools: the record a pool closed with ``keep_warm`` leaves in the
user's state directory, and the lock that gives each kept set to one pool at most.

::

    pool A closes, keep_warm=600               pool B starts: same cloud, spec and node count
    ───────────────────────────────────        ─────────────────────────────────────────────
    CloudPool.keep (start.py): each            claim(cloud, spec, nodes): the newest such
      machine's watchdog told to keep it         record whose lock is free; the lock (fcntl,
      600 s with no client; workers stopped      on a file) goes when the process ends,
    save(WarmSet) -> <state>/warm/<id>.json      however it ends
                                               adopt (start.py): describe, SSH with the
    skyward ls: kept()                           pinned host key, bootstrap, fresh workers;
    skyward down: forget() a pool's records      then forget the record: the set is B's now

Nothing here speaks to a cloud or a machine: the record says what exists, ``start.py`` acts
on it, and ``skyward down`` ends kept machines through their tags like any leftover.

The state directory is ``$SKYWARD_STATE_DIR``, else ``$XDG_STATE_HOME/skyward``, else
``~/.local/state/skyward``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from types import TracebackType
from typing import Any

from skyward.providers.base import ProvisionRequest


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where Skyward keeps what outlives a process on this machine (the user's, not a cache:
    deleting it forgets machines that still bill)."""
    env = os.environ if env is None else env
    if env.get("SKYWARD_STATE_DIR"):
        return Path(env["SKYWARD_STATE_DIR"]).expanduser()
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "skyward"


def warm_dir(env: Mapping[str, str] | None = None) -> Path:
    return state_dir(env) / "warm"


def spec_digest(options: object, request: ProvisionRequest) -> str:
    """What must be equal for a pool to adopt another's machines: the provider's options,
    every one of them (a machine type, a zone, the image, the idle bound its watchdog has),
    and what the pool asked of the machines. The pool's name, image, volumes and price bound
    are not in it: they change nothing a machine was made with."""

    def plain(value: object) -> str:
        # Credentials objects and the like: their kind, never their contents or address.
        return str(value) if isinstance(value, PurePath) else type(value).__qualname__

    dump = getattr(options, "model_dump", None)
    fields = {
        "provider": type(options).__qualname__,
        "options": dump(mode="python") if callable(dump) else repr(options),
        "accelerator": request.accelerator,
        "vcpus": request.vcpus,
        "memory_gb": request.memory_gb,
        "allocation": request.allocation,
        "python": "{}.{}".format(*sys.version_info[:2]),
    }
    blob = json.dumps(fields, sort_keys=True, default=plain).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class WarmMachine:
    """One kept machine: node ``rank``'s, where SSH answered (``host``, ``port``, ``user``),
    where the other nodes reach it (``peer``), and the cloud's place and id for it."""

    rank: int
    host: str
    port: int
    user: str
    peer: str
    place: str
    id: str


@dataclass(frozen=True)
class WarmSet:
    """A pool's machines, kept after it closed: everything the next pool needs to check
    them (the pinned host key, the login key's file), use them, and release them (the
    pool's record of what it made, ``Record.snapshot``)."""

    id: str
    cloud: str  # "gcp"
    spec: str  # spec_digest
    image: str  # the bootstrap plan's digest: the environment already on the machines
    pool: str  # the pool that made them: their tags, and `skyward down --pool`
    owner: str
    kept_at: float  # wall clock (time.time())
    until: float  # wall clock: the watchdogs end the machines then
    hourly_cost: float | None
    describe: str  # "2 x n2-standard-2 on-demand in us-central1-a"
    host_key: str  # "ssh-ed25519 AAAA...": every machine of the set presents it
    label: str  # the cloud's name for the pool's things (contract.Resumable.resume)
    key_dir: str  # the pool key's directory (PoolKey): its id_ed25519 logs in
    gpus: int | None
    machine_type: str
    instance_profile: bool
    down: str  # the `skyward down` command that ends them
    machines: tuple[WarmMachine, ...]
    record: dict[str, Any]

    @property
    def nodes(self) -> int:
        return len(self.machines)

    def left(self, now: float | None = None) -> float:
        """Seconds until the watchdogs end the machines (negative: past)."""
        return self.until - (time.time() if now is None else now)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> WarmSet:
        data = json.loads(text)
        machines = tuple(WarmMachine(**m) for m in data.pop("machines"))
        return cls(machines=machines, **data)


def new_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


def save(warm: WarmSet, directory: Path | None = None) -> Path:
    """Write the record whole (a temporary file renamed into place: a reader never sees half
    of one), readable by this user only: it names a login key."""
    directory = directory or warm_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{warm.id}.json"
    scratch = directory / f".{warm.id}.{secrets.token_hex(4)}.tmp"
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(warm.to_json())
    os.replace(scratch, path)
    return path


def kept(directory: Path | None = None) -> list[WarmSet]:
    """Every readable record, newest first (``skyward ls``); one being written or damaged is
    left out."""
    directory = directory or warm_dir()
    found: list[WarmSet] = []
    for path in directory.glob("*.json"):
        try:
            found.append(WarmSet.from_json(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return sorted(found, key=lambda w: w.kept_at, reverse=True)


def forget(warm_id: str, directory: Path | None = None) -> None:
    """Remove a record (its machines are ended, or another pool's now). Idempotent."""
    directory = directory or warm_dir()
    for name in (f"{warm_id}.json", f"{warm_id}.lock"):
        try:
            (directory / name).unlink()
        except FileNotFoundError:
            pass


class Claim:
    """One record, held: no other pool (in this process or another) claims it until
    ``release`` (or the process ends: the lock is the kernel's, on an open file). A context
    manager that releases."""

    def __init__(self, warm: WarmSet, lock: int, directory: Path) -> None:
        self.warm = warm
        self._lock = lock
        self._directory = directory

    def forget(self) -> None:
        """The record goes (before the lock): the set is ended, or the claimer's now."""
        forget(self.warm.id, self._directory)

    def release(self) -> None:
        if self._lock >= 0:
            os.close(self._lock)  # closing the descriptor lets go of the lock
            self._lock = -1

    def __enter__(self) -> Claim:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def claim(
    cloud: str,
    spec: str,
    nodes: int,
    *,
    exclude: Sequence[str] = (),
    directory: Path | None = None,
) -> Claim | None:
    """The newest record of ``nodes`` machines on ``cloud`` with this ``spec`` whose lock is
    free, held; ``None`` when there is none. A record whose lock another pool holds is
    skipped, never waited for: that pool is adopting it, and this one starts its own."""
    directory = directory or warm_dir()
    for warm in kept(directory):
        if warm.id in exclude or (warm.cloud, warm.spec, warm.nodes) != (cloud, spec, nodes):
            continue
        path = directory / f"{warm.id}.lock"
        try:
            lock = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)  # another pool holds it
            continue
        # Held; but the pool that held it before may have adopted it and removed the
        # record meanwhile: only a record still there is ours.
        if not (directory / f"{warm.id}.json").exists():
            os.close(lock)
            path.unlink(missing_ok=True)
            continue
        return Claim(warm, lock, directory)
    return None
