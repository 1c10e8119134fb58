"""The stand-in contract: the scenarios every cloud's stand-in tests run, written once.

Each cloud's ``tests/providers/<cloud>/test_*_standins.py`` states what differs in a
``Cloud`` (its stand-ins, its provider for them, how to list a pool's live machines and what
the cloud still holds for a pool, its accelerator, how its stand-ins end, how the real
``skyward`` command reaches its fake), calls these scenarios from its own tests, and adds the
checks only it makes. The tests only one cloud has (AWS's zones, Azure's SIGTERM, TPU
slices) stay in its file.

::

    runs_and_leaves_nothing      a 2-node pool runs the cloud's work and its close leaves
                                 nothing (a cloud whose warm adoption has tests of its own)
    runs_kept_warm_and_adopted   a 2-node pool runs the cloud's work (jax's multi-controller
                                 toy, or a map) and closes with keep_warm; the next pool
                                 adopts its machines (the same ones: nothing new rented,
                                 nothing new booted) and its close leaves nothing
    lost_machine_is_replaced     node 1's machine is taken away under a call: WorkerLost names
                                 it in the cloud's words, a replacement joins, the pool goes on
    killed_clients_machines_end  a SIGKILLed client's machines end themselves; ``skyward ls``
                                 lists what stays, ``down`` removes it all and the client's
                                 pool key

Every scenario uses the pools' public API and the cloud's fake as the checks' witness; one
pool start serves as many checks as it can (a pool start costs seconds to tens of seconds
on a loaded machine).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import skyward as sky
from skyward.providers.cloud import warm
from skyward.providers.cloud.options import CloudOptions
from support import ROOT, TESTS
from support.clouds.aws.standins import StandIn, StandInCloud
from support.dispositions import as_from_a_terminal
from support.markers import wait_for_markers
from support.pools import broadcast_in_background
from support.sshhosts import PackageIndex

NODES = 2
TOY_RESULT = -0.12398731708526611  # the jax multi-controller toy's sum, on every node


def ip_hostname(standin: StandIn) -> str:
    """The hostname of a stand-in VM, as cloud images name a machine: ``ip-10-123-0-200``."""
    return "ip-" + standin.address.replace(".", "-")


@dataclass
class Cloud:
    """One cloud's stand-ins, and what the scenarios need to know of it."""

    name: str  # the prefix of the pools' names: "aws", "gcp", ...
    standins: StandInCloud
    provider: Callable[..., CloudOptions]  # (**options): the provider for the stand-ins
    machines: Callable[[str], list[str]]  # a pool's live machines, as the cloud lists them
    left: Callable[[str], Mapping[str, list[str]]]  # what the cloud holds for a pool
    hostname: Callable[[StandIn], str] = ip_hostname  # a node's nodename, from its stand-in
    accelerator: str | None = None
    gone_as: str = "terminated"  # how a stand-in ends when its cloud deletes its machine
    closed_as: frozenset[str] | None = None  # how they end when a pool closes (None: any)
    # The client of the killed-client scenario: what it imports, how it builds the provider
    # (from ``settings``, its options dumped), its options left out of that dump, and how
    # the ``skyward`` command reaches the fake.
    client_imports: str = ""
    client_provider: str = ""
    client_settings: Mapping[str, object] = field(default_factory=dict)
    unpicklable: frozenset[str] = frozenset()
    cli_env: Mapping[str, str] = field(default_factory=dict)
    cli_drop: tuple[str, ...] = ()  # prefixes of this process's variables it must not see
    cli_args: tuple[str, ...] = ()

    def pool(self, index: PackageIndex, name: str, **options: Any) -> sky.ComputePool:
        """A 2-node pool of ``provider(**provider)`` on the stand-ins; ``options`` are the
        pool's (``provider=`` a dict of the provider's)."""
        return sky.ComputePool(
            provider=self.provider(**options.pop("provider", {})),
            accelerator=self.accelerator,
            nodes=options.pop("nodes", NODES),
            image=sky.Image(index_url=index.url),
            name=name,
            quiet=True,
            **options,
        )

    def nothing_left(self, pool: str) -> bool:
        return not any(self.left(pool).values())

    def all_ended(self, how: frozenset[str] | None = None) -> bool:
        standins = list(self.standins.standins.values())
        return bool(standins) and all(s.ended and (how is None or s.ended in how) for s in standins)


