"""Skyward inside a real Jupyter kernel: the example notebook, and output routed by call.

Each test starts an ipykernel of this interpreter (nbclient or jupyter_client talk to it over
loopback ZMQ) and shuts it down; the pools live in the kernel, so their workers are the
kernel's children and the leak check still sees them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from support import ROOT
from support.processes import worker_processes
from support.sshhosts import Hosts, PackageIndex

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _stream_text(cell: Any) -> str:
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    return _ANSI.sub("", text)


@pytest.mark.timeout(180)
def test_example_notebook_prints_remote_output_in_the_calling_cell() -> None:
    notebook = nbformat.read(ROOT / "examples" / "notebook.ipynb", as_version=4)
    client = NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "examples")}},
    )
    client.execute()
    code = [c for c in notebook.cells if c.cell_type == "code"]
    start, define, run, helper, awaited, close = code

    assert not _stream_text(define), "defining a function runs nothing"
    printed = _stream_text(run)
    assert "[node 0] squaring 7 on node 0 of 2" in printed
    assert "[node 1] squaring 7 on node 1 of 2" in printed
    assert run.outputs[-1]["data"]["text/plain"] == "[49, 49]"
    # the call's prints are in its own cell, nowhere else
    assert "squaring 7" not in _stream_text(start) + _stream_text(helper)

    assert helper.outputs[-1]["data"]["text/plain"] == "['hello from node 0', 'hello from node 1']"
    assert awaited.outputs[-1]["data"]["text/plain"] == "144"
    assert "squaring 12 on node" in _stream_text(awaited)

    # the progress display ended with the pool's summary in the cell that started it
    shown = [o for o in start.outputs if o.output_type == "display_data"]
    progress = [o for o in shown if o["data"]["text/plain"].startswith("starting")]
    assert progress and "ready: 2 node(s)" in progress[-1]["data"]["text/plain"]
    assert not [o for o in close.outputs if o.output_type == "error"]


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[BlockingKernelClient]:
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(tmp_path))
    client = manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield client
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=False)


def _run(client: BlockingKernelClient, code: str) -> str:
    """Execute ``code`` as a cell; return its message id once the kernel is idle again."""
    msg_id: str = client.execute(code)
    reply = client.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    return msg_id


def _streams(client: BlockingKernelClient) -> list[tuple[str, str]]:
    """(cell message id, text) of every stream message published so far."""
    found = []
    while True:
        try:
            message = client.get_iopub_msg(timeout=2)
        except Exception:  # queue.Empty: nothing more for now
            return found
        if message["msg_type"] == "stream":
            found.append((message["parent_header"].get("msg_id", ""), message["content"]["text"]))


@pytest.mark.timeout(180)
def test_a_calls_output_goes_to_the_cell_that_submitted_it(
    kernel: BlockingKernelClient, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    submitted = _run(
        kernel,
        "import os, time, skyward as sky\n"
        "pool = sky.ComputePool(nodes=1, console='off').start()\n"
        "def late(gate):\n"
        "    while not os.path.exists(gate):\n"
        "        time.sleep(0.01)\n"
        "    print('printed after its cell had finished')\n"
        "    return 'done'\n"
        f"future = pool.submit(late, {str(gate)!r})\n",
    )
    # The call prints while another cell runs; that cell must not receive it.
    waiting = _run(
        kernel, f"open({str(gate)!r}, 'w').close()\nprint('waiting:', future.result(timeout=60))"
    )
    _run(kernel, "pool.close()")
    streams = _streams(kernel)
    late = [cell for cell, text in streams if "printed after its cell had finished" in text]
    assert late == [submitted], streams
    assert (waiting, "waiting: done\n") in streams


@pytest.mark.timeout(180)
def test_re_running_cells_keeps_the_live_pool_and_uses_the_new_definitions(
    kernel: BlockingKernelClient,
) -> None:
    start = (
        "import os, skyward as sky\n"
        "if 'pool' not in globals():\n"
        "    pool = sky.ComputePool(nodes=2, console='off').start()\n"
        "print('workers', sorted(pool.broadcast(os.getpid)))\n"
    )
    first = _run(kernel, start)
    _run(kernel, "@sky.compute\ndef answer():\n    return 'first'\nprint('got', answer() @ pool)")
    _run(kernel, "@sky.compute\ndef answer():\n    return 'second'\nprint('got', answer() @ pool)")
    again = _run(kernel, start)  # the guarded pool cell, run a second time
    _run(kernel, "pool.close()")
    streams = _streams(kernel)
    printed = "".join(text for _, text in streams)
    assert "got ['first', 'first']" in printed and "got ['second', 'second']" in printed
    workers = {cell: text for cell, text in streams if text.startswith("workers")}
    assert workers[first] == workers[again], "the same two workers served both runs"


@pytest.mark.timeout(180)
def test_a_remote_traceback_shows_the_lines_of_the_cell(kernel: BlockingKernelClient) -> None:
    # A cell's lines live only in the kernel's linecache, under a file name that exists
    # nowhere: the worker gets them with the function.
    _run(kernel, "import skyward as sky\npool = sky.ComputePool(nodes=1, console='off').start()")
    _run(kernel, "@sky.compute\ndef broken(key):\n    return {'a': 1}[key]  # the failing line\n")
    _run(
        kernel,
        "try:\n    broken('b') >> pool\nexcept KeyError as e:\n    print(e.__cause__.traceback)\n",
    )
    _run(kernel, "pool.close()")
    printed = "".join(text for _, text in _streams(kernel))
    assert re.search(r'File ".+", line 3, in broken\n', printed), printed
    assert "    return {'a': 1}[key]  # the failing line\n" in printed, printed
    assert "<dynamic-code>" not in printed


@pytest.mark.timeout(180)
def test_stopping_the_kernel_closes_an_open_pool(kernel: BlockingKernelClient) -> None:
    _run(kernel, "import skyward as sky\npool = sky.ComputePool(nodes=2, console='off').start()")
    assert len(worker_processes()) == 2
    kernel.shutdown()  # a graceful shutdown: the kernel's interpreter exits normally
    deadline = time.monotonic() + 30
    while worker_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert worker_processes() == []


@pytest.mark.timeout(300)
def test_a_helper_module_beside_the_notebook_reaches_ssh_workers_by_value(
    kernel: BlockingKernelClient, tmp_path: Path, ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    # The remote hosts have no nb_helper: only a copy sent by value can run there.
    (tmp_path / "nb_helper.py").write_text("def triple(x):\n    return 3 * x\n")
    hosts = [h.target for h in ssh_hosts.hosts[:2]]
    _run(
        kernel,
        "import skyward as sky\n"
        "from nb_helper import triple\n"
        f"ssh = sky.SSH(hosts={hosts!r}, key={str(ssh_hosts.client_key)!r},\n"
        f"              known_hosts={str(ssh_hosts.known_hosts)!r})\n"
        f"image = sky.Image(index_url={package_index.url!r})\n"
        "with sky.ComputePool(provider=ssh, nodes=2, image=image, console='off') as pool:\n"
        "    print('tripled', pool.broadcast(triple, 5), pool.run(lambda: triple(2)))\n",
    )
    printed = "".join(text for _, text in _streams(kernel))
    assert "tripled [15, 15] 6" in printed, printed
