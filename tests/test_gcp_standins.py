"""The GCP provider end to end: the Compute Engine fake creates the instances, stand-in VMs
(network-namespace hosts that boot from the instances' ``user-data`` metadata, in sandboxes
that cannot stop this machine) play the machines, and the pool reaches them at their private
addresses. The stand-ins reach the fake and a metadata server on the test bridge, as a VM
reaches Google's."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import pytest
from support.gcpcloud import GCPStandIns, held, nothing
from support.gcpcloud import standin_provider as gcp
from support.sshhosts import PackageIndex

import skyward as sky

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _toy() -> Any:
    spec = importlib.util.spec_from_file_location(
        "jax_multicontroller", EXAMPLES / "jax_multicontroller.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.toy


@pytest.mark.timeout(600)
def test_jax_multi_controller_toy_on_two_gce_stand_ins_leaves_nothing(
    gcp_standins: GCPStandIns, package_index: PackageIndex
) -> None:
    toy = _toy()
    started = time.monotonic()
    with sky.ComputePool(
        provider=gcp(gcp_standins),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.jax(cpu_devices=4)],
        name="gcp-jax",
        quiet=True,
    ) as pool:
        ready = time.monotonic() - started
        names = pool.broadcast(lambda: os.uname().nodename)
        results = toy() @ pool
    print(f"ready after {ready:.1f} s")
    assert [value for value, _ in results] == [-0.12398731708526611, -0.12398731708526611]
    addresses = [s.address for s in gcp_standins.standins.values()]
    assert names == ["ip-" + a.replace(".", "-") for a in addresses]
    assert nothing(held(gcp_standins.fake, "gcp-jax"))
    gcp_standins.wait_for(
        lambda: all(s.ended for s in gcp_standins.standins.values()),
        30,
        "stand-ins stopped when their instances were deleted",
    )
