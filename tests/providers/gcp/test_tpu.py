"""Cloud TPU pools on ``sky.GCP``, against the TPU fake (a real HTTP endpoint the real
google-cloud-tpu talks to) and the Compute Engine fake (the firewall rules): the types and
their validation, what a pool asks Google for, what it says when Google refuses, how it
moves to another zone, and that a start stopped anywhere leaves nothing. Reaching the hosts
is in ``test_tpu_standins.py``."""

from __future__ import annotations

import base64
import json
import os
import signal as signals
import subprocess
import sys
import time
from typing import Any

import pytest
from click.testing import CliRunner
from google.auth.credentials import AnonymousCredentials
from support.clouds.aws.pools import Checkpoint, request
from support.clouds.gcp.fake import GCPFake
from support.clouds.gcp.standins import PROJECT, held
from support.clouds.gcp.tpu_fake import TPUFake
from support.clouds.gcp.tpu_standins import held_tpu
from support.dispositions import as_from_a_terminal
from support.reporter import Recorder

import skyward as sky
from skyward._errors import ProvisionError
from skyward.cli import main
from skyward.client.futures import Deadline
from skyward.plugins._jax import (
    HOSTS_PER_SLICE,
    accelerator_platform,
    jax_requirement,
    megascale_environment,
    multislice_environment,
)
from skyward.providers.cloud.boot import BEFORE_POWEROFF_PATH, Boot, HostKey
from skyward.providers.cloud.capacity import CapacityError
from skyward.providers.cloud.contract import Want
from skyward.providers.cloud.record import Record
from skyward.providers.gcp import tpu_types
from skyward.providers.gcp.tpu_api import self_delete_script

pytestmark = pytest.mark.timeout(120)
ZONE = "us-central2-b"


def tpu_provider(gce: GCPFake, tpu: TPUFake, **options: Any) -> sky.GCP:
    settings: dict[str, Any] = {
        "project": PROJECT,
        "zone": ZONE,
        "endpoint": gce.url,
        "tpu_endpoint": tpu.url,
        "credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
        "ssh_cidr": "10.123.0.0/16",
        "release_timeout": 30.0,
        **options,
    }
    return sky.GCP(**settings)


def _nothing_left(gce: GCPFake, tpu: TPUFake, pool: str) -> None:
    assert held_tpu(tpu, pool) == {"queued resources": [], "nodes": []}
    assert held(gce, pool)["firewall rules"] == []


# ── the types, before anything is touched ──────────────────────────────────────────────


def test_each_generation_counts_cores_or_chips_as_google_names_it() -> None:
    shapes = {
        name: (t.chips, t.hosts, t.chips_per_host)
        for name in (
            *("v4-8", "v4-16", "v4-32", "v5p-8", "v5litepod-1", "v5litepod-8"),
            *("v5litepod-16", "v6e-8", "v6e-16", "v3-32", "v2-8"),
        )
        if (t := tpu_types.parse(name))
    }
    assert shapes == {
        "v4-8": (4, 1, 4),
        "v4-16": (8, 2, 4),
        "v4-32": (16, 4, 4),
        "v5p-8": (4, 1, 4),
        "v5litepod-1": (1, 1, 1),
        "v5litepod-8": (8, 1, 8),
        "v5litepod-16": (16, 4, 4),
        "v6e-8": (8, 1, 8),
        "v6e-16": (16, 4, 4),
        "v3-32": (16, 4, 4),
        "v2-8": (4, 1, 4),
    }


def test_zones_are_googles_v4_only_in_us_central2_b() -> None:
    assert tpu_types.parse("v4-64").zones == ("us-central2-b",)
    assert "us-central1-a" in tpu_types.parse("v5litepod-8").zones
    assert tpu_types.parse("v3-32").zones == ("europe-west4-a",)  # pod slices: Europe only
    assert "us-central1-b" in tpu_types.parse("v3-8").zones


