"""The warm no-op round trip (``f() >> pool``, 2 local nodes) with live metrics off, at the
default rate, and at a fast one (every 0.1 s), alternated in rounds so that the machine's
load drifts over all three alike; median of each, in µs.

    python benchmarks/metrics_rt.py [calls per round] [rounds]
"""

from __future__ import annotations

import statistics
import sys
import time

import skyward as sky

SETTINGS = {
    "off": sky.Image(metrics=None),
    "default": sky.Image(),
    "fast (0.1 s)": sky.Image(
        metrics=[
            sky.metrics.CPU(interval=0.1),
            sky.metrics.Memory(interval=0.1),
            sky.metrics.NetworkRx(interval=0.1),
            sky.metrics.NetworkTx(interval=0.1),
        ]
    ),
}


@sky.compute
def noop() -> None:
    return None


def round_trip(image: sky.Image, calls: int) -> list[float]:
    with sky.ComputePool(nodes=2, image=image, console="off") as pool:
        for _ in range(200):
            noop() >> pool
        time.sleep(0.3)  # the samplers have started
        out = []
        for _ in range(calls):
            start = time.perf_counter()
            noop() >> pool
            out.append(time.perf_counter() - start)
    return out


def main(calls: int = 3000, rounds: int = 3) -> None:
    seen: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(rounds):
        for name, image in SETTINGS.items():
            seen[name].extend(round_trip(image, calls))
    off = statistics.median(seen["off"])
    for name, times in seen.items():
        median = statistics.median(times)
        change = (median / off - 1) * 100
        print(f"{name:>14}: median {median * 1e6:7.1f} µs  ({change:+.1f}% vs off)")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
