"""The live metrics lines as a terminal shows them: a real pseudo-terminal (pexpect), so
rich sees a terminal and draws the lines under the workers' output, one per node."""

from __future__ import annotations

import io
import os
import re
import sys
import textwrap
from pathlib import Path

import pexpect
import pytest

PROGRAM = textwrap.dedent(
    """
    import time, skyward as sky

    @sky.compute
    def work(seconds):
        start = time.time()
        while time.time() - start < seconds:
            pass
        print("step done", flush=True)

    image = sky.Image(metrics=[sky.metrics.CPU(interval=0.3), sky.metrics.Memory(interval=0.3)])
    with sky.ComputePool(nodes=2, image=image) as pool:
        work(1.5) @ pool
        time.sleep(1.0)
        print("MARK", flush=True)
        time.sleep(1.0)
    print("CLOSED", flush=True)
    """
)


@pytest.mark.timeout(90)
def test_each_node_has_a_live_line_under_the_output_on_a_terminal(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    seen = io.StringIO()
    child = pexpect.spawn(
        sys.executable,
        [str(script)],
        dimensions=(30, 120),
        encoding="utf-8",
        timeout=60,
        env={**os.environ, "TERM": "xterm-256color", "SKYWARD_LOG_DIR": str(tmp_path)},
    )
    child.logfile_read = seen
    child.expect("CLOSED")
    child.expect(pexpect.EOF)
    child.close()
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.getvalue())
    assert child.exitstatus == 0, screen[-2000:]
    assert "[node 0] step done" in screen and "[node 1] step done" in screen
    for node in (0, 1):
        assert re.search(rf"node {node}\s+cpu\s+\d+%\s+mem\s+\d+%", screen), screen[-2000:]