def test_an_unknown_type_lists_what_its_generation_comes_as() -> None:
    with pytest.raises(ValueError, match=r"v4 comes as v4-8, v4-16, v4-32"):
        tpu_types.parse("v4-17")
    with pytest.raises(ValueError, match=r"v5litepod-N \(v5e\)"):
        tpu_types.parse("v9-8")


def test_the_public_factories_name_googles_types() -> None:
    accelerators = sky.accelerators
    assert str(accelerators.TPU("v4-32")) == "v4-32"
    assert str(accelerators.TPUv5p()) == "v5p-8"
    assert str(accelerators.TPUv5p_8()) == "v5p-8"
    assert str(accelerators.TPUv4_64()) == "v4-64"
    assert str(accelerators.TPUv3_32()) == "v3-32"
    assert str(accelerators.TPUv5e_4()) == "v5litepod-4"
    assert str(accelerators.TPUv6()) == "v6e-1"
    with pytest.raises(ValueError, match="Google sells no TPU type 'v4-3'"):
        accelerators.TPU("v4-3")
    with pytest.raises(ValueError, match="multislice"):
        accelerators.TPUv4_64(count=2)


def test_skyward_catalog_tpu_lists_chips_hosts_zones_and_prices() -> None:
    listed = CliRunner().invoke(main, ["catalog", "tpu-v4"])
    assert listed.exit_code == 0, listed.output
    row = next(line.split() for line in listed.stdout.splitlines() if line.startswith("v4-16 "))
    assert row[:6] == ["v4-16", "v4", "8", "2", "4", "32"]
    assert row[-1] == "us-central2-b"
    assert float(row[7]) == pytest.approx(8 * 3.22)
    every = CliRunner().invoke(main, ["catalog", "tpu", "--json"])
    assert {r["generation"] for r in json.loads(every.stdout)} == {
        "v2",
        "v3",
        "v4",
        "v5p",
        "v5e",
        "v6e",
    }


def test_a_zone_that_does_not_sell_the_type_is_refused_when_the_pool_is_built(
    gce: GCPFake, tpu: TPUFake
) -> None:
    gcp = tpu_provider(gce, tpu, zone="us-central1-a")
    with pytest.raises(
        ValueError, match="Google sells v4-16 in us-central2-b, not in us-central1-a"
    ):
        sky.ComputePool(provider=gcp, accelerator="v4-16", nodes=2)


def test_nodes_must_be_whole_slices_and_the_error_names_the_hosts(
    gce: GCPFake, tpu: TPUFake
) -> None:
    with pytest.raises(ValueError, match="nodes=3 is not a multiple of its 2 host"):
        sky.ComputePool(provider=tpu_provider(gce, tpu), accelerator="v4-16", nodes=3)
    with pytest.raises(ValueError, match="v4 comes as"):
        sky.ComputePool(provider=tpu_provider(gce, tpu), accelerator="v4-12", nodes=2)


def test_nodes_default_to_the_slices_hosts(gce: GCPFake, tpu: TPUFake) -> None:
    # The example: a v4-32 is 4 hosts, one JAX process each, with no nodes= given.
    gcp = tpu_provider(gce, tpu)
    assert sky.ComputePool(provider=gcp, accelerator="v4-32", quiet=True).spec.nodes == 4
    named = sky.accelerators.TPU("v4-16")
    assert sky.ComputePool(provider=gcp, accelerator=named, quiet=True).spec.nodes == 2
    two = sky.ComputePool(provider=gcp, accelerator="v4-16", nodes=4, quiet=True)
    assert two.spec.nodes == 4  # given: two slices


# ── what a pool asks Google for ────────────────────────────────────────────────────────


