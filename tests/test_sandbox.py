"""The sandbox that stand-in VMs and the watchdog run in: whatever is run inside to stop the
machine ends the sandbox instead, and says so; outside a sandbox the shim does nothing.

These run before anything else relies on the sandbox (the stand-ins' watchdogs really call
``poweroff``)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psutil
import pytest
from support.sandbox import GUARDED, Sandbox, prelude, shim_script

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("command", "state"),
    [
        ("poweroff", "poweroff"),
        ("/sbin/poweroff", "poweroff"),
        ("/usr/sbin/poweroff", "poweroff"),
        ("poweroff -f", "poweroff"),
        ("shutdown -h now", "poweroff"),
        ("/sbin/shutdown -P +1", "poweroff"),
        ("halt -p", "poweroff"),
        ("systemctl poweroff", "poweroff"),
        ("reboot", "reboot"),
        ("shutdown -r now", "reboot"),
    ],
)
def test_stopping_the_machine_inside_ends_only_the_sandbox(
    tmp_path: Path, command: str, state: str
) -> None:
    sandbox = Sandbox(tmp_path / "box", f"{command}\necho still-running\nsleep 30\n")
    try:
        assert sandbox.wait(20) == 0
        assert sandbox.power_state() == state
        assert "still-running" not in (tmp_path / "box" / "sandbox.log").read_text()
    finally:
        sandbox.stop()


def test_every_guarded_path_inside_is_the_shim(tmp_path: Path) -> None:
    report = tmp_path / "report"
    paths = " ".join(p for p in GUARDED if Path(p).exists())
    script = f'for p in {paths}; do cmp -s "$0" "$p" || echo "$p"; done > {report}\n'
    # $0 is main.sh, not the shim: compare with the shim by path instead.
    script = script.replace('"$0"', str(tmp_path / "box" / "shim"))
    sandbox = Sandbox(tmp_path / "box", script)
    try:
        assert sandbox.wait(20) == 0
        assert report.read_text() == ""
        assert paths  # this machine has some of them
    finally:
        sandbox.stop()


def test_systemctl_other_verbs_fail_without_stopping_anything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = f"systemctl reload ssh; echo status=$? > {out}\n"
    sandbox = Sandbox(tmp_path / "box", script)
    try:
        assert sandbox.wait(20) == 0
        assert out.read_text().strip() == "status=1"
        assert sandbox.power_state() == ""
    finally:
        sandbox.stop()


def test_the_shim_refuses_in_the_pid_namespace_it_was_told_is_the_hosts(tmp_path: Path) -> None:
    # The "host" here is a throwaway PID namespace: the shim is told that namespace is the
    # host's, and must refuse there. Were the check broken, its `kill 1` would reach only the
    # throwaway namespace's PID 1, never this machine's.
    state = tmp_path / "state"
    template = tmp_path / "shim.in"
    template.write_text(shim_script(state, "@HOST@"))
    shim = tmp_path / "poweroff"
    script = (
        f'sed "s|@HOST@|$(readlink /proc/self/ns/pid)|" {template} > {shim}; chmod +x {shim}; '
        f"{shim}; echo status=$?"
    )
    isolated = ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]
    done = subprocess.run(
        [*isolated, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert "status=3" in done.stdout, done
    assert "refusing" in done.stderr
    assert not state.exists()


def test_the_prelude_refuses_unless_it_is_pid_1(tmp_path: Path) -> None:
    # In a private mount namespace, so that even a broken check could not touch the host's
    # mounts; not PID 1 there, so it must stop before mounting anything.
    shim, state = tmp_path / "shim", tmp_path / "state"
    shim.write_text("#!/bin/sh\n")
    script = prelude(shim, state) + "echo reached-the-end\n"
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 70, done
    assert "reached-the-end" not in done.stdout


def test_stopping_a_sandbox_from_outside_kills_everything_in_it(tmp_path: Path) -> None:
    started = tmp_path / "started"
    sandbox = Sandbox(tmp_path / "box", f"sleep 300 & touch {started}; wait\n")
    try:
        for _ in range(400):
            if started.exists():
                break
            time.sleep(0.05)
        inside = psutil.Process(sandbox.process.pid).children(recursive=True)
        assert any("sleep" in p.name() for p in inside)
    finally:
        sandbox.stop()
    assert sandbox.power_state() == ""
    _, alive = psutil.wait_procs(inside, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
