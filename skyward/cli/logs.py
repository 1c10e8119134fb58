"""``skyward logs``: read what a pool wrote to its log directory (``skyward.console.logs``),
during its run or after it, from any terminal.

::

    skyward logs                  the newest pool's events and every node's output
    skyward logs POOL --node 1    one node of one pool
    skyward logs --follow         keep printing new lines until Ctrl-C
    skyward logs --list           the pools with logs here, newest first, and their state
    skyward logs --plot POOL      a PNG of the pool's live metrics (-o PNG: where)
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import click

from skyward.cli.columns import aligned
from skyward.console.logs import follow, logs_root, recent_pools


@click.command()
@click.argument("pool", required=False)
@click.option("--node", type=int, default=None, help="Only this node's output.")
@click.option("--follow", "-f", "keep", is_flag=True, help="Keep printing new lines.")
@click.option("--list", "listing", is_flag=True, help="List the pools that have logs here.")
@click.option("--plot", is_flag=True, help="Write a PNG of the pool's live metrics.")
@click.option(
    "--output",
    "-o",
    "plot_to",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --plot: where (default: metrics.png in the pool's log directory).",
)
def logs(
    pool: str | None,
    node: int | None,
    keep: bool,
    listing: bool,
    plot: bool,
    plot_to: Path | None,
) -> None:
    """Show a pool's events and its nodes' output (the newest pool without POOL)."""
    pools = recent_pools()
    if listing:
        _list(pools)
        return
    if not pools:
        raise click.ClickException(f"no pool has written logs under {logs_root()} yet")
    chosen = _choose(pools, pool)
    directory = Path(chosen["directory"])
    if plot:
        _plot(chosen, directory, plot_to or directory / "metrics.png")
        return
    names = [f"node-{node}.log"] if node is not None else _files(directory)
    if node is not None and not (directory / names[0]).exists():
        nodes = sorted(p.stem for p in directory.glob("node-*.log"))
        raise click.ClickException(
            f"pool {chosen['name']} has no output from node {node} "
            f"(it has: {', '.join(nodes) or 'no node output'})"
        )
    state = chosen.get("state", "?")
    click.echo(f"# pool {chosen['name']} ({state}), logs in {directory}", err=True)
    if not keep:
        for name in names:
            _print_file(directory / name, label=len(names) > 1)
        return
    stop = threading.Event()
    threads = [
        threading.Thread(target=_tail, args=(directory / n, stop, len(names) > 1), daemon=True)
        for n in names
    ]
    for thread in threads:
        thread.start()
    try:
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt:
        stop.set()


def _plot(chosen: dict[str, Any], directory: Path, path: Path) -> None:
    from skyward._errors import MissingDependency
    from skyward.console.metrics_plot import plot as draw
    from skyward.pool.metrics import FILE_NAME, read_rows

    source = directory / FILE_NAME
    if not source.exists():
        raise click.ClickException(
            f"pool {chosen['name']} wrote no metrics ({source} is missing: its image had "
            f"metrics=None, or it predates them)"
        )
    try:
        draw(read_rows(source), path, title=f"pool {chosen['name']}")
    except (ValueError, MissingDependency) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(path))


def _choose(pools: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    if name is None:
        return pools[0]
    for meta in pools:
        if meta.get("name") == name:
            return meta
    known = ", ".join(str(m.get("name")) for m in pools[:10])
    raise click.ClickException(f"no logs for pool {name!r}; recent pools: {known}")


def _files(directory: Path) -> list[str]:
    nodes = sorted(directory.glob("node-*.log"), key=lambda p: int(p.stem.split("-")[1]))
    return ["events.log", *(p.name for p in nodes)]


def _print_file(path: Path, *, label: bool) -> None:
    rotated = path.with_name(path.name + ".1")
    for part in (rotated, path):
        if part.exists():
            for line in part.read_text(errors="replace").splitlines():
                click.echo(f"{path.stem}: {line}" if label else line)


def _tail(path: Path, stop: threading.Event, label: bool) -> None:
    for line in follow(path, stop=stop):
        click.echo(f"{path.stem}: {line}" if label else line)


def _list(pools: list[dict[str, Any]]) -> None:
    if not pools:
        click.echo(f"No pool has written logs under {logs_root()}.")
        return
    rows = [("POOL", "STATE", "PROVIDER", "NODES", "STARTED", "LOGS")]
    for meta in pools:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(meta.get("started", 0))))
        rows.append(
            (
                str(meta.get("name", "?")),
                str(meta.get("state", "?")),
                str(meta.get("provider", "?")),
                str(meta.get("nodes", "?")),
                started,
                str(meta["directory"]),
            )
        )
    for line in aligned(rows):
        click.echo(line)
