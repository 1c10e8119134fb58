"""The progress display and output options: plain, rich on a real terminal, off, the logger."""

from __future__ import annotations

import dataclasses
import logging
import os
import pty
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pydantic
import pytest
from support.pools import ssh_provider
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.client.phases import Choice
from skyward.console import Console
from skyward.console.progress import Board

STAMP = r"\d\d:\d\d:\d\d skyward: "


def _node() -> int:
    node = sky.instance_info().node
    print(f"output of node {node}")
    return node


def test_plain_mode_writes_one_timestamped_line_per_event(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sky.ComputePool(nodes=2, console="plain", name="plain-pool") as pool:
        pool.broadcast(_node)
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(STAMP + r"starting 2 node\(s\) on local \(pool plain-pool\)", err[0])
    for node in (0, 1):
        assert any(re.fullmatch(STAMP + f"node {node} starting", line) for line in err)
        assert any(re.fullmatch(STAMP + rf"node {node} ready: pid \d+", line) for line in err)
    summary = STAMP + r"pool plain-pool ready: 2 node\(s\), no accelerator, in [\d.]+ s"
    assert re.fullmatch(summary, err[-1]) or any(re.fullmatch(summary, x) for x in err)
    assert not any("\x1b[" in line for line in err), "plain mode never writes escape codes"


@pytest.mark.timeout(240)
def test_plain_mode_shows_ssh_nodes_connecting_and_their_bootstrap_lines(
    capsys: pytest.CaptureFixture[str], ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    marker = f"bootstrap-says-{uuid.uuid4().hex[:8]}"  # a new image: its script really runs
    image = sky.Image(index_url=package_index.url, setup=[f"echo {marker}"])
    provider = ssh_provider(ssh_hosts)
    with sky.ComputePool(
        provider=provider, nodes=2, image=image, console="plain", name="ssh-plain"
    ) as pool:
        pool.broadcast(_node)
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(STAMP + r"starting 2 node\(s\) on ssh \(pool ssh-plain\)", err[0])
    for node, host in enumerate(ssh_hosts.hosts[:2]):
        lines = [line for line in err if re.match(STAMP + f"node {node}[ :|]", line)]
        events = [re.sub(STAMP, "", line) for line in lines]
        connecting = events.index(f"node {node} connecting: {host.target}")
        booting = next(
            i for i, e in enumerate(events) if e.startswith(f"node {node} bootstrapping: image ")
        )
        said = events.index(f"node {node} | {marker}")  # the script's own output, as it ran
        starting = events.index(f"node {node} starting")
        ready = next(i for i, e in enumerate(events) if e.startswith(f"node {node} ready"))
        assert connecting < booting < said < starting < ready, events
    assert any(re.fullmatch(STAMP + r"pool ssh-plain ready: 2 node\(s\).*", line) for line in err)


def test_auto_mode_off_a_terminal_is_plain() -> None:
    code = (
        "import skyward as sky\n"
        "with sky.ComputePool(nodes=1, name='piped') as pool:\n"
        "    pool.run(print, 'hi')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert re.search(STAMP + r"pool piped ready", result.stderr)
    assert result.stdout == "[node 0] hi\n"


def _run_in_terminal(code: str, stdout: Path | None = None) -> str:
    """Run ``code`` with stderr, and stdout unless it goes to the file ``stdout``, on a real
    pseudo-terminal; return what it drew."""
    controller, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"TERM": "xterm"}
    out = stdout.open("wb") if stdout is not None else terminal
    process = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=terminal, env=env)
    if stdout is not None:
        out.close()  # type: ignore[union-attr]
    os.close(terminal)
    screen = b""
    while True:
        try:
            chunk = os.read(controller, 1 << 16)
        except OSError:  # EIO: the process closed its end of the terminal
            break
        if not chunk:
            break
        screen += chunk
    os.close(controller)
    assert process.wait(timeout=60) == 0, screen.decode(errors="replace")
    return screen.decode(errors="replace")


@pytest.mark.timeout(90)
def test_on_a_terminal_a_live_table_shows_nodes_and_labels_are_coloured() -> None:
    screen = _run_in_terminal(
        "import skyward as sky\n"
        "with sky.ComputePool(nodes=2, name='tty-pool') as pool:\n"
        "    pool.broadcast(lambda: print('hello', sky.instance_info().node))\n"
    )
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    assert "starting 2 node(s) on local (pool tty-pool)" in plain
    assert re.search(r"✔\s+node 0\s+ready\s+[\d.]+s\s+pid \d+", plain)
    assert re.search(r"✔\s+node 1\s+ready\s+[\d.]+s\s+pid \d+", plain)
    assert "skyward: pool tty-pool ready: 2 node(s)" in plain
    # each node's label in its own colour
    assert "\x1b[36m[node 0]\x1b[0m hello 0" in screen
    assert "\x1b[33m[node 1]\x1b[0m hello 1" in screen


@pytest.mark.timeout(90)
def test_output_printed_while_the_table_is_live_keeps_its_lines_whole() -> None:
    # A plugin prints a line wider than the terminal (80 columns) while nodes start.
    screen = _run_in_terminal(
        "import contextlib, skyward as sky\n"
        "@contextlib.contextmanager\n"
        "def chatty(info):\n"
        "    print('x' * 150, 'end', flush=True)\n"
        "    yield\n"
        "plugin = sky.Plugin(name='chatty', around_app=chatty)\n"
        "with sky.ComputePool(nodes=2, name='tty-live', plugins=[plugin]) as pool:\n"
        "    pass\n"
    )
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen).replace("\r", "")
    for node in (0, 1):
        assert f"[node {node}] {'x' * 150} end\n" in plain, plain


