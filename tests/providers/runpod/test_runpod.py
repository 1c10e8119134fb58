"""The RunPod provider against the fake of RunPod's GraphQL and REST (v1) APIs (a real HTTP
endpoint on loopback): what it rents and how, what it says when RunPod refuses, how it moves
to the next offer, and that a stopped or failed start leaves nothing rented. Reaching the pods
over SSH is in ``test_runpod_standins.py``."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support.clouds.aws.pools import Checkpoint, request
from support.clouds.runpod.fake import KEY, NO_FUNDS, RunPodFake
from support.dispositions import as_from_a_terminal
from support.reporter import Recorder

import skyward as sky
from skyward._errors import ProvisionError
from skyward.providers.cloud.boot import END_CONTAINER_PATH, WATCHDOG_PATH
from skyward.providers.cloud.capacity import CapacityError
from skyward.providers.registry import by_type
from skyward.providers.runpod.machines import (
    BOOT_ENV,
    CUDA_IMAGE,
    ROCM_IMAGE,
    START,
    TAGS_ENV,
)

pytestmark = pytest.mark.timeout(120)
STOP = "waiting for"  # the step after every pod is rented


def provider(fake: RunPodFake, **options: Any) -> sky.RunPod:
    return sky.RunPod(
        **{"api_key": KEY, "endpoint_url": fake.url, "release_timeout": 30.0, **options}
    )


def rent(
    fake: RunPodFake, accelerator: str = "RTX_4090", nodes: int = 2, **options: Any
) -> tuple[Recorder, list[dict[str, Any]], Any]:
    """Provision up to the wait for the pods, stop there: what was rented, and the request."""
    made = request(nodes, accelerator=accelerator, deadline=Checkpoint(STOP))
    reporter = Recorder()
    seen: list[dict[str, Any]] = []
    fake.on_rent = seen.append
    with pytest.raises(KeyboardInterrupt):
        provider(fake, **options).provision(made, reporter)
    return reporter, seen, made


# ── when the pool is built, before anything is rented ─────────────────────────────────────


def test_a_missing_or_refused_key_is_said_when_the_pool_is_built(
    fake: RunPodFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ProvisionError, match="no RunPod API key: set RUNPOD_API_KEY"):
        sky.ComputePool(provider=sky.RunPod(endpoint_url=fake.url), accelerator="RTX_4090")
    with pytest.raises(ProvisionError, match=r"RunPod refused the API key \(HTTP 401"):
        sky.ComputePool(
            provider=sky.RunPod(api_key="wrong", endpoint_url=fake.url), accelerator="RTX_4090"
        )
    assert fake.requests("podFindAndDeployOnDemand") == []
    assert "wrong" not in repr(sky.RunPod(api_key="wrong"))


def test_the_key_is_read_from_the_environment_or_runpods_config_file(
    fake: RunPodFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    sky.ComputePool(provider=sky.RunPod(endpoint_url=fake.url), accelerator="RTX_4090")
    monkeypatch.delenv("RUNPOD_API_KEY")
    check = by_type("runpod").credentials_check()
    assert check is not None and check({}, tmp_path).status == "missing"
    (tmp_path / ".runpod").mkdir()
    (tmp_path / ".runpod" / "config.toml").write_text(f'[default]\napi_key = "{KEY}"\n')
    sky.ComputePool(provider=sky.RunPod(endpoint_url=fake.url), accelerator="RTX_4090")
    assert check({}, tmp_path).status == "ok"
    assert len(fake.requests("myself")) == 2


def test_bad_settings_and_requests_are_refused_before_anything_is_rented(
    fake: RunPodFake,
) -> None:
    with pytest.raises(ValidationError, match="cloud_type"):
        sky.RunPod(cloud_type="cheap")
    with pytest.raises(ValidationError, match="data_center"):
        sky.RunPod(data_center="romania")
    with pytest.raises(ValueError, match=r"sky\.RunPod rents GPU pods"):
        sky.ComputePool(provider=provider(fake), accelerator=None)
    with pytest.raises(ValueError, match="not 'TPU-v5'"):
        sky.ComputePool(provider=provider(fake), accelerator="TPU-v5")
    with pytest.raises(ValueError, match="separate hosts with no network between them"):
        sky.ComputePool(
            provider=provider(fake), accelerator="H100", nodes=2, plugins=[sky.plugins.jax()]
        )
    sky.ComputePool(provider=provider(fake), accelerator="H100", plugins=[sky.plugins.jax()])
    assert fake.requests("podFindAndDeployOnDemand") == []


def test_the_public_projects_snippets_construct_or_say_what_is_wrong(fake: RunPodFake) -> None:
    assert sky.RunPod(cloud_type="secure", container_disk_gb=100).container_disk_gb == 100
    assert sky.RunPod(data_center_ids=("EU-RO-1",)).data_center == "EU-RO-1"
    assert sky.RunPod(data_center_ids="global").data_center is None
    image = "nvidia/cuda:12.8.2-runtime-ubuntu24.04"
    assert sky.RunPod(container_image=image).image == image
    with pytest.raises(ValidationError, match="give one data center"):
        sky.RunPod(data_center_ids=("EU-RO-1", "US-TX-3"))
    with pytest.raises(ValidationError, match="registry_auth"):
        sky.RunPod(registry_auth="docker hub")
    pool = sky.ComputePool(
        provider=provider(fake), accelerator=sky.accelerators.RTX_4090(), nodes=2
    )
    assert pool.spec.accelerator == "RTX_4090"


# ── what is rented, and how ───────────────────────────────────────────────────────────────


def test_pods_are_rented_with_the_gpu_the_image_the_disks_and_the_boot_payload(
    fake: RunPodFake,
) -> None:
    reporter, seen, made = rent(fake, "RTX_4090:2", container_disk_gb=80, data_center="EU-RO-1")
    (lowest,) = [v["lowest"] for v in fake.requests("gpuTypes")]
    assert lowest == {"gpuCount": 2, "secureCloud": True, "dataCenterId": "EU-RO-1"}
    asked = [v["input"] for v in fake.requests("podFindAndDeployOnDemand")]
    assert len(asked) == 2 and sorted(a["name"] for a in asked) == sorted(p["name"] for p in seen)
    first = asked[0]
    assert first["gpuTypeId"] == "NVIDIA GeForce RTX 4090" and first["gpuCount"] == 2
    assert first["cloudType"] == "SECURE" and first["dataCenterId"] == "EU-RO-1"
    assert first["imageName"] == CUDA_IMAGE and first["containerDiskInGb"] == 80
    assert first["volumeInGb"] == 0 and first["ports"] == "22/tcp"
    assert first["dockerArgs"] == START and "bidPerGpu" not in first
    env = {e["key"]: e["value"] for e in first["env"]}
    assert env["PUBLIC_KEY"].startswith("ssh-ed25519 ")
    assert json.loads(env[TAGS_ENV])["skyward-pool"] == made.pool
    script = base64.b64decode(env[BOOT_ENV]).decode()
    assert script.startswith("#!/bin/sh") and WATCHDOG_PATH in script
    assert END_CONTAINER_PATH in script and env["PUBLIC_KEY"] in script
    assert KEY not in json.dumps(asked)  # the account's key never goes to a machine
    (choice,) = reporter.choices
    assert choice.hourly == pytest.approx(0.69 * 2) and choice.market == "on-demand"
    assert fake.live() == []


def test_spot_bids_the_current_minimum_and_a_named_image_is_used(fake: RunPodFake) -> None:
    _, seen, _ = rent(fake, "A100", nodes=1, spot=True, image="ghcr.io/me/train:1")
    (asked,) = [v["input"] for v in fake.requests("podRentInterruptable")]
    assert asked["gpuTypeId"] == "NVIDIA A100 80GB PCIe"  # the cheaper A100 first
    assert asked["bidPerGpu"] == 0.82 and asked["imageName"] == "ghcr.io/me/train:1"
    assert seen[0]["interruptible"] is True


def test_an_amd_pool_gets_the_rocm_image_and_its_gpu_count(fake: RunPodFake) -> None:
    rent(fake, "MI300X:8", nodes=1)
    (asked,) = [v["input"] for v in fake.requests("podFindAndDeployOnDemand")]
    assert asked["gpuTypeId"] == "AMD Instinct MI300X OAM" and asked["gpuCount"] == 8
    assert asked["imageName"] == ROCM_IMAGE


def test_an_offer_gone_when_rented_moves_to_the_next_and_leaves_nothing_there(
    fake: RunPodFake,
) -> None:
    fake.no_capacity = {"NVIDIA A100 80GB PCIe"}
    reporter, seen, _ = rent(fake, "A100")
    types = [v["input"]["gpuTypeId"] for v in fake.requests("podFindAndDeployOnDemand")]
    assert types[:2] == ["NVIDIA A100 80GB PCIe"] * 2
    assert types[2:] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert "trying NVIDIA A100-SXM4-80GB on-demand" in " ".join(reporter.statuses)
    assert {p["gpuTypeId"] for p in seen} == {"NVIDIA A100-SXM4-80GB"}
    assert fake.live() == []


def test_when_no_offer_takes_the_pool_the_error_names_each_one_tried(fake: RunPodFake) -> None:
    fake.no_capacity = {"NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"}
    with pytest.raises(CapacityError) as caught:
        provider(fake).provision(request(1, accelerator="A100"), Recorder())
    message = str(caught.value)
    assert "tried 2" in message and "no capacity" in message, message
    assert "NVIDIA A100 80GB PCIe on-demand" in message
    assert "NVIDIA A100-SXM4-80GB on-demand" in message
    assert fake.live() == []
    fake.gpu_types = [t for t in fake.gpu_types if "A100" not in t.id]
    with pytest.raises(ProvisionError, match="RunPod has no 1 x A100 in stock"):
        provider(fake).provision(request(1, accelerator="A100"), Recorder())


def test_spot_if_available_falls_back_to_on_demand(fake: RunPodFake) -> None:
    fake.no_spot = {"NVIDIA GeForce RTX 4090"}  # no interruptible pod to be had now
    made = request(1, accelerator="RTX_4090", deadline=Checkpoint(STOP))
    made = dataclasses.replace(made, allocation="spot-if-available")
    reporter = Recorder()
    with pytest.raises(KeyboardInterrupt):
        provider(fake).provision(made, reporter)
    (rent,) = fake.requests("podRentInterruptable")
    assert rent["input"]["bidPerGpu"] == 0.2
    assert len(fake.requests("podFindAndDeployOnDemand")) == 1
    assert reporter.choices[0].market == "spot"
    assert "trying NVIDIA GeForce RTX 4090 on-demand" in " ".join(reporter.statuses)
    assert fake.live() == []


def test_out_of_credit_is_said_and_stops_the_failover(fake: RunPodFake) -> None:
    fake.balance = 0.1
    with pytest.raises(ProvisionError) as caught:
        provider(fake).provision(request(1, accelerator="A100"), Recorder())
    assert "lack of credit" in str(caught.value) and NO_FUNDS in str(caught.value)
    assert not isinstance(caught.value, CapacityError)
    assert len(fake.requests("podFindAndDeployOnDemand")) == 1


def test_max_hourly_cost_refuses_before_anything_is_rented(fake: RunPodFake) -> None:
    made = request(2, accelerator="H100")
    made = dataclasses.replace(made, max_hourly_cost=1.0)
    with pytest.raises(ProvisionError, match="above max_hourly_cost"):
        provider(fake).provision(made, Recorder())
    assert fake.requests("podFindAndDeployOnDemand") == []


# ── the leak matrix, up to the SSH stage (the rest is in test_runpod_standins.py) ─────────


@pytest.mark.parametrize(
    ("step", "rented"),
    [("reading RunPod's GPU types", 0), ("launching", 0), (STOP, 2)],
    ids=["before-offers", "before-rent", "after-rent"],
)
@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), ProvisionError("injected failure")], ids=["ctrl-c", "failure"]
)
def test_a_start_stopped_at_any_step_leaves_nothing(
    fake: RunPodFake, step: str, rented: int, error: BaseException
) -> None:
    at_stop: dict[str, int] = {}
    made = request(2, accelerator="RTX_4090")
    checkpoint = Checkpoint(step, error=error, reached=lambda: at_stop.update(n=len(fake.live())))
    made = dataclasses.replace(made, deadline=checkpoint)
    with pytest.raises(type(error)):
        provider(fake).provision(made, Recorder())
    assert at_stop["n"] == rented
    assert fake.live() == []


def test_a_pod_whose_rent_answer_was_lost_is_found_by_name_and_terminated(
    fake: RunPodFake,
) -> None:
    fake.lose_answers = 1  # the pod is made; the client hears a 502
    with pytest.raises(ProvisionError, match="HTTP 502"):
        provider(fake).provision(request(2, accelerator="RTX_4090"), Recorder())
    assert len(fake.requests("podFindAndDeployOnDemand")) == 2
    assert fake.live() == []
    assert len(fake.requests("GET /pods")) == 1  # the sweep by name found it


def test_pods_that_never_answer_fail_the_start_in_time_and_leave_nothing(
    fake: RunPodFake,
) -> None:
    fake.address_plan = lambda pod: ("127.0.0.1", 1)  # nothing listens there
    with pytest.raises(sky.ProvisionError) as caught:
        with sky.ComputePool(
            provider=provider(fake),
            accelerator="RTX_4090",
            nodes=2,
            name="unreachable",
            provision_timeout=4,
            quiet=True,
        ):
            pass
    error = caught.value.__cause__ or caught.value
    message = str(error) + "".join(getattr(error, "__notes__", []))
    assert "provision_timeout (4 s)" in message, message
    assert "RunPod maps the pod's port 22" in message, message
    assert fake.live() == []


# ── loss, leftovers ───────────────────────────────────────────────────────────────────────


def test_describe_says_a_spot_pod_was_interrupted_and_one_terminated_is_gone(
    fake: RunPodFake,
) -> None:
    from skyward.providers.runpod.api import Api
    from skyward.providers.runpod.machines import RunPodMachines

    machines = RunPodMachines(provider(fake), Api(KEY, fake.url), request(1))
    pod_id = _rent_one(fake, spot=True)
    (starting,) = machines.describe("", [pod_id])
    assert starting.state == "starting" and starting.reach is None  # no port 22 mapped yet
    (running,) = machines.describe("", [pod_id])
    assert running.state == "running" and running.reach is not None
    assert running.reach.port != 22 and running.reach.port == int(
        fake.live()[0]["portMappings"]["22"]
    )
    fake.interrupt(pod_id)
    (described,) = machines.describe("", [pod_id])
    assert described.state == "ended" and described.status == "EXITED"
    assert described.why.startswith("interrupted: RunPod stopped this spot pod (Outbid")
    (gone,) = machines.describe("", ["nosuchpod"])
    assert gone.state == "ended" and gone.status == "gone"


def _rent_one(fake: RunPodFake, *, spot: bool) -> str:
    from skyward.providers.runpod import api as runpod
    from skyward.providers.runpod.api import Api

    spec = {
        "name": "skyward-x-000000-n0",
        "gpuTypeId": "NVIDIA GeForce RTX 4090",
        "gpuCount": 1,
        "imageName": CUDA_IMAGE,
        "cloudType": "SECURE",
        "env": [{"key": TAGS_ENV, "value": json.dumps({"skyward-pool": "left"})}],
    }
    if spot:
        spec["bidPerGpu"] = 0.2
    return runpod.deploy(Api(KEY, fake.url), spec, spot=spot, doing="test")


def test_the_inventory_lists_skywards_pods_and_down_terminates_them(
    fake: RunPodFake,
) -> None:
    kept = _rent_one(fake, spot=False)
    stopped = _rent_one(fake, spot=True)
    fake.stop(stopped)
    inventory = provider(fake).inventory()
    assert inventory is not None
    found = {x.id: x for x in inventory.leftovers(pool="left")}
    assert set(found) == {kept, stopped}
    assert found[kept].state == "running" and found[kept].hourly_cost == pytest.approx(0.69)
    assert found[stopped].state == "exited" and found[stopped].hourly_cost is None
    assert inventory.leftovers(pool="another") == []
    inventory.delete(list(found.values()), Recorder())
    assert fake.live() == []


# ── a client ended by a signal (a job scheduler's cancel, a closed terminal) ──────────────

_CLIENT = """
import skyward as sky
runpod = sky.RunPod(api_key={key!r}, endpoint_url={url!r}, release_timeout=30, boot_timeout=120)
with sky.ComputePool(provider=runpod, accelerator="RTX_4090", nodes=2, name={pool!r},
                     console="plain") as pool:
    print("READY", flush=True)
