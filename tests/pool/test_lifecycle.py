"""Plugins' contexts, teardown on every path, validation before start, concurrency."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pydantic
import pytest
from support.markers import per_node, wait_for_markers
from support.pools import PoolFactory
from support.processes import worker_processes

import skyward as sky


def recorder(name: str, log: Path) -> sky.Plugin:
    """A plugin whose around_app appends '<name> enter|exit <node>' to ``log``."""

    @contextlib.contextmanager
    def around(info: sky.InstanceInfo) -> Iterator[None]:
        with open(log, "a") as f:
            f.write(f"{name} enter {info.node}\n")
        try:
            yield
        finally:
            with open(log, "a") as f:
                f.write(f"{name} exit {info.node}\n")

    return sky.Plugin(name=name, around_app=around)


def events(log: Path, node: int = 0) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.rsplit(" ", 1)[0] for line in lines if line.endswith(f" {node}")]


def getenv(key: str) -> str | None:
    # Not os.environ.get itself: that bound method would carry the client's environ along.
    return os.environ.get(key)


def _wait_for_gate(gate: str) -> None:
    while not os.path.exists(gate):
        time.sleep(0.01)


def _mark_then_sleep(marker: str, seconds: float) -> None:
    """Say the call runs (make ``marker``, ``{node}`` filled in), then sleep."""
    Path(marker.replace("{node}", str(sky.instance_info().node))).touch()
    time.sleep(seconds)


def _interrupt_main_when(ready: Callable[[], bool]) -> None:
    def wait_then_interrupt() -> None:
        deadline = time.monotonic() + 50
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    threading.Thread(target=wait_then_interrupt, daemon=True).start()


# ── around_app ───────────────────────────────────────────────────────────────────────────


def test_around_app_nests_first_plugin_outermost(make_pool: PoolFactory, tmp_path: Path) -> None:
    log = tmp_path / "events"
    plugins = [recorder("a", log), recorder("b", log), recorder("c", log)]
    with make_pool(nodes=2, plugins=plugins) as pool:
        pool.broadcast(lambda: None)
        assert events(log, 0) == ["a enter", "b enter", "c enter"]
    expected = ["a enter", "b enter", "c enter", "c exit", "b exit", "a exit"]
    assert events(log, 0) == expected
    assert events(log, 1) == expected


def test_around_app_failure_fails_the_start_with_the_reason(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    log = tmp_path / "events"

    @contextlib.contextmanager
    def broken(info: sky.InstanceInfo) -> Iterator[None]:
        if info.node == 1:
            raise RuntimeError("cannot reach the license server")
        yield

    plugins = [recorder("outer", log), sky.Plugin(name="broken", around_app=broken)]
    with pytest.raises(sky.StartError, match="cannot reach the license server") as caught:
        with make_pool(nodes=2, plugins=plugins):
            pass
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert events(log, 1) == ["outer enter", "outer exit"]


# ── teardown ─────────────────────────────────────────────────────────────────────────────


def test_an_exception_in_the_with_block_closes_everything(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    log = tmp_path / "events"
    with pytest.raises(ZeroDivisionError):
        with make_pool(nodes=2, plugins=[recorder("p", log)]) as pool:
            pool.broadcast(lambda: None)
            1 / 0  # noqa: B018
    assert not worker_processes()
    assert events(log, 0)[-1] == "p exit" and events(log, 1)[-1] == "p exit"


@pytest.mark.timeout(60)
def test_ctrl_c_during_a_call_interrupts_it_and_runs_teardown(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    log = tmp_path / "events"
    started = per_node(tmp_path / "started", 2)
    # Ctrl-C once the call runs on both workers (inside their plugin).
    _interrupt_main_when(lambda: all(marker.exists() for marker in started))
    with pytest.raises(KeyboardInterrupt):
        with make_pool(nodes=2, plugins=[recorder("p", log)]) as pool:
            pool.broadcast(_mark_then_sleep, str(tmp_path / "started-{node}"), 120)
    assert not worker_processes()
    # the workers were interrupted gracefully, so their contexts were left
    assert events(log, 0) == ["p enter", "p exit"]
    assert events(log, 1) == ["p enter", "p exit"]


@pytest.mark.timeout(60)
def test_ctrl_c_during_start_closes_what_was_started(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    log = tmp_path / "events"
    inside = tmp_path / "inside-slow"

    @contextlib.contextmanager
    def slow(info: sky.InstanceInfo) -> Iterator[None]:
        if info.node == 0:
            inside.touch()
        time.sleep(120)  # a plugin waiting for something that never comes
        yield

    plugins = [recorder("p", log), sky.Plugin(name="slow", around_app=slow)]
    # once node 0 is inside its plugins (an SSH host may still be bootstrapping at 1.5 s)
    _interrupt_main_when(inside.exists)
    with pytest.raises(KeyboardInterrupt):
        make_pool(nodes=2, plugins=plugins).start()
    assert not worker_processes()
    assert events(log, 0) == ["p enter", "p exit"]


@pytest.mark.timeout(60)
def test_a_worker_that_ignores_shutdown_is_killed_after_the_bound(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    def stubborn(started: str) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        Path(started).touch()
        while True:
            time.sleep(0.05)  # swallows KeyboardInterrupt by ignoring SIGINT

    pool = make_pool(nodes=1, shutdown_timeout=1.0).start()
    started = tmp_path / "started"
    future = pool.submit(stubborn, str(started))
    wait_for_markers(started)
    pool.close(wait=False)
    assert not worker_processes()
    with pytest.raises(sky.PoolClosed):
        future.result(timeout=5)


@pytest.mark.timeout(60)
def test_a_pool_never_closed_is_closed_at_interpreter_exit(tmp_path: Path) -> None:
    log = tmp_path / "events"
    script = textwrap.dedent(
        f"""
        import contextlib, os, sys
        import skyward as sky

        @contextlib.contextmanager
        def around(info):
            yield
            with open({str(log)!r}, "a") as f:
                f.write(f"exit {{info.node}}\\n")

        pool = sky.ComputePool(nodes=2, plugins=[sky.Plugin(name="p", around_app=around)],
                               quiet=True).start()
        print(*pool.broadcast(os.getpid))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2
    assert not [p for p in pids if psutil.pid_exists(p)]
    assert sorted(log.read_text().split("\n")[:-1]) == ["exit 0", "exit 1"]