@pytest.mark.timeout(90)
def test_with_stdout_in_a_file_worker_stdout_goes_there_even_while_the_table_is_live(
    tmp_path: Path,
) -> None:
    code = (
        "import contextlib, skyward as sky\n"
        "@contextlib.contextmanager\n"
        "def chatty(info):\n"
        "    print('while starting', info.node, flush=True)\n"
        "    yield\n"
        "plugin = sky.Plugin(name='chatty', around_app=chatty)\n"
        "with sky.ComputePool(nodes=2, name='tty-file', plugins=[plugin]) as pool:\n"
        "    pool.broadcast(lambda: print('after start'))\n"
    )
    screen = _run_in_terminal(code, stdout=tmp_path / "out.txt")
    written = (tmp_path / "out.txt").read_text()
    for node in (0, 1):
        assert f"[node {node}] while starting {node}\n" in written  # not coloured: a file
        assert f"[node {node}] after start\n" in written
    assert "while starting" not in screen and "pool tty-file ready" in screen


def test_console_off_still_shows_output_and_logs_to_the_skyward_logger(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="skyward")
    with sky.ComputePool(nodes=2, console="off", name="quiet-pool") as pool:
        pool.broadcast(_node)
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "[node 0] output of node 0" in captured.out
    messages = [r.getMessage() for r in caplog.records if r.name == "skyward"]
    assert "starting 2 node(s) on local (pool quiet-pool)" in messages
    assert any(re.fullmatch(r"node 1 ready: pid \d+", m) for m in messages)
    assert any(m.startswith("pool quiet-pool ready: 2 node(s)") for m in messages)


@pytest.mark.parametrize(("output", "shown"), [("all", [0, 1, 2]), ("head", [0]), ("none", [])])
def test_output_option_chooses_whose_prints_are_shown(
    capsys: pytest.CaptureFixture[str], output: str, shown: list[int]
) -> None:
    with sky.ComputePool(nodes=3, console="off", output=output) as pool:  # type: ignore[arg-type]
        assert pool.broadcast(_node) == [0, 1, 2]
    out = capsys.readouterr().out
    assert sorted(int(n) for n in re.findall(r"\[node (\d)\] output of node", out)) == shown


def test_quiet_cannot_contradict_console() -> None:
    # (that quiet=True prints nothing is test_output's test_progress_is_reported_unless_quiet)
    with pytest.raises(pydantic.ValidationError, match="quiet=True means console='off'"):
        sky.ComputePool(quiet=True, console="rich")
    with pytest.raises(pydantic.ValidationError, match="console"):
        sky.ComputePool(console="fancy")  # type: ignore[arg-type]


_CHOICE = Choice(
    nodes=2,
    machine="p4d.24xlarge",
    hardware="8x A100 40 GB",
    where="us-east-1 (us-east-1b)",
    market="on-demand",
    hourly=21.96,
    fallbacks=3,
)


@pytest.mark.parametrize("mode", ["rich", "plain"])
def test_a_cloud_pools_choice_shows_under_the_title_with_its_price(
    mode: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "120")  # a terminal wide enough for every column
    console = Console(mode=mode)  # type: ignore[arg-type]
    console.begin("starting 2 node(s) on aws (pool priced)", 2)
    console.chosen(_CHOICE)
    console.end("pool priced ready")
    err = capsys.readouterr().err
    assert "p4d.24xlarge" in err and "us-east-1 (us-east-1b)" in err and "on-demand" in err
    if mode == "rich":  # a table: what, where, how many, $/h each and for the pool
        for heading in ("nodes", "machine", "hardware", "where", "$/h each", "$/h pool"):
            assert heading in err
        assert "21.96" in err and "43.92" in err
    else:
        assert "2 x p4d.24xlarge (8x A100 40 GB) on-demand in" in err
        assert "about $43.92/h for the pool (2 x $21.96); then 3 other place(s)" in err


def test_a_choice_without_a_known_price_says_so() -> None:
    unknown = dataclasses.replace(_CHOICE, hourly=None)
    assert unknown.estimate() == "no price known for p4d.24xlarge (on-demand) here"
    board = Board("t", 2)
    board.choice = unknown
    assert board.choice_table()[1][-2:] == ("?", "?")


@pytest.mark.timeout(90)
def test_a_map_longer_than_a_second_shows_a_progress_bar_and_a_short_one_none() -> None:
    screen = _run_in_terminal(
        "import time, skyward as sky\n"
        "def slow(x):\n"
        "    time.sleep(0.05)\n"
        "    return x\n"
        "with sky.ComputePool(nodes=2, name='bar-pool') as pool:\n"
        "    pool.map(abs, range(10))\n"
        "    print('SHORT DONE', flush=True)\n"
        "    pool.map(slow, range(60), chunksize=1)\n"
    )
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    short, long = plain.split("SHORT DONE", 1)
    assert "map abs" not in short  # under a second: no bar
    assert "map slow" in long and "60/60" in long
