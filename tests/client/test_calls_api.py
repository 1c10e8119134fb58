"""skyward 0.5's ways of sending calls, on local and SSH pools: ``default_compute_timeout``,
``CallGroup.with_timeout``, ``run_async``, ``run_parallel``, ``is_active``, ``concurrency``,
``f(x) >> sky`` (the innermost open pool of this thread) and ``ComputePool.Named``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from support.pools import PoolFactory
from support.sshhosts import Hosts, PackageIndex

import skyward as sky


@sky.compute
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@sky.compute
def node() -> int:
    return sky.instance_info().node


@sky.compute
def pool_name() -> str:
    return sky.instance_info().pool


# ── timeouts ─────────────────────────────────────────────────────────────────────────────


@pytest.mark.timeout(180)
def test_default_compute_timeout_bounds_every_call_without_its_own(make_pool: PoolFactory) -> None:
    assert sky.ComputePool().spec.default_compute_timeout is None  # no bound unless asked
    with make_pool(nodes=2, default_compute_timeout=1.0) as pool:
        with pytest.raises(TimeoutError, match="nap did not finish within its timeout of 1 s"):
            nap(60) >> pool
        with pytest.raises(TimeoutError, match="timeout of 1 s"):
            pool.broadcast(nap, 60)
        # a call's own timeout wins over the pool's default, both ways
        assert nap(2).with_timeout(60) >> pool == 2
        with pytest.raises(TimeoutError, match=r"timeout of 0\.5 s"):
            pool.run(sky.compute(timeout=0.5)(nap.fn), 60)
        assert pool.map(nap.fn, [0, 0]) == [0, 0]  # the pool still serves


@pytest.mark.timeout(180)
def test_a_group_timeout_bounds_the_whole_group(make_pool: PoolFactory) -> None:
    with make_pool(nodes=2) as pool:
        assert (nap(0) & nap(0.1)).with_timeout(60) >> pool == (0, 0.1)
        # the group's bound, or the slow call's own (the group gave it its timeout), whichever
        # the clock reaches first
        with pytest.raises(TimeoutError, match=r"timeout of 1 s"):
            (nap(0) & nap(60)).with_timeout(1) >> pool
        # a call with a timeout of its own keeps it; the group's own bound still applies
        group = (nap(0.2).with_timeout(30) & nap(0.1)).with_timeout(30)
        assert group._bounded()[0].timeout == 30 and group._bounded()[1].timeout == 30
        assert pool.run_parallel(group) == (0.2, 0.1)
        assert pool.run(node) in (0, 1)  # the worker that ran over was replaced; all serve


@pytest.mark.timeout(120)
def test_a_group_past_its_timeout_names_the_late_calls_and_cancels_the_queued_ones(
    make_pool: PoolFactory,
) -> None:
    with make_pool(nodes=1) as pool:
        long = nap(60).with_timeout(100)  # its own bound, longer than the group's
        queued = nap(0)  # waits behind it on the one node
        with pytest.raises(TimeoutError, match=r"2 of the group's 2 calls .* 1 s: nap, nap"):
            (long & queued).with_timeout(1) >> pool
        assert pool.statistics().queued == 0  # the queued one was cancelled, not run later
        pool.close(wait=False)  # the long one is interrupted, not waited for


def test_with_timeout_is_validated() -> None:
    with pytest.raises(ValueError, match="timeout"):
        (nap(0) & nap(0)).with_timeout(0)
    with pytest.raises(ValueError, match="timeout"):
        sky.ComputePool(default_compute_timeout=-1)


# ── the pool's other 0.5 methods ─────────────────────────────────────────────────────────


@pytest.mark.timeout(120)
def test_run_async_run_parallel_is_active_and_concurrency(make_pool: PoolFactory) -> None:
    pool = make_pool(nodes=2, concurrency=3)
    assert not pool.is_active and pool.concurrency == 3 and pool.current_nodes() == 0
    with pool:
        assert pool.is_active and pool.current_nodes() == 2
        future = pool.run_async(nap(0.1))
        assert isinstance(future, Future) and future.result(timeout=60) == 0.1
        assert pool.run_async(nap, 0.2).result(timeout=60) == 0.2
        assert pool.run_parallel(nap(0) & nap(0.1)) == (0, 0.1)
        streamed = pool.run_parallel(sky.gather(nap(0.3), nap(0), stream=True, ordered=False))
        assert list(streamed) == [0, 0.3]
        assert pool.run(node()) in (0, 1) and sorted(pool.broadcast(node())) == [0, 1]
        with pytest.raises(TypeError, match="run_parallel takes a group of calls"):
            pool.run_parallel(nap(0))  # type: ignore[arg-type]
    assert not pool.is_active


# ── f(x) >> sky ──────────────────────────────────────────────────────────────────────────


@pytest.mark.timeout(180)
def test_the_module_on_the_right_means_the_innermost_pool_this_thread_has_open(
    make_pool: PoolFactory,
) -> None:
    with pytest.raises(sky.PoolClosed, match=r"`f\(x\) >> sky` runs on the innermost pool"):
        node() >> sky
    with make_pool(nodes=1, name="outer") as outer:
        assert pool_name() >> sky == "outer"
        with make_pool(nodes=2, name="inner"):
            assert pool_name() >> sky == "inner"
            assert pool_name() @ sky == ["inner", "inner"]
            assert (pool_name() > sky).result(timeout=60) == "inner"
            assert (pool_name() & pool_name()) >> sky == ("inner", "inner")
            # another thread has no pool open: it is told so, not sent to this one
            seen: list[BaseException] = []
            thread = threading.Thread(target=lambda: _send_to_sky(seen))
            thread.start()
            thread.join(60)
            assert len(seen) == 1 and isinstance(seen[0], sky.PoolClosed)
        assert pool_name() >> sky == "outer"  # the inner one closed
        outer.close()
        with pytest.raises(sky.PoolClosed):
            node() >> sky


def _send_to_sky(seen: list[BaseException]) -> None:
    try:
        node() >> sky
    except BaseException as exc:
        seen.append(exc)


# ── ComputePool.Named ────────────────────────────────────────────────────────────────────


@pytest.fixture
def config_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """A project directory (the working directory) and a user configuration directory."""
    project, user = tmp_path / "project", tmp_path / "config"
    project.mkdir()
    (user / "skyward").mkdir(parents=True)
    monkeypatch.chdir(project)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    yield project, user / "skyward"


@pytest.mark.timeout(120)
def test_a_named_pool_comes_from_the_project_then_the_user_file(
    config_dirs: tuple[Path, Path],
) -> None:
    project, user = config_dirs
    (user / "skyward.toml").write_text(
        '[providers.here]\ntype = "local"\n\n'
        '[pools.small]\nprovider = "here"\nnodes = 1\n\n'
        "[pools.both]\nnodes = 3\n"
    )
    (project / "skyward.toml").write_text(
        '[pools.both]\nprovider = "here"\nnodes = [1, 2]\nautoscale_cooldown = 5\n'
        'console = "off"\n[pools.both.image]\nenv = {STAGE = "test"}\n'
    )
    pool = sky.ComputePool.Named("both")
    assert (pool.spec.min_nodes, pool.spec.nodes, pool.spec.autoscale_cooldown) == (1, 2, 5)
    assert pool.image.env["STAGE"] == "test" and pool.spec.provider_kind == "local"
    assert sky.ComputePool.Named("small", name="renamed").name == "renamed"
    with sky.ComputePool.Named("small", console="off") as running:
        assert running.run(node) == 0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("nodes = 0", r"\[pools.p\]: nodes: Input should be greater than or equal to 1"),
        ("nodez = 2", r"\[pools.p\]: 'nodez' is not a pool option; did you mean 'nodes'\? \(the"),
        ('nodes = "4"', r"\[pools.p\]: nodes: Input should be a valid integer"),
        ('provider = "nowhere"', r"provider 'nowhere' is neither a \[providers\] entry"),
        ('provider = {type = "ssh"}', r"\[pools.p\] provider: hosts: Field required"),
        ('provider = {type = "tpu"}', r"type must be one of local, ssh"),
        ('[pools.p.image]\npython = "2.7"', r"\[pools.p\] image: python"),
        ('accelerator = "A100"', r"\[pools.p\]: the local pool has no A100"),
    ],
)
def test_a_wrong_value_in_a_named_pool_names_the_file_table_and_field(
    config_dirs: tuple[Path, Path], table: str, message: str
) -> None:
    project, _ = config_dirs
    (project / "skyward.toml").write_text(f"[pools.p]\n{table}\n")
    with pytest.raises(ValueError, match=message) as caught:
        sky.ComputePool.Named("p")
    assert str(project / "skyward.toml") in str(caught.value) or "type must" in str(caught.value)


def test_a_missing_named_pool_lists_the_ones_there(config_dirs: tuple[Path, Path]) -> None:
    project, _ = config_dirs
    (project / "skyward.toml").write_text("[pools.a]\n[pools.b]\n")
    with pytest.raises(ValueError, match=r"no pool named 'c' .* the pools there: a, b"):
        sky.ComputePool.Named("c")
    (project / "skyward.toml").write_text("[pools.a\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        sky.ComputePool.Named("a")


@pytest.mark.timeout(180)
def test_a_named_ssh_pool_runs_on_its_hosts(
    config_dirs: tuple[Path, Path], ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    project, _ = config_dirs
    hosts = ", ".join(f'"{h.target}"' for h in ssh_hosts.hosts[:2])
    (project / "skyward.toml").write_text(
        f'[providers.lab]\ntype = "ssh"\nhosts = [{hosts}]\nkey = "{ssh_hosts.client_key}"\n'
        f'known_hosts = "{ssh_hosts.known_hosts}"\n\n'
        f'[pools.lab]\nprovider = "lab"\nnodes = 2\nconsole = "off"\n'
        f'[pools.lab.image]\nindex_url = "{package_index.url}"\n'
    )
    with sky.ComputePool.Named("lab") as pool:
        assert pool.spec.provider_kind == "ssh"
        assert sorted(node() @ pool) == [0, 1]