def _stopped_once_launched(
    gce: GCPFake, tpu: TPUFake, gcp: sky.GCP, nodes: int, accelerator: str
) -> tuple[dict[str, Any], str, Recorder]:
    """A start stopped (Ctrl-C) once the slices exist: what the fakes held then; and that
    nothing is left."""
    seen: dict[str, Any] = {}

    def look() -> None:
        seen["queued"] = tpu.queued_resources(PROJECT)
        seen["nodes"] = tpu.nodes(PROJECT)
        seen["firewalls"] = gce.firewalls(PROJECT)

    made = request(
        nodes, accelerator=accelerator, deadline=Checkpoint("TPU host(s) to run", reached=look)
    )
    reporter = Recorder()
    with pytest.raises(KeyboardInterrupt):
        gcp.provision(made, reporter)
    _nothing_left(gce, tpu, made.pool)
    return seen, made.pool, reporter


def test_a_slice_is_one_queued_resource_with_the_type_runtime_labels_keys_and_startup_script(
    gce: GCPFake, tpu: TPUFake
) -> None:
    seen, pool, reporter = _stopped_once_launched(
        gce, tpu, tpu_provider(gce, tpu, tpu_runtime="tpu-ubuntu2204-base"), 2, "v4-16"
    )
    (queued,) = seen["queued"]
    (spec,) = queued["tpu"]["nodeSpec"]
    assert spec["parent"] == f"projects/{PROJECT}/locations/{ZONE}"
    assert spec["nodeId"] == queued["name"].rsplit("/", 1)[-1]
    assert "multisliceParams" not in spec and "spot" not in queued
    node = spec["node"]
    assert node["acceleratorType"] == "v4-16"
    assert node["runtimeVersion"] == "tpu-ubuntu2204-base"
    assert node["labels"]["skyward-pool"] == pool
    assert node["networkConfig"]["network"] == f"projects/{PROJECT}/global/networks/default"
    assert node["networkConfig"]["enableExternalIps"] is True  # connect="public"
    assert node.get("schedulingConfig", {}).get("spot", False) is False
    assert node["serviceAccount"]["scope"] == ["https://www.googleapis.com/auth/cloud-platform"]
    user, key = node["metadata"]["ssh-keys"].split(":", 1)
    assert user == "skyward" and key.startswith("ssh-ed25519 ")
    assert node["metadata"]["block-project-ssh-keys"] == "TRUE"
    script = node["metadata"]["startup-script"]
    assert script.startswith("#!/bin/sh") and "/usr/sbin/sshd" in script
    assert "user-data" not in node["metadata"]  # TPU VM images run startup-script instead
    # The watchdog's last act: the slice's queued resource deleted, through the TPU API.
    assert f"write {BEFORE_POWEROFF_PATH} 0755 " in script
    hook = self_delete_script(tpu.url)
    assert base64.b64encode(hook.encode()).decode() in script
    assert f"{tpu.url}/v2/projects/$project/locations/${{zone##*/}}/queuedResources/" in hook
    assert "$queued?force=true" in hook and "instance/attributes/skyward-queued-resource" in hook
    assert node["metadata"]["skyward-queued-resource"] == spec["nodeId"]
    # The rules are on the slice's network tag: SSH from the client, all within the pool.
    (tag,) = node["tags"]
    ssh = next(f for f in seen["firewalls"] if f["name"].endswith("-ssh"))
    assert ssh["targetTags"] == [tag] and ssh["sourceRanges"] == ["10.123.0.0/16"]
    (made,) = seen["nodes"]
    assert len(made["networkEndpoints"]) == 2  # one node, two hosts
    said = " ".join(reporter.statuses)
    assert "ACCEPTED" not in said or "ACTIVE" in said
    assert f"queued resource {spec['nodeId']} in {ZONE}: ACTIVE" in said
    assert "WAITING_FOR_RESOURCES" in said  # the queue's state, shown while it waits