# ── the work a pool runs ──────────────────────────────────────────────────────────────


def toy() -> Any:
    """JAX's multi-controller toy (``examples/jax_multicontroller.py``), a ``sky.compute``
    function: every node's sum is ``TOY_RESULT``."""
    spec = importlib.util.spec_from_file_location(
        "jax_multicontroller", ROOT / "examples" / "jax_multicontroller.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.toy


def jax_toy(pool: sky.ComputePool) -> None:
    """The toy on a 2-node pool (``jax_plugins``): every node's sum."""
    results = toy()() @ pool
    assert [value for value, _ in results] == [TOY_RESULT] * NODES


def jax_plugins() -> list[Any]:
    """The jax plugin for the toy: 2 nodes x 4 CPU devices, its 8."""
    return [sky.plugins.jax(cpu_devices=4)]


def _square(x: int) -> tuple[int, str]:
    return x * x, os.uname().nodename


def a_map(pool: sky.ComputePool) -> None:
    """A map over more items than nodes: every result, in order, from the pool's nodes."""
    results = list(pool.map(_square, range(12)))
    names = pool.broadcast(lambda: os.uname().nodename)
    assert [value for value, _ in results] == [x * x for x in range(12)]
    assert {host for _, host in results} <= set(names) and len(set(names)) == NODES


def nodenames(pool: sky.ComputePool) -> list[str]:
    return pool.broadcast(lambda: os.uname().nodename)


# ── a pool runs, is kept warm, is adopted, and its adopter leaves nothing ─────────────


@dataclass(frozen=True)
class Adopted:
    """What ``runs_kept_warm_and_adopted`` saw, for a cloud's own checks."""

    names: list[str]  # the nodes' names, in rank order (the same in both pools)
    machines: list[str]  # the machines kept warm, then adopted
    kept: Mapping[str, list[str]]  # what the cloud held for the first pool once it closed


def _runs(
    cloud: Cloud,
    index: PackageIndex,
    name: str,
    work: Callable[[sky.ComputePool], None],
    inside: Callable[[sky.ComputePool], None] | None,
    **options: Any,
) -> tuple[list[str], list[str]]:
    """A 2-node pool runs ``work`` (and ``inside``, the cloud's own checks on a running pool),
    each node on its stand-in: its nodes' names, and its machines while it ran."""
    with cloud.pool(index, name, **options) as pool:
        names = nodenames(pool)
        hostnames = [cloud.hostname(s) for s in cloud.standins.standins.values()]
        assert sorted(names) == sorted(hostnames), (names, hostnames)
        work(pool)
        if inside is not None:
            inside(pool)
        machines = sorted(cloud.machines(name))
        assert len(machines) == NODES, machines
    return names, machines


def _left_nothing(cloud: Cloud, *pools: str) -> None:
    """The pools' close left nothing in the cloud, and every stand-in stopped."""
    for pool in pools:
        assert cloud.nothing_left(pool), cloud.left(pool)
    cloud.standins.wait_for(
        lambda: cloud.all_ended(cloud.closed_as),
        30,
        "stand-ins stopped when the pool's close ended their machines",
    )


def runs_and_leaves_nothing(
    cloud: Cloud,
    index: PackageIndex,
    work: Callable[[sky.ComputePool], None],
    *,
    plugins: list[Any] | None = None,
    inside: Callable[[sky.ComputePool], None] | None = None,
) -> list[str]:
    """A 2-node pool runs ``work`` (and ``inside``) and its close leaves nothing: for a
    cloud whose warm adoption is tested on its own. The nodes' names, in rank order."""
    name = f"{cloud.name}-run"
    options: dict[str, Any] = {"plugins": plugins} if plugins else {}
    names, _ = _runs(cloud, index, name, work, inside, **options)
    _left_nothing(cloud, name)
    return names


def runs_kept_warm_and_adopted(
    cloud: Cloud,
    index: PackageIndex,
    work: Callable[[sky.ComputePool], None],
    *,
    plugins: list[Any] | None = None,
    inside: Callable[[sky.ComputePool], None] | None = None,
) -> Adopted:
    """A 2-node pool runs ``work`` (and ``inside``) and closes with ``keep_warm``: its
    machines stay. The next pool of the same spec adopts them (no machine rented or booted
    anew) and its close ends them and everything either pool made: nothing is left, and
    every stand-in stops."""
    first_name, next_name = f"{cloud.name}-warm", f"{cloud.name}-next"
    options: dict[str, Any] = {"plugins": plugins} if plugins else {}
    before, rented = _runs(cloud, index, first_name, work, inside, keep_warm=300, **options)
    assert sorted(cloud.machines(first_name)) == rented  # kept: still there after the close
    kept = dict(cloud.left(first_name))
    assert not any(s.ended for s in cloud.standins.standins.values()), cloud.standins.events
    count, runs = len(cloud.standins.standins), len(cloud.standins.events)
    started = time.monotonic()
    with cloud.pool(index, next_name, **options) as second:
        ready = time.monotonic() - started
        after = nodenames(second)
        assert sorted(cloud.machines(first_name)) == rented  # nothing rented anew
        assert cloud.nothing_left(next_name), cloud.left(next_name)
    print(f"\nwarm start, 2 nodes on {cloud.name} stand-ins: ready in {ready:.2f} s")
    assert after == before
    assert len(cloud.standins.standins) == count  # no stand-in booted for the adopter
    assert not [e for e in cloud.standins.events[runs:] if e[0] == "booted"]
    assert [w for w in warm.kept() if w.pool == first_name] == []
    _left_nothing(cloud, first_name, next_name)
    return Adopted(names=before, machines=rented, kept=kept)


# ── a machine lost under a call is named, and replaced ────────────────────────────────


def _sleep_on(rank: int, started: str) -> None:
    if sky.instance_info().node == rank:
        Path(started).touch()
        time.sleep(600)


@dataclass(frozen=True)
class Replaced:
    """What ``lost_machine_is_replaced`` saw, for a cloud's own checks."""

    lost: StandIn
    replacement: StandIn
    before: list[str]
    after: list[str]


def lost_machine_is_replaced(
    cloud: Cloud,
    index: PackageIndex,
    markers: Path,
    take_away: Callable[[StandIn], str],
    *,
    inside: Callable[[StandIn, StandIn], None] | None = None,
    **options: Any,
) -> Replaced:
    """A pool (``options``: the pool's, ``provider=`` the provider's) runs a call on node 1
    when ``take_away`` takes node 1's machine as the cloud would (a spot reclaim, an
    eviction) and says the words the failure must hold: the call fails with WorkerLost
    naming it, a replacement machine joins as node 1, node 0 stays, the pool's next call
    runs on both, and its close leaves nothing. ``inside(lost, replacement)``: the cloud's
    own checks while the pool runs."""
    name = f"{cloud.name}-lost"
    standins = cloud.standins
    with cloud.pool(index, name, **options) as pool:
        before = nodenames(pool)
        first = dict(standins.standins)
        (lost,) = [s for s in first.values() if cloud.hostname(s) == before[1]]
        started = markers / "started"
        in_flight = broadcast_in_background(pool, _sleep_on, 1, str(started))
        wait_for_markers(started)  # the call runs on node 1: then its machine goes
        words = take_away(lost)
        failure = in_flight.exception(timeout=120)
        assert isinstance(failure, sky.WorkerLost), failure
        assert words in str(failure), str(failure)
        end = time.monotonic() + 180
        while pool.statistics().ready_nodes < NODES or len(standins.standins) <= len(first):
            assert time.monotonic() < end, standins.events
            time.sleep(0.2)
        after = nodenames(pool)
        (replacement,) = [s for i, s in standins.standins.items() if i not in first]
        assert not replacement.ended and lost.ended == cloud.gone_as, standins.events
        if inside is not None:
            inside(lost, replacement)
    assert after[0] == before[0]
    # (A cloud may give the new machine the address the old one freed.)
    assert after[1] == cloud.hostname(replacement), (after, before)
    assert cloud.nothing_left(name), cloud.left(name)
    return Replaced(lost=lost, replacement=replacement, before=before, after=after)


# ── a client killed: its machines end themselves; skyward ls, then down ─────────────────

_CLIENT = """
import sys, time
sys.path.insert(0, {tests!r})
import skyward as sky
{imports}
settings = {settings!r}
provider = {construct}
with sky.ComputePool(provider=provider, accelerator={accelerator!r}, nodes=2,
                     image=sky.Image(index_url={index!r}), name={pool!r},
                     console="plain") as pool:
    print("READY", flush=True)
    pool.broadcast(time.sleep, 3600)  # a long job, its client attached
"""


def start_client(
    cloud: Cloud, index: str, pool: str, log: Path, **options: Any
) -> subprocess.Popen[bytes]:
    """A client in a process of its own, its output in ``log``, its temporary directory (where
    its pool key goes) beside ``log``, signalled as from a terminal however this run
    started: a pool of 2 nodes running a long job once it prints READY."""
    settings = cloud.provider(**options).model_dump(
        exclude_defaults=True, exclude=set(cloud.unpicklable)
    )
    script = _CLIENT.format(
        tests=str(TESTS),
        imports=cloud.client_imports,
        settings={**settings, **cloud.client_settings},
        construct=cloud.client_provider,
        accelerator=cloud.accelerator,
        index=index,
        pool=pool,
    )
    env = {**os.environ, "TMPDIR": str(log.parent)}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=as_from_a_terminal,
        )


def wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.monotonic() + timeout
    while text not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < end, f"no {text!r} within {timeout:g} s: {log.read_text()}"
        time.sleep(0.1)


def skyward(
    cloud: Cloud, tmp: Path, *args: str, answer: str = ""
) -> subprocess.CompletedProcess[str]:
    """The real ``skyward`` command, pointed at the cloud's fake; its temporary directory is
    the one the test's clients put their pool keys in."""
    mine = {k: v for k, v in os.environ.items() if not k.startswith(cloud.cli_drop)}
    env = {**mine, **cloud.cli_env, "TMPDIR": str(tmp)}
    return subprocess.run(
        [str(Path(sys.executable).parent / "skyward"), *args, *cloud.cli_args],
        input=answer,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def killed_clients_machines_end_themselves(
    cloud: Cloud,
    index: PackageIndex,
    tmp: Path,
    *,
    ended_as: frozenset[str] | None,
    after_the_watchdog: Callable[[], None],
    listed: Callable[[str], None],
    watchdog_says: tuple[str, ...] = (),
    idle_timeout: float = 3,
    attached: float = 8,
) -> None:
    """A client runs a long job on a pool (``idle_timeout`` on its machines) and is killed
    (SIGKILL: it cleans up nothing). While it was attached, ``attached`` seconds past the
    idle bound, nothing ended; once it is gone, every machine's watchdog ends it
    (``ended_as``: how its stand-in ends) and ``after_the_watchdog`` checks what the cloud
    keeps; each machine's watchdog log says each of ``watchdog_says``. ``skyward ls`` lists
    what is kept (``listed`` checks its output), ``down --yes`` removes it all and the
    client's stale pool key, and ``ls`` then finds nothing left."""
    log = tmp / "client.log"
    options = {"idle_timeout": idle_timeout, "boot_timeout": 120}
    client = start_client(cloud, index.url, "orphan", log, **options)
    try:
        wait_for_line(log, "READY", client, 240)
        # The job runs well past idle_timeout while its client is attached: nothing stops.
        time.sleep(attached)
        assert client.poll() is None, log.read_text()
        assert not any(s.ended for s in cloud.standins.standins.values()), cloud.standins.events
        assert len(cloud.machines("orphan")) == NODES, cloud.left("orphan")
        (key,) = tmp.glob("skyward-key-*")
    finally:
        client.kill()
        client.wait(30)
    assert key.exists()  # a killed client cannot delete its pool key: down does
    cloud.standins.wait_for(
        lambda: cloud.all_ended(ended_as), 120, "the stand-ins' watchdogs ended their machines"
    )
    after_the_watchdog()
    for standin in cloud.standins.standins.values():  # each kept its own account of it
        said = (standin.directory / "var-log" / "skyward-watchdog.log").read_text()
        assert all(words in said for words in watchdog_says), said
    left = cloud.left("orphan")
    assert any(left.values()), "what the watchdog leaves is for ls and down to find"

    shown = skyward(cloud, tmp, "ls", "--pool", "orphan")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    listed(shown.stdout)
    assert cloud.left("orphan") == left  # ls removes nothing
    removed = skyward(cloud, tmp, "down", "--pool", "orphan", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert cloud.nothing_left("orphan"), cloud.left("orphan")
    assert not key.exists(), removed.stdout  # the killed client's key, stale once all is gone
    assert "Nothing left" in skyward(cloud, tmp, "ls").stdout