"""


@pytest.mark.parametrize("stage", ["renting", "connecting"])
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_client_ended_by_a_signal_at_any_stage_leaves_nothing(
    fake: RunPodFake, tmp_path: Path, stage: str, signal_name: str
) -> None:
    answer = threading.Event()
    if stage == "renting":  # the rents are made, their answers held until the signal
        fake.on_rent = lambda pod: answer.wait(30)
    # Nothing listens there: SSH is refused and retried, as while a pod boots.
    fake.address_plan = lambda pod: ("127.0.0.1", 9)
    pool = f"signalled-{stage[:3]}-{signal_name.lower()}"
    script = _CLIENT.format(key=KEY, url=fake.url, pool=pool)
    log = tmp_path / "client.log"
    with open(log, "wb") as out:  # signalled as from a terminal, however this run started
        client = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=out,
            stderr=out,
            env={**os.environ, "TMPDIR": str(tmp_path)},
            preexec_fn=as_from_a_terminal,
        )
    try:
        end = time.monotonic() + 60
        while not (
            len(fake.live()) == 2 if stage == "renting" else "connecting" in log.read_text()
        ):
            assert client.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.05)
        client.send_signal(getattr(signal, signal_name))
        answer.set()
        status = client.wait(60)
    finally:
        answer.set()
        client.kill()
        client.wait(30)
    assert status == -getattr(signal, signal_name), log.read_text()
    assert fake.live() == [], log.read_text()
    assert not list(tmp_path.glob("skyward-key-*/id_ed25519"))  # the pool key went too