def test_spot_asks_a_spot_queued_resource_whose_nodes_are_spot(gce: GCPFake, tpu: TPUFake) -> None:
    seen, _, _ = _stopped_once_launched(gce, tpu, tpu_provider(gce, tpu, spot=True), 1, "v4-8")
    (queued,) = seen["queued"]
    assert queued["spot"] == {}
    assert queued["tpu"]["nodeSpec"][0]["node"]["schedulingConfig"] == {"spot": True}


def test_two_slices_are_one_queued_resource_with_multislice_params(
    gce: GCPFake, tpu: TPUFake
) -> None:
    seen, _, _ = _stopped_once_launched(gce, tpu, tpu_provider(gce, tpu), 4, "v4-16")
    (queued,) = seen["queued"]
    (spec,) = queued["tpu"]["nodeSpec"]
    prefix = queued["name"].rsplit("/", 1)[-1]
    assert spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": prefix}
    assert sorted(n["name"].rsplit("/", 1)[-1] for n in seen["nodes"]) == [
        f"{prefix}-0",
        f"{prefix}-1",
    ]


# ── refusals, failover, leaks ──────────────────────────────────────────────────────────


def test_a_stockout_moves_to_the_next_zone_that_sells_the_type_and_deletes_the_first(
    gce: GCPFake, tpu: TPUFake
) -> None:
    tpu.stockout("us-central1-a")
    seen, _, reporter = _stopped_once_launched(
        gce, tpu, tpu_provider(gce, tpu, zone="us-central1-a"), 1, "v5litepod-8"
    )
    (queued,) = seen["queued"]
    assert "/locations/us-south1-a/" in queued["name"]  # the next in Google's table
    assert any("us-central1-a: no TPU capacity there right now" in s for s in reporter.statuses)
    deleted = tpu.requests("DELETE", "projects/*/locations/us-central1-a/queuedResources/*")
    assert deleted and deleted[0].query.get("force") == "true"


def test_when_every_zone_is_stocked_out_the_error_names_each_zone_and_nothing_is_left(
    gce: GCPFake, tpu: TPUFake
) -> None:
    zones = tpu_types.parse("v5litepod-8").zones
    for zone in zones:
        tpu.stockout(zone)
    made = request(1, accelerator="v5litepod-8")
    with pytest.raises(CapacityError) as raised:
        tpu_provider(gce, tpu, zone="us-central1-a").provision(made, Recorder())
    message = str(raised.value)
    assert "tried" in message
    for zone in zones:
        assert f"v5litepod-8 on-demand in {zone}: no TPU capacity there right now" in message
    _nothing_left(gce, tpu, made.pool)


@pytest.mark.parametrize(
    ("status", "message", "reason", "said"),
    [
        (
            403,
            "Cloud TPU API has not been used in project skyward-tests before or it is disabled.",
            "SERVICE_DISABLED",
            "gcloud services enable tpu.googleapis.com --project skyward-tests",
        ),
        (
            403,
            "Permission 'tpu.queuedResources.create' denied on resource "
            "'projects/skyward-tests/locations/us-central2-b'",
            "IAM_PERMISSION_DENIED",
            "lacks the permission tpu.queuedResources.create",
        ),
        (
            429,
            "Quota limit 'TPUV4sPodPerProjectPerZoneForTPUAPI' has been exceeded.",
            "RATE_LIMIT_EXCEEDED",
            "Cloud TPU quota TPUV4sPodPerProjectPerZoneForTPUAPI",
        ),
    ],
)
def test_refusals_say_what_to_do_and_leave_nothing(
    gce: GCPFake, tpu: TPUFake, status: int, message: str, reason: str, said: str
) -> None:
    tpu.fail_requests(
        "POST", "projects/*/locations/*/queuedResources", status, message, reason=reason
    )
    made = request(2, accelerator="v4-16")
    with pytest.raises(ProvisionError, match=said.replace(".", r"\.")):
        tpu_provider(gce, tpu).provision(made, Recorder())
    _nothing_left(gce, tpu, made.pool)


