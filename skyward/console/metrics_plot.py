"""A picture of a pool's live metrics: one panel per metric, one line per node, over time.

``pool.plot_metrics(path)`` draws the samples the pool holds; ``skyward logs --plot POOL``
draws a finished pool's ``metrics.jsonl``. matplotlib is optional (``skyward[plot]``) and
imported only here, with its non-interactive backend: a PNG is written, no window opens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skyward._errors import MissingDependency

# Units by metric name, for the panels' titles.
_UNITS = {
    "cpu": "%",
    "mem": "%",
    "disk": "%",
    "gpu_util": "%",
    "gpu_temp": "°C",
    "mem_used_mb": "MB",
    "mem_total_mb": "MB",
    "gpu_mem_mb": "MB",
    "gpu_mem_total_mb": "MB",
    "net_rx_mbps": "MB/s",
    "net_tx_mbps": "MB/s",
}


def plot(rows: list[dict[str, Any]], path: Path, *, title: str = "") -> Path:
    """Write a PNG of ``rows`` to ``path``: a panel per metric, stacked, sharing the time
    axis (seconds since the first sample); ``ValueError`` when there are no samples."""
    names = metric_names(rows)
    if not names:
        raise ValueError("no metrics samples to plot (was the image's metrics=None?)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependency(
            "plotting metrics needs matplotlib: pip install 'skyward[plot]'"
        ) from exc
    start = min(float(r["time"]) for r in rows)
    nodes = sorted({int(r["node"]) for r in rows})
    figure, axes = plt.subplots(
        len(names), 1, sharex=True, figsize=(9, 1.9 * len(names) + 0.6), squeeze=False
    )
    try:
        for axis, name in zip(axes[:, 0], names, strict=True):
            for node in nodes:
                points = [
                    (float(r["time"]) - start, float(r[name]))
                    for r in rows
                    if int(r["node"]) == node and name in r
                ]
                if points:
                    xs, ys = zip(*points, strict=True)
                    axis.plot(xs, ys, label=f"node {node}", linewidth=1.2)
            unit = _UNITS.get(name.rsplit("_", 1)[0] if name[-1].isdigit() else name, "")
            axis.set_title(f"{name} ({unit})" if unit else name, fontsize=9, loc="left")
            axis.grid(alpha=0.3)
        axes[0, 0].legend(fontsize=8, loc="upper right")
        axes[-1, 0].set_xlabel("seconds")
        if title:
            figure.suptitle(title, fontsize=10)
        figure.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=100)
    finally:
        plt.close(figure)
    return path


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """``node``, ``time``, then every metric the rows hold, in the order first seen."""
    names: dict[str, None] = {"node": None, "time": None}
    for row in rows:
        names.update(dict.fromkeys(row))
    return list(names)


def metric_names(rows: list[dict[str, Any]]) -> list[str]:
    return [name for name in columns(rows) if name not in ("node", "time")]
