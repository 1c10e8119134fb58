"""``pool.timings()``: a start's phases and bootstrap steps, per node, in the order they came."""

from __future__ import annotations

import skyward as sky
from skyward.console import Console
from skyward.console.progress import Board


def _start(console: Console) -> None:
    console.begin("pool p", 2)
    for node in (0, 1):
        console.phase(node, "connecting", "h0")
        console.phase(node, "bootstrapping", "image abc")
    console.phase(0, "bootstrapping", "cache")
    console.phase(1, "bootstrapping", "uv")
    console.phase(1, "bootstrapping", "python")
    console.phase(1, "bootstrapping", "packages")
    for node in (0, 1):
        console.phase(node, "bootstrapping", "skyward")
    console.phase(0, "bootstrapping", "wait")  # node 0 was prepared first
    for node in (0, 1):
        console.phase(node, "starting")
        console.phase(node, "starting", "entering jax")
        console.phase(node, "ready", "pid 1")


def test_timings_name_each_nodes_stages_in_the_order_a_start_goes_through_them() -> None:
    console = Console(mode="off")
    _start(console)
    console.end("ready")
    timings = console.timings()

    cached, built = timings.nodes
    assert [s for s, _ in cached.stages] == [
        "boot",
        "bootstrap",
        "cache",
        "skyward",
        "wait",
        "worker",
        "plugins",
    ]
    assert [s for s, _ in built.stages] == [
        "boot",
        "bootstrap",
        "uv",
        "python",
        "packages",
        "skyward",
        "worker",
        "plugins",
    ]
    assert cached["packages"] == 0.0 and built["cache"] == 0.0
    # A node's bootstrap is its own work, not its wait for the others.
    assert cached.bootstrap == cached["bootstrap"] + cached["cache"] + cached["skyward"]
    assert timings.total >= max(sum(s for _, s in n.stages) for n in timings.nodes) >= 0
    assert "cache" in str(timings) and "ready after" in str(timings)


def test_events_after_ready_do_not_change_the_starts_timings() -> None:
    console = Console(mode="off")
    _start(console)
    console.end("ready")
    before = console.timings()
    console.phase(0, "starting", "replacing a lost worker")
    assert [s for s, _ in console.timings().nodes[0].stages] == [
        s for s, _ in before.nodes[0].stages
    ]


def test_the_progress_display_shows_the_bootstrap_step_beside_the_phase() -> None:
    board = Board("pool p", 1)
    board.set_phase(0, "bootstrapping", "image abc")
    board.set_phase(0, "bootstrapping", "packages")
    _, phase, _, news = board.table()[0]
    assert (phase, news) == ("bootstrapping: packages", "image abc")


def test_a_local_pool_has_timings_too() -> None:
    with sky.ComputePool(quiet=True) as pool:
        timings = pool.timings()
    assert [n.node for n in timings.nodes] == [0]
    assert timings.nodes[0]["worker"] >= 0 and timings.total > 0


def test_timings_are_a_mapping_of_the_pools_steps_and_each_stages_slowest_node() -> None:
    with sky.ComputePool(quiet=True) as pool:
        timings = pool.timings()
    assert {"provision", "workers", "boot", "worker", "packages"} <= set(timings)
    assert timings["packages"] == 0.0 and timings.get("warm.reach", 0.0) == 0.0
    assert timings["workers"] > 0 and "workers" in str(timings)