def test_an_unknown_runtime_version_says_how_to_list_them(gce: GCPFake, tpu: TPUFake) -> None:
    made = request(2, accelerator="v4-16")
    with pytest.raises(ProvisionError, match="gcloud compute tpus versions list"):
        tpu_provider(gce, tpu, tpu_runtime="tpu-vm-v9-nope").provision(made, Recorder())
    _nothing_left(gce, tpu, made.pool)


@pytest.mark.parametrize(
    "step",
    ["creating the firewall rules", "creating queued resource", "waiting for queued resource"],
)
def test_a_start_stopped_at_any_step_leaves_nothing(gce: GCPFake, tpu: TPUFake, step: str) -> None:
    made = request(2, accelerator="v4-16", deadline=Checkpoint(step))
    with pytest.raises(KeyboardInterrupt):
        tpu_provider(gce, tpu).provision(made, Recorder())
    _nothing_left(gce, tpu, made.pool)


def test_a_queued_resource_still_waiting_at_the_deadline_is_deleted_with_force(
    gce: GCPFake, tpu: TPUFake
) -> None:
    tpu.hold(ZONE)
    made = request(2, accelerator="v4-16", deadline=Checkpoint("nothing", seconds=4.0))
    reporter = Recorder()
    with pytest.raises(TimeoutError):
        tpu_provider(gce, tpu).provision(made, reporter)
    assert any("WAITING_FOR_RESOURCES" in s for s in reporter.statuses)
    deleted = tpu.requests("DELETE", "projects/*/locations/*/queuedResources/*")
    assert deleted and all(r.query.get("force") == "true" for r in deleted)
    _nothing_left(gce, tpu, made.pool)


def _launched(gcp: sky.GCP, made: Any, strategy: Any = "on-demand") -> tuple[Any, Record, str]:
    """A pool's slice made through the contract's calls, as the start makes it."""
    machines = gcp.machines(made)
    want = Want(made, strategy, Deadline(60, "test"), Recorder())
    offers = machines.offers(want).offers
    key = "ssh-ed25519 AAAA"
    boot = Boot(host_key=HostKey.generate(), authorized_key=key, user="u", idle_timeout=60)
    record = Record(made.pool)
    machines.prepare(want, offers, boot, record)
    names = record.ask(offers[0].zone, range(made.nodes), machines.prefix)
    ids = machines.launch(offers[0], names, record, Deadline(60, "test"))
    return machines, record, ids[0]


def test_a_preempted_node_is_a_loss_whose_reason_names_it(gce: GCPFake, tpu: TPUFake) -> None:
    made = request(1, accelerator="v4-8")
    machines, record, id = _launched(tpu_provider(gce, tpu, spot=True), made, "spot")
    (running,) = machines.describe(ZONE, [id])
    assert running.state == "running" and running.reach is not None
    tpu.preempt(PROJECT, ZONE, id.split("/")[0])
    (lost,) = machines.describe(ZONE, [id], quick=True)
    assert (lost.state, lost.status) == ("ended", "PREEMPTED")
    assert "preempted by Google (spot)" in lost.why
    assert machines.delete(record, Deadline(30, "test")) == []
    _nothing_left(gce, tpu, made.pool)


def test_ls_lists_a_pools_queued_resource_and_down_deletes_it_with_force(
    gce: GCPFake, tpu: TPUFake
) -> None:
    gcp = tpu_provider(gce, tpu)
    made = request(2, accelerator="v4-16")
    _launched(gcp, made)  # a client that died: nothing deletes it
    inventory = gcp.inventory()
    assert inventory is not None
    found = inventory.leftovers(pool=made.pool)
    kinds = sorted((x.kind, x.region) for x in found)
    assert kinds == [
        ("firewall rule", "global"),
        ("firewall rule", "global"),
        ("queued resource", ZONE),
    ]
    (queued,) = [x for x in found if x.kind == "queued resource"]
    assert queued.state == "active" and queued.hourly_cost == pytest.approx(8 * 3.22)
    assert inventory.leftovers(pool="another-pool") == []
    inventory.delete(found, Recorder())
    deleted = tpu.requests("DELETE", "projects/*/locations/*/queuedResources/*")
    assert [r.query.get("force") for r in deleted] == ["true"]
    _nothing_left(gce, tpu, made.pool)


