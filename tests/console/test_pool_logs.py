"""Logs that stay: a pool's events and every node's output are written to a directory of its
own, read back by ``skyward logs``, bounded in size, and never hold a secret."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import skyward as sky
from skyward.console import logs as pool_logs

SCRIPT = Path(sys.executable).parent / "skyward"


@pytest.fixture(autouse=True)
def log_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "logs"
    monkeypatch.setenv("SKYWARD_LOG_DIR", str(root))
    return root


@sky.compute
def say(text: str) -> str:
    import os
    import sys

    print(text)
    print(f"to stderr: {text}", file=sys.stderr)
    return os.environ.get("HF_TOKEN", "")


def test_a_pools_output_and_events_stay_in_its_log_directory(log_root: Path) -> None:
    with sky.ComputePool(nodes=2, console="off", output="none", name="logged") as pool:
        say("hello from a node") @ pool
        directory = pool.log_dir
    assert directory is not None and directory.parent == log_root
    for node in (0, 1):
        text = (directory / f"node-{node}.log").read_text()
        assert "out| hello from a node" in text  # output="none" hides it, the log keeps it
        assert "err| to stderr: hello from a node" in text
    events = (directory / "events.log").read_text()
    assert "pool logged ready" in events and "pool closed" in events
    meta = json.loads((directory / "pool.json").read_text())
    assert meta["state"] == "closed" and meta["nodes"] == 2 and meta["provider"] == "local"


def test_secret_values_of_the_image_never_reach_the_logs(log_root: Path) -> None:
    secret = "hf_Zq9secretvalue123"
    image = sky.Image(env={"HF_TOKEN": secret})
    with sky.ComputePool(nodes=1, console="off", image=image, name="secretive") as pool:
        assert (say(f"the token is {secret}") >> pool) == secret  # the worker has it
    written = "".join(p.read_text() for p in log_root.rglob("*") if p.is_file())
    assert "the token is ***" in written
    assert secret not in written
    assert "PRIVATE KEY" not in written


def test_skyward_logs_reads_a_finished_pool_by_name_and_node(log_root: Path) -> None:
    with sky.ComputePool(nodes=2, console="off", name="readable") as pool:
        say("line for the cli") @ pool
    # Another pool whose name, state and provider are of other widths: the columns align.
    with sky.ComputePool(nodes=1, console="off", name="a-much-longer-pool-name") as pool:
        say("x") @ pool
    env = {**os.environ, "SKYWARD_LOG_DIR": str(log_root)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), "logs", *args], capture_output=True, text=True, env=env, timeout=60
        )

    one = cli("readable", "--node", "1")
    assert one.returncode == 0, one.stderr
    assert "out| line for the cli" in one.stdout and "node-0" not in one.stdout
    everything = cli()
    assert "events:" in everything.stdout and "node-0:" in everything.stdout
    listing = cli("--list")
    assert "readable" in listing.stdout and "closed" in listing.stdout
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["POOL", "STATE", "PROVIDER", "NODES", "STARTED", "LOGS"]
    columns = [line.index(str(log_root)) for line in lines[1:]]
    assert len(columns) == 2 and len(set(columns)) == 1, listing.stdout  # aligned
    missing = cli("no-such-pool")
    assert (
        missing.returncode != 0
        and "recent pools: a-much-longer-pool-name, readable" in missing.stderr
    )
    absent = cli("readable", "--node", "7")
    assert absent.returncode != 0 and "has no output from node 7" in absent.stderr


def test_a_killed_clients_pool_is_listed_as_gone(log_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, skyward as sky
            pool = sky.ComputePool(nodes=1, console="off", name="killed").start()
            print("ready", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
    )
    env = {**os.environ, "SKYWARD_LOG_DIR": str(log_root)}
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == -signal.SIGKILL and "ready" in result.stdout
    [meta] = [m for m in pool_logs.recent_pools(log_root) if m["name"] == "killed"]
    assert meta["state"] == "gone"


def test_log_files_are_bounded_and_old_pools_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_logs, "MAX_BYTES", 2000)
    monkeypatch.setattr(pool_logs, "KEEP_POOLS", 3)
    log = pool_logs.PoolLog.open("big", meta={})
    assert log is not None
    for i in range(500):
        log.output(0, "stdout", [f"line {i:04d} ".encode() * 4])
    log.close()
    sizes = [p.stat().st_size for p in log.directory.glob("node-0.log*")]
    assert len(sizes) == 2 and max(sizes) < 2000 + 200  # the live file and one rotation
    for i in range(5):
        opened = pool_logs.PoolLog.open(f"p{i}", meta={})
        assert opened is not None
        opened.close()
    assert len([p for p in log.directory.parent.iterdir() if p.is_dir()]) <= 3


def test_a_log_directory_that_cannot_be_written_leaves_the_pool_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the log root should be")
    monkeypatch.setenv("SKYWARD_LOG_DIR", str(blocked))
    with sky.ComputePool(nodes=1, console="off") as pool:
        assert pool.log_dir is None
        assert (say("still runs") >> pool) == ""
