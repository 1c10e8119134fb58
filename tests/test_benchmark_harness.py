"""The benchmark harness imports and parses its options (it is run by hand, not here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("skyward_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_quick_mode_shrinks_every_scenario_and_reports_targets_unmeasured() -> None:
    bench = load_bench()
    quick, full = bench.parse_args(["--quick"]), bench.parse_args([])
    assert quick.tasks < full.tasks and quick.calls < full.calls and quick.sizes == [2]
    report = bench.Report()
    series = report.scenario("roundtrip", "round trip").series("skyward >>")
    series.samples += [0.003, 0.001, 0.002]
    assert series.summary()["median"] == 0.002
    targets = bench.evaluate_targets(report)
    assert all(t["met"] is None for t in targets)
    assert "| skyward >> | 2.00 ms |" in bench.markdown(report, bench.machine(), targets)


def test_ssh_throughput_target_is_a_floor_on_our_share_of_openssh_mb_s() -> None:
    bench = load_bench()
    report = bench.Report()
    bulk = report.scenario("ssh_bulk", "bulk")
    bulk.series("skyward >> (SSH pool)").samples.append(0.4)  # seconds for the same bytes
    bulk.series("ssh 'cat > /dev/null', default cipher").samples.append(0.3)
    report.scenario("ssh_roundtrip", "rt").series("skyward >> (SSH pool)").samples.append(0.0005)
    targets = {t["name"].split(" (")[0]: t for t in bench.evaluate_targets(report)}
    share = targets["over SSH: large-argument MB/s ≥ 50% of the OpenSSH client's"]
    assert share["ratio"] == pytest.approx(0.75) and share["met"] is True
    assert targets["over SSH: no-op round trip ≤ 1 ms"]["met"] is True
