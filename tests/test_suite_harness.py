"""The suite's own harness: one leaked pool fails one test, the leak check claims no other
test process's workers, a run started in the background (``cmd &``, ``nohup``) passes the
signal tests as a run from a terminal does, and the test bridge stays reachable as stand-in
machines join and leave it.

The first two run pytest in a child process over a few test files and read its report."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from support.processes import our_namespaces, worker_processes
from support.sshhosts import USER, Hosts

_TESTS = Path(__file__).resolve().parent

_LEAKY = """
import time
import skyward as sky

leaked = []


def test_that_leaks_a_pool():
    leaked.append(sky.ComputePool(name="leaky", quiet=True).start())  # never closed


def test_after_the_leak():
    # The leaked pool is closed by now; a check that only killed its worker would have had
    # the pool replace it, and found the replacement after this test and every later one.
    pool = leaked[0]
    while pool.statistics().state != "closed" and pool.statistics().workers_replaced == 0:
        time.sleep(0.05)
    assert pool.statistics().state == "closed"


def test_with_a_pool_of_its_own():
    with sky.ComputePool(quiet=True) as pool:
        assert pool.run(sum, [1, 2]) == 3
"""


def _pytest(
    *args: str, cwd: Path, ignoring: tuple[int, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """pytest over ``args`` in a child process that starts with ``ignoring`` ignored, in
    ``env`` (default: this process's)."""

    def launched() -> None:
        for signum in ignoring:
            signal.signal(signum, signal.SIG_IGN)

    path = os.pathsep.join(p for p in (str(_TESTS), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**(os.environ if env is None else env), "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=400,
        preexec_fn=launched,
    )


@pytest.mark.timeout(240)
def test_a_leaked_pool_fails_the_test_that_leaked_it_and_no_other(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 120\n")
    (tmp_path / "test_leaky.py").write_text(_LEAKY)
    run = _pytest("-p", "support.leaks", "-rE", "test_leaky.py", cwd=tmp_path)
    report = run.stdout + run.stderr
    assert re.search(r"\b3 passed, 1 error\b", report), report
    assert "ERROR test_leaky.py::test_that_leaks_a_pool" in report, report
    assert "'leaky' (running, started during test_leaky.py::test_that_leaks_a_pool)" in report


def _start_fake_worker(netns: str) -> int:
    """A process of the test user in ``netns`` that reads as a worker, detached from this one
    (as a worker another test process's pool started there would be); its pid."""
    name = f"python -m skyward.worker --node 0 --harness {netns} {uuid.uuid4().hex}"
    subprocess.run(
        ["ip", "netns", "exec", netns, "setsid", "-f", "runuser", "-u", USER, "--",
         "bash", "-c", f"exec -a '{name}' sleep 120"],
        check=True,
        timeout=30,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline", "username"]):
            command = " ".join(process.info["cmdline"] or ())
            if process.info["username"] == USER and command.startswith(name):
                return int(process.pid)
        time.sleep(0.05)
    raise AssertionError(f"the fake worker in {netns} did not start")


@pytest.mark.timeout(120)
def test_the_leak_check_claims_no_worker_in_a_namespace_that_took_a_deleted_ones_number(
    ssh_hosts: Hosts,
) -> None:
    # Once a namespace is deleted, the kernel gives its inode number to the next one anyone
    # makes (within a second, here). Kept as "ours" by number, the entry claimed another
    # xdist worker's stand-ins: this process's leak check killed a killed-client test's
    # workers there, and that test's pool started new ones after every later test.
    gone, other = f"skyward-{ssh_hosts.tag}-gone", f"skyward-{ssh_hosts.tag}-other"
    undo_gone, undo_other = ("ip", "netns", "del", gone), ("ip", "netns", "del", other)
    ssh_hosts.make(("ip", "netns", "add", gone), undo_gone)
    our_namespaces.add(gone)
    inode = os.stat(f"/run/netns/{gone}").st_ino
    worker = None
    try:
        ssh_hosts.remove(undo_gone)
        assert inode not in our_namespaces.live().values()
        # The same number in a namespace not ours, when the kernel hands it out again within
        # 20 s (another process may take it first: then the number is someone else's, and
        # the check above is what holds).
        deadline = time.monotonic() + 20
        while True:
            ssh_hosts.make(("ip", "netns", "add", other), undo_other)
            if os.stat(f"/run/netns/{other}").st_ino == inode or time.monotonic() > deadline:
                break
            ssh_hosts.remove(undo_other)
            time.sleep(0.3)
        worker = _start_fake_worker(other)
        assert worker not in [p.pid for p in worker_processes()]
        our_namespaces.add(other)  # and once it is ours, the same process is found
        assert worker in [p.pid for p in worker_processes()]
    finally:
        our_namespaces.discard(gone, other)
        if worker is not None:
            os.kill(worker, signal.SIGKILL)
        ssh_hosts.remove(undo_other)


@pytest.mark.timeout(420)
def test_a_run_started_with_sigint_and_sighup_ignored_passes_the_signal_tests() -> None:
    # What `nohup python -m pytest ... &` gives the run: SIGINT and SIGHUP ignored, inherited
    # by every process it starts. Tests that interrupt this process, signal a pool's own
    # handlers, or signal a client they started must not depend on it.
    chosen = [
        "client/test_interrupts.py::test_a_hold_delays_ctrl_c_to_its_end_and_lets_it_through_where_allowed",
        "client/test_interrupts.py::test_ctrl_c_while_waiting_for_a_submitted_future_leaves_it_to_settle",
        "link/test_turns.py::test_ctrl_c_while_a_caller_waits_leaves_the_pool_working",
        "faults/test_signals.py::test_handlers_are_installed_while_a_pool_is_open_and_restored_after",
        "faults/test_signals.py::test_an_ignored_signal_stays_ignored_and_a_users_handler_is_called",
        "faults/test_signals.py::test_sigterm_in_a_local_pool_raises_terminated_and_closes_it",
        "providers/gcp/test_gcp.py::test_a_client_ended_by_a_signal_at_any_stage_leaves_nothing",
    ]
    ignored = (signal.SIGINT, signal.SIGHUP)
    run = _pytest("-p", "no:xdist", *chosen, cwd=_TESTS, ignoring=ignored)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    assert re.search(r"\b10 passed\b", report), report[-6000:]


def _reaches(netns: str, address: str, port: int) -> bool:
    """Whether a TCP connection from namespace ``netns`` to ``address:port`` opens in 10 s."""
    code = f"import socket; socket.create_connection(({address!r}, {port}), timeout=10)"
    done = subprocess.run(
        ["ip", "netns", "exec", netns, "/usr/bin/python3", "-c", code],
        capture_output=True,
        timeout=60,
    )
    return done.returncode == 0


def test_the_bridge_stays_reachable_when_a_port_with_the_lowest_mac_joins_and_leaves(
    ssh_hosts: Hosts,
) -> None:
    # A stand-in VM's port with a lower MAC than the rest, as a random one can be. A bridge
    # whose address followed its ports' would take it, then another when the port left: the
    # hosts' ARP entries for the bridge address would name a MAC nobody has (for ~30 s).
    bridge = Path(f"/sys/class/net/{ssh_hosts.bridge}/address")
    host = ssh_hosts.hosts[0]
    with socket.create_server((ssh_hosts.bridge_address, 0)) as server:
        port = server.getsockname()[1]
        assert _reaches(host.netns, ssh_hosts.bridge_address, port)  # its ARP entry made
        before = bridge.read_text()
        veth = f"skv{ssh_hosts.tag}t{ssh_hosts.join_index()}"
        undo = ("ip", "link", "del", veth)
        ssh_hosts.make(
            ("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"), undo
        )
        try:
            subprocess.run(["ip", "link", "set", veth, "address", "02:00:00:00:00:01"], check=True)
            subprocess.run(["ip", "link", "set", veth, "master", ssh_hosts.bridge], check=True)
            assert bridge.read_text() == before
        finally:
            ssh_hosts.remove(undo)
        assert bridge.read_text() == before
        assert _reaches(host.netns, ssh_hosts.bridge_address, port)


@pytest.mark.timeout(300)
def test_a_passing_run_leaves_no_log_directory_behind(tmp_path: Path) -> None:
    # A run of its own, as `.ci/run` starts one: no SKYWARD_LOG_DIR given, temporary files
    # where this test can look. Its pools' logs and the MPS plugin's node directories go.
    env = {k: v for k, v in os.environ.items() if k != "SKYWARD_LOG_DIR"}
    env["TMPDIR"] = str(tmp_path)
    chosen = [
        "console/test_pool_logs.py::test_a_pools_output_and_events_stay_in_its_log_directory",
        "plugins/test_plugin_nvidia.py::test_mps_starts_the_daemon_before_the_workers_code_and_quits_it_after",
    ]
    run = _pytest("-p", "no:xdist", *chosen, cwd=_TESTS, env=env)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-4000:]
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("skyward"))
    mps = tmp_path / "skyward-mps"
    assert [name for name in left if name != "skyward-mps"] == [], left
    assert not mps.exists() or not any(mps.iterdir()), list(mps.iterdir())