@pytest.mark.timeout(60)
def test_workers_exit_when_the_client_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, sys, time
        import skyward as sky
        pool = sky.ComputePool(nodes=2).start()
        print(*pool.broadcast(os.getpid), flush=True)
        time.sleep(120)
        """
    )
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None
    pids = [int(p) for p in client.stdout.readline().split()]
    client.kill()
    client.wait()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(60)
def test_calls_interrupted_by_a_cancelling_close_fail_with_pool_closed(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    pool = make_pool(nodes=2).start()
    started = [tmp_path / f"started-{i}" for i in range(2)]
    futures = [pool.submit(_mark_then_sleep, str(marker), 30) for marker in started]
    wait_for_markers(*started)
    pool.close(wait=False)
    for future in futures:
        assert isinstance(future.exception(timeout=10), sky.PoolClosed)


@pytest.mark.timeout(60)
def test_a_cancelling_close_with_concurrency_still_runs_teardown(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    log = tmp_path / "events"
    pool = make_pool(
        nodes=1, concurrency=2, plugins=[recorder("p", log)], shutdown_timeout=30
    ).start()
    started = [tmp_path / f"started-{i}" for i in range(2)]
    futures = [pool.submit(_mark_then_sleep, str(marker), 60) for marker in started]
    wait_for_markers(*started)
    pool.close(wait=False)
    # "p exit" shows the worker left gracefully rather than being killed after 30 s
    assert events(log) == ["p enter", "p exit"]
    assert all(isinstance(f.exception(timeout=5), sky.PoolClosed) for f in futures)


@pytest.mark.timeout(60)
def test_a_cancelling_close_runs_teardown_for_a_client_that_ignores_sigint(
    tmp_path: Path,
) -> None:
    # What a client started with `nohup ... &` (or by a job scheduler) looks like: SIGINT
    # ignored, which its workers inherit unless they undo it.
    log = tmp_path / "events"
    started = tmp_path / "started"
    script = textwrap.dedent(
        f"""
        import contextlib, os, time
        import skyward as sky

        def mark_then_sleep(marker, seconds):
            open(marker, "w").close()
            time.sleep(seconds)

        @contextlib.contextmanager
        def around(info):
            with open({str(log)!r}, "a") as f:
                f.write("p enter 0\\n")
            try:
                yield
            finally:
                with open({str(log)!r}, "a") as f:
                    f.write("p exit 0\\n")

        pool = sky.ComputePool(nodes=1, plugins=[sky.Plugin(name="p", around_app=around)],
                               shutdown_timeout=30, quiet=True).start()
        future = pool.submit(mark_then_sleep, {str(started)!r}, 60)
        while not os.path.exists({str(started)!r}):  # the call runs
            time.sleep(0.01)
        pool.close(wait=False)
        print(type(future.exception(timeout=20)).__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert result.stdout.split() == ["PoolClosed"]
    # "p exit": the call was interrupted and the worker left its contexts, not killed at 30 s
    assert events(log) == ["p enter", "p exit"]


@pytest.mark.timeout(60)
def test_closing_refuses_new_calls_while_it_waits_for_submitted_ones(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    pool = make_pool(nodes=1).start()
    gate = tmp_path / "gate"
    running = pool.submit(_wait_for_gate, str(gate))
    closer = threading.Thread(target=pool.close)
    closer.start()
    try:
        deadline = time.monotonic() + 30
        while pool.statistics().state != "draining" and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(sky.PoolClosed, match="draining"):
            pool.submit(abs, 1)
    finally:
        gate.touch()
    closer.join(30)
    assert not closer.is_alive()
    assert running.result(timeout=0) is None


def test_processes_started_by_a_call_do_not_outlive_the_pool(make_pool: PoolFactory) -> None:
    def start_a_child() -> int:
        return subprocess.Popen(["sleep", "300"]).pid

    with make_pool(nodes=1) as pool:
        child = pool.run(start_a_child)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_closing_twice_and_using_a_closed_pool(make_pool: PoolFactory) -> None:
    pool = make_pool()
    with pytest.raises(sky.PoolClosed, match=r"use `with sky\.ComputePool"):
        pool.run(os.getpid)
    pool.start()
    pool.close()
    pool.close()
    with pytest.raises(sky.PoolClosed):
        pool.run(os.getpid)
    with pytest.raises(sky.PoolClosed, match="already started"):
        pool.start()


def test_leaving_normally_waits_for_submitted_calls() -> None:
    with sky.ComputePool(nodes=1) as pool:
        future = pool.submit(lambda: time.sleep(0.5) or "done")
    assert future.result(timeout=0) == "done"


# ── validation before anything starts ───────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: sky.ComputePool(nodes=0), "nodes"),
        (lambda: sky.ComputePool(concurrency=0), "concurrency"),
        (lambda: sky.ComputePool(start_timeout=-1), "start_timeout"),
        (lambda: sky.ComputePool(provider="aws"), "provider"),  # type: ignore[arg-type]
        (lambda: sky.Image(pip=["numpy"], pyton="3.11"), "pyton"),  # type: ignore[call-arg]
        (lambda: sky.Image(python="2.7"), "python"),
        (lambda: sky.Image(env={"BAD NAME": "x"}), "env"),
        (lambda: sky.Plugin(name="p", around_app=3), "around_app"),  # type: ignore[arg-type]
        (lambda: sky.Plugin(name="p", transform="x"), "transform"),  # type: ignore[arg-type]
        (lambda: sky.PipIndex(url="https://x", packages=[]), "packages"),
        (lambda: sky.Local(pythn="x"), "pythn"),  # type: ignore[call-arg]
    ],
)
def test_bad_configuration_names_the_field(make: object, field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        make()  # type: ignore[operator]
    assert not worker_processes()


def test_duplicate_and_unpicklable_plugins_are_refused_at_construction() -> None:
    with pytest.raises(pydantic.ValidationError, match="listed more than once"):
        sky.ComputePool(plugins=[sky.Plugin(name="a"), sky.Plugin(name="a")])
    lock = threading.Lock()

    @contextlib.contextmanager
    def holds_lock(info: sky.InstanceInfo) -> Iterator[None]:
        with lock:
            yield

    with pytest.raises(sky.PluginError, match="plugin 'locky' cannot be pickled"):
        sky.ComputePool(plugins=[sky.Plugin(name="locky", around_app=holds_lock)])


def test_transforms_run_in_order_at_construction() -> None:
    def add(var: str) -> sky.Plugin:
        return sky.Plugin(
            name=var,
            transform=lambda image, spec: image.with_env(
                {"ORDER": image.env.get("ORDER", "") + var}
            ),
        )

    pool = sky.ComputePool(nodes=1, plugins=[add("a"), add("b")])
    assert pool.image.env["ORDER"] == "ab"
    with pool:
        assert pool.run(getenv, "ORDER") == "ab"


def test_missing_requirements_are_listed_with_an_install_command() -> None:
    image = sky.Image(pip=["pytest", "surely-not-installed-pkg>=1", "pydantic>=999"])
    pool = sky.ComputePool(image=image)
    with pytest.raises(sky.BootstrapError) as caught:
        pool.start()
    message = str(caught.value)
    assert "surely-not-installed-pkg>=1 (not installed)" in message
    assert "pydantic>=999 (installed: " in message
    assert "pytest" not in message.split("lacks:")[1].split("Install")[0]
    assert "-m pip install" in message
    assert not worker_processes()


def test_image_env_reaches_the_workers(make_pool: PoolFactory) -> None:
    image = sky.Image(env={"SKYWARD_TEST_VALUE": "42"})
    with make_pool(nodes=2, image=image) as pool:
        assert pool.broadcast(getenv, "SKYWARD_TEST_VALUE") == ["42", "42"]


# ── concurrency ──────────────────────────────────────────────────────────────────────────


def _append(path: str, item: int) -> int:
    with open(path, "a") as f:
        f.write(f"{item}\n")
    return item


def test_concurrency_one_keeps_calls_on_a_node_in_submission_order(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    path = str(tmp_path / "order")
    with make_pool(nodes=1) as pool:
        futures = [pool.submit(_append, path, i) for i in range(50)]
        assert [f.result(timeout=30) for f in futures] == list(range(50))
    assert Path(path).read_text().split() == [str(i) for i in range(50)]


@pytest.mark.timeout(60)
def test_concurrency_two_runs_two_calls_at_once_on_one_node(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    def meet(me: str, other: str) -> str:
        Path(me).touch()
        deadline = time.monotonic() + 20
        while not Path(other).exists():
            if time.monotonic() > deadline:
                return "alone"
            time.sleep(0.01)
        return "met"

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with make_pool(nodes=1, concurrency=2) as pool:
        both = (sky.compute(meet)(a, b) & sky.compute(meet)(b, a)) >> pool
    assert both == ("met", "met")