# ── multislice: the jax plugin's MEGASCALE variables ───────────────────────────────────


def test_a_multislice_pool_gives_each_host_its_slice_and_the_coordinator() -> None:
    assert multislice_environment("v4-16", 2) == {}  # one slice: nothing to join
    env = multislice_environment("v4-16", 6)
    assert env == {HOSTS_PER_SLICE: "2"}
    peers = tuple(f"10.0.0.{i}" for i in range(6))
    seen = [
        megascale_environment(
            sky.InstanceInfo(
                node=rank,
                total_nodes=6,
                head_addr=peers[0],
                head_port=1234,
                peers=peers,
                hostname=f"t1v-{rank}",
            ),
            env,
        )
        for rank in range(6)
    ]
    assert [s["MEGASCALE_SLICE_ID"] for s in seen] == ["0", "0", "1", "1", "2", "2"]
    assert {s["MEGASCALE_NUM_SLICES"] for s in seen} == {"3"}
    assert {s["MEGASCALE_COORDINATOR_ADDRESS"] for s in seen} == {"10.0.0.0:8080"}


def test_a_tpu_pool_gets_jax_tpu_from_the_index_and_no_cuda_index() -> None:
    assert accelerator_platform("v5litepod-8") == "tpu"
    assert accelerator_platform("v4-16") == "tpu"
    requirement, packages = jax_requirement("tpu", 12, None)
    assert requirement == "jax[tpu]" and "libtpu" in packages
    assert not any("cuda" in p for p in packages)


# ── a client ended by a signal while its queued resource waits ─────────────────────────

_CLIENT = """
from google.auth.credentials import AnonymousCredentials
import skyward as sky
gcp = sky.GCP(project={project!r}, zone={zone!r}, endpoint={url!r}, tpu_endpoint={tpu!r},
              credentials=AnonymousCredentials(), ssh_cidr="10.123.0.0/16",
              release_timeout=30, boot_timeout=120)
with sky.ComputePool(provider=gcp, accelerator="v4-16", nodes=2, name={pool!r},
                     console="plain") as pool:
    print("READY", flush=True)
"""


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_client_signalled_while_its_queued_resource_waits_leaves_nothing(
    gce: GCPFake, tpu: TPUFake, tmp_path: Any, signal_name: str
) -> None:
    tpu.hold(ZONE)  # the queue waits for resources until the client is gone
    pool = f"tpu-signalled-{signal_name.lower()}"
    script = _CLIENT.format(project=PROJECT, zone=ZONE, url=gce.url, tpu=tpu.url, pool=pool)
    log = tmp_path / "client.log"
    with open(log, "wb") as out:
        client = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=out,
            stderr=out,
            env={**os.environ, "TMPDIR": str(tmp_path)},
            preexec_fn=as_from_a_terminal,
        )
    try:
        end = time.monotonic() + 90
        while len(tpu.requests("GET", "projects/*/locations/*/queuedResources/*")) < 3:
            assert client.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.05)
        assert held_tpu(tpu, pool)["queued resources"], log.read_text()
        client.send_signal(getattr(signals, signal_name))
        status = client.wait(60)
    finally:
        client.kill()
        client.wait(30)
    if signal_name == "SIGTERM":
        assert status == -signals.SIGTERM, log.read_text()
    else:
        assert status != 0, log.read_text()
    deleted = tpu.requests("DELETE", "projects/*/locations/*/queuedResources/*")
    assert deleted and all(r.query.get("force") == "true" for r in deleted)
    _nothing_left(gce, tpu, pool)
