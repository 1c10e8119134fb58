"""The live metrics in a real Jupyter kernel (nbclient): an HTML table with a line per node
in the cell that started the pool, updated in place while calls run in other cells."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

CELLS = [
    "import time, skyward as sky\n"
    "image = sky.Image(metrics=[sky.metrics.CPU(interval=0.3), sky.metrics.Memory(interval=0.3)])\n"
    "pool = sky.ComputePool(nodes=2, image=image).start()",
    "@sky.compute\n"
    "def work(seconds):\n"
    "    start = time.time()\n"
    "    while time.time() - start < seconds:\n"
    "        pass\n"
    "    return sky.instance_info().node\n"
    "work(1.5) @ pool",
    "time.sleep(1.0)\npool.close()",
]


@pytest.mark.timeout(180)
def test_the_notebook_shows_a_line_per_node_in_the_cell_that_started_the_pool(
    tmp_path: Path,
) -> None:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    client = NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    start, run, close = notebook.cells
    assert run.outputs[-1]["data"]["text/plain"] == "[0, 1]"
    shown = [o for o in start.outputs if o.output_type == "display_data"]
    metrics = [o for o in shown if "<table><tr><td><b>node 0</b>" in o["data"]["text/html"]]
    assert len(metrics) == 1, shown  # one display, updated in place
    text = metrics[0]["data"]["text/plain"]
    assert text.splitlines()[0].startswith("node 0  cpu") and "mem" in text
    assert text.splitlines()[1].startswith("node 1  cpu")
    assert not [o for o in close.outputs + run.outputs if o.output_type == "error"]
