"""Ctrl-C while a pool closes (or starts) hurries it, and never cuts the machines' deletion
in half.

A real client process closes a pool whose workers are slow to leave a plugin's context (its
exit sleeps far longer than any test waits) and whose provider's deletion is held until the
test lets it go, as a cloud's delete that takes a minute. The first Ctrl-C during the close
kills the workers at once instead of waiting ``shutdown_timeout`` for them, while the
deletion still completes; a second one, while the deletion runs, leaves the close at once,
naming what is still being deleted and the ``skyward down`` command that finishes it. A
Ctrl-C while workers are still entering their plugins (jax's initialize) kills them at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from support.dispositions import as_from_a_terminal

_CLIENT = """
import contextlib, os, sys, time
from pathlib import Path

import skyward as sky
from skyward.providers.base import Allocation, Resource

here = Path(sys.argv[1])


@contextlib.contextmanager
def slow_to_leave(info):
    (here / f"worker-{os.getpid()}").touch()
    while (here / "never-ready").exists():  # as a worker inside jax's initialize (C++),
        try:  # which no stop of the worker's can interrupt
            time.sleep(0.05)
        except BaseException:
            pass
    try:
        yield
    finally:
        (here / "leaving").touch()
        time.sleep(3600)


class HeldDeletion(Allocation):
    def release(self):
        (here / "deleting").touch()
        while not (here / "go").exists():
            time.sleep(0.05)
        (here / "deleted").touch()


class Held:
    kind = "held"

    def check(self, request):
        pass

    def provision(self, request, reporter):
        nodes = sky.Local().provision(request, reporter).nodes
        return HeldDeletion(nodes, [Resource("firewall rule", "skyward-ctrl-c-ssh")])

    def inventory(self):
        return None


pool = sky.ComputePool(
    provider=Held(),
    nodes=2,
    name="ctrl-c-close",
    plugins=[sky.Plugin(name="slow-to-leave", around_app=slow_to_leave)],
    shutdown_timeout=3000,  # far longer than any wait here: only a Ctrl-C can end it
    console="plain",
).start()
print("READY", flush=True)
pool.close()
"""


def _client(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    script = tmp_path / "client.py"
    script.write_text(_CLIENT)
    log = tmp_path / "client.log"
    with open(log, "wb") as out:  # signalled as from a terminal, however this run started
        client = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=as_from_a_terminal,
        )
    return client, log


def _wait_for(check: Callable[[], bool], what: str, log: Path, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"{what}: not within {timeout:g} s\n{log.read_text()}"
        time.sleep(0.05)


def _workers(tmp_path: Path) -> list[int]:
    return [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _ended(client: subprocess.Popen[bytes], log: Path) -> int:
    try:
        return client.wait(120)
    except subprocess.TimeoutExpired as exc:
        client.kill()
        client.wait(30)
        raise AssertionError(f"the client did not end:\n{log.read_text()}") from exc


def _end(client: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """The client, and its workers should a failure have left them in their long exit."""
    client.kill()
    client.wait(30)
    for pid in _workers(tmp_path):
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_ctrl_c_while_workers_are_slow_to_leave_kills_them_and_still_deletes(
    tmp_path: Path,
) -> None:
    (tmp_path / "go").touch()  # the deletion is not held here
    client, log = _client(tmp_path)
    try:
        _wait_for(lambda: (tmp_path / "leaving").exists(), "the close began", log)
        workers = _workers(tmp_path)
        assert len(workers) == 2, log.read_text()
        client.send_signal(signal.SIGINT)
        # Before: the close waited the whole shutdown_timeout (3000 s) for the workers.
        status = _ended(client, log)
    finally:
        _end(client, tmp_path)
    assert status == -signal.SIGINT, log.read_text()  # the Ctrl-C still reached the program
    assert (tmp_path / "deleted").exists(), log.read_text()
    _wait_for(lambda: not any(map(_alive, workers)), "the workers were killed", log, 30)


def test_a_second_ctrl_c_while_the_deletion_runs_leaves_naming_it_and_skyward_down(
    tmp_path: Path,
) -> None:
    client, log = _client(tmp_path)
    try:
        _wait_for(lambda: (tmp_path / "leaving").exists(), "the close began", log)
        workers = _workers(tmp_path)
        client.send_signal(signal.SIGINT)  # the first: kill the workers, go on to delete
        _wait_for(lambda: (tmp_path / "deleting").exists(), "the deletion began", log)
        client.send_signal(signal.SIGINT)  # the second: leave now
        _wait_for(lambda: "still being deleted" in log.read_text(), "the second left", log)
        said = log.read_text()
        assert not (tmp_path / "deleted").exists()  # it left while the deletion was held
        assert "firewall rule skyward-ctrl-c-ssh" in said, said
        assert "`skyward down --pool ctrl-c-close`" in said, said
        # The deletion goes on: the interpreter waits for it before it exits.
        (tmp_path / "go").touch()
        status = _ended(client, log)
    finally:
        _end(client, tmp_path)
    assert status == -signal.SIGINT, log.read_text()
    assert (tmp_path / "deleted").exists(), log.read_text()
    _wait_for(lambda: not any(map(_alive, workers)), "the workers were killed", log, 30)


def test_a_ctrl_c_while_workers_enter_their_plugins_kills_them_at_once(tmp_path: Path) -> None:
    (tmp_path / "go").touch()
    (tmp_path / "never-ready").touch()  # the workers stay inside their plugins' start
    client, log = _client(tmp_path)
    try:
        _wait_for(lambda: len(_workers(tmp_path)) == 2, "the workers entered the plugin", log)
        workers = _workers(tmp_path)
        client.send_signal(signal.SIGINT)
        # Before: the close waited shutdown_timeout (3000 s) for workers that were never
        # going to read its Shutdown.
        status = _ended(client, log)
    finally:
        _end(client, tmp_path)
    assert status == -signal.SIGINT, log.read_text()
    assert (tmp_path / "deleted").exists(), log.read_text()
    _wait_for(lambda: not any(map(_alive, workers)), "the workers were killed", log, 30)
