"""The Lambda provider against a fake of Lambda Cloud's REST API (a real HTTP endpoint in its
JSON and error shapes): what it asks Lambda for, what it says when Lambda refuses, how it
moves to another region or type, and that an interrupted or failed start leaves nothing.
Reaching the instances over SSH is in ``test_lambda_standins.py``."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError
from support import cloudinit
from support.clouds.aws.pools import Checkpoint, key_file_of, request
from support.clouds.lambdacloud.fake import (
    INTERNAL,
    KEY,
    QUOTA,
    RATE_LIMITED,
    ApiError,
    LambdaFake,
    no_capacity,
)
from support.clouds.lambdacloud.standins import held, nothing, provider
from support.dispositions import as_from_a_terminal
from support.reporter import Recorder

import skyward as sky
from skyward._errors import ProvisionError
from skyward.client.phases import SilentReporter
from skyward.providers.cloud.boot import WATCHDOG_PATH
from skyward.providers.cloud.capacity import CapacityError
from skyward.providers.lambdacloud import credentials

pytestmark = pytest.mark.timeout(120)


def _stopped(fake: LambdaFake, lam: sky.Lambda, step: str = "waiting for", **options: Any) -> Any:
    """Provision until ``step``, look at the fake there, then Ctrl-C: what it held."""
    seen: dict[str, Any] = {}

    def look() -> None:
        seen["held"] = held(fake, made.pool)
        seen["launches"] = [r.body for r in fake.requests("POST", "instance-operations/launch")]
        seen["keys"] = [r.body for r in fake.requests("POST", "ssh-keys")]
        seen["rulesets"] = [r.body for r in fake.requests("POST", "firewall-rulesets")]

    made = request(deadline=Checkpoint(step, reached=look), **options)
    with pytest.raises(KeyboardInterrupt):
        lam.provision(made, Recorder())
    seen["pool"] = made.pool
    assert nothing(held(fake, made.pool))
    return seen


# ── before anything is rented ────────────────────────────────────────────────────────────


def test_accelerators_are_lambdas_types_from_the_catalog_and_instance_type_wins(
    lam: LambdaFake,
) -> None:
    def first(accelerator: str | None, **options: Any) -> str:
        sizes = {k: options.pop(k) for k in ("vcpus", "memory_gb") if k in options}
        made = dataclasses.replace(request(accelerator=accelerator), **sizes)
        return provider(lam, **options).machines_for(made)[0].type

    assert first("H100") == "gpu_1x_h100_pcie"
    assert first("H100:8") == "gpu_8x_h100_sxm5"
    assert first("A100:8") == "gpu_8x_a100"
    assert first("A100-80GB:8") == "gpu_8x_a100_80gb_sxm4"
    assert first("GH200") == "gpu_1x_gh200"
    assert first("B200:8") == "gpu_8x_b200_sxm6"
    assert first("H100", memory_gb=210) == "gpu_1x_h100_sxm5"
    assert first(None, instance_type="gpu_1x_a10") == "gpu_1x_a10"  # not in the catalog
    assert lam.requests() == []


def test_bad_settings_are_validation_errors_naming_the_field() -> None:
    for settings, field in [
        ({"region": "Virginia"}, "region"),
        ({"endpoint_url": "cloud.lambda.ai"}, "endpoint_url"),
        ({"instance_type": "8x H100"}, "instance_type"),
        ({"ssh_cidr": "everyone"}, "ssh_cidr"),
        ({"file_system": "data"}, "region"),  # a file system lives in one region
    ]:
        with pytest.raises(ValidationError) as caught:
            sky.Lambda(**settings)
        assert field in str(caught.value)
    assert "secret" not in repr(sky.Lambda(api_key="secret"))


def test_cpu_pools_spot_and_a_missing_key_are_refused_when_the_pool_is_built(
    lam: LambdaFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="Lambda Cloud rents GPU machines only"):
        sky.ComputePool(provider=provider(lam), quiet=True)
    with pytest.raises(ValueError, match="allocation='spot' cannot be honoured: Lambda Cloud"):
        sky.ComputePool(provider=provider(lam), accelerator="H100", allocation="spot", quiet=True)
    with pytest.raises(ValueError, match="no spot instances"):
        sky.ComputePool(provider=provider(lam, spot=True), accelerator="H100", quiet=True)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ProvisionError, match=r"no Lambda Cloud API key.*LAMBDA_API_KEY"):
        sky.ComputePool(provider=provider(lam, api_key=None), accelerator="H100", quiet=True)
    (tmp_path / ".lambda_cloud").mkdir()
    (tmp_path / ".lambda_cloud" / "lambda_keys").write_text(f"api_key = {KEY}\n")
    sky.ComputePool(provider=provider(lam, api_key=None), accelerator="H100", quiet=True)
    assert lam.requests() == []
    assert credentials.check({}, tmp_path).detail.endswith("lambda_keys")
    assert credentials.check({}, tmp_path / "nowhere").status == "missing"
    assert credentials.check({"LAMBDA_API_KEY": "k"}, tmp_path).detail == "from LAMBDA_API_KEY"


def test_a_refused_key_is_said_before_anything_is_rented(lam: LambdaFake) -> None:
    with pytest.raises(ProvisionError) as caught:
        provider(lam, api_key="expired").provision(request(accelerator="H100"), Recorder())
    message = str(caught.value)
    assert "Lambda Cloud refused the credentials (API key was invalid" in message
    assert "LAMBDA_API_KEY" in message
    assert [r.path for r in lam.requests()] == ["instance-types"]


def test_no_capacity_anywhere_names_the_types_with_some_and_creates_nothing(
    lam: LambdaFake,
) -> None:
    with pytest.raises(ProvisionError) as caught:
        provider(lam).provision(request(accelerator="B200:8"), Recorder())
    message = str(caught.value)
    assert "no capacity now for gpu_8x_b200_sxm6 in any region; nothing was created" in message
    assert "gpu_1x_h100_pcie" in message
    assert [r.method for r in lam.requests()] == ["GET"]


def test_max_hourly_cost_refuses_before_anything_is_created(lam: LambdaFake) -> None:
    with pytest.raises(ProvisionError, match="above max_hourly_cost"):
        sky.ComputePool(
            provider=provider(lam), accelerator="H100:8", nodes=2, max_hourly_cost=10, quiet=True
        )
    assert lam.requests() == []


# ── what a pool asks Lambda for ─────────────────────────────────────────────────────────


def test_one_launch_carries_every_node_the_key_the_ruleset_tags_and_the_user_data(
    lam: LambdaFake,
) -> None:
    seen = _stopped(lam, provider(lam, idle_timeout=600, boot_timeout=900), accelerator="H100")
    (key,) = seen["keys"]
    (ruleset,) = seen["rulesets"]
    (launch,) = seen["launches"]
    assert key["name"].startswith(f"skyward-{seen['pool']}-")
    assert key["public_key"].startswith("ssh-ed25519 ")
    assert ruleset == {
        "name": key["name"],
        "region": "us-east-1",
        "rules": [
            {
                "protocol": "tcp",
                "port_range": [22, 22],
                "source_network": "10.123.0.0/16",
                "description": "SSH from the Skyward client",
            }
        ],
    }
    assert launch["region_name"] == "us-east-1"  # the first region with capacity
    assert launch["instance_type_name"] == "gpu_1x_h100_pcie"
    assert launch["quantity"] == 2 and launch["ssh_key_names"] == [key["name"]]
    assert launch["name"].startswith(key["name"])
    tags = {t["key"]: t["value"] for t in launch["tags"]}
    assert tags["skyward-pool"] == seen["pool"] and "skyward-owner" in tags
    assert len(launch["firewall_rulesets"]) == 1
    document = yaml.safe_load(launch["user_data"])
    schema = cloudinit.schema()
    assert [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(document)] == []
    assert set(document) <= cloudinit.known_keys(schema)
    assert document["ssh_authorized_keys"] == [key["public_key"]]
    assert document["ssh_keys"]["ed25519_public"].startswith("ssh-ed25519 ")
    runcmd = " ".join(" ".join(c) for c in document["runcmd"])
    assert f"{WATCHDOG_PATH} 600 22 10 1020" in runcmd
    assert KEY not in launch["user_data"]  # the account's key never goes on a machine
    assert key_file_of(key["public_key"]) is None  # the pool key went with the pool
    terminated = lam.requests("POST", "instance-operations/terminate")
    assert len(terminated) == 1 and len(terminated[0].body["instance_ids"]) == 2


def test_spot_if_available_gets_on_demand_and_a_file_system_is_attached(lam: LambdaFake) -> None:
    lam_ = provider(lam, region="us-west-1", file_system="datasets")
    recorder = Recorder()
    made = request(accelerator="H100", deadline=Checkpoint("waiting for"))
    made = dataclasses.replace(made, allocation="spot-if-available")
    with pytest.raises(KeyboardInterrupt):
        lam_.provision(made, recorder)
    (launch,) = [r.body for r in lam.requests("POST", "instance-operations/launch")]
    assert launch["region_name"] == "us-west-1" and launch["file_system_names"] == ["datasets"]
    (choice,) = recorder.choices
    assert choice.market == "on-demand" and choice.hourly == 2.49


def test_no_capacity_moves_to_the_next_region_then_the_next_type(lam: LambdaFake) -> None:
    lam.fail("POST", "instance-operations/launch", no_capacity(), times=2)
    recorder = Recorder()
    seen = _stopped(lam, provider(lam), accelerator="H100")
    launches = [(x["instance_type_name"], x["region_name"]) for x in seen["launches"]]
    assert launches == [
        ("gpu_1x_h100_pcie", "us-east-1"),
        ("gpu_1x_h100_pcie", "us-west-1"),
        ("gpu_1x_h100_sxm5", "us-west-1"),
    ]
    # One ruleset per region the pool tried, all deleted with it.
    assert [r["region"] for r in seen["rulesets"]] == ["us-east-1", "us-west-1"]
    del recorder


def test_when_every_place_refuses_the_error_names_each_one_tried(lam: LambdaFake) -> None:
    lam.fail("POST", "instance-operations/launch", no_capacity(), times=None)
    made = request(accelerator="H100")
    with pytest.raises(CapacityError) as caught:
        provider(lam).provision(made, Recorder())
    message = str(caught.value)
    assert "tried 3" in message
    for place in (
        "gpu_1x_h100_pcie on-demand in us-east-1",
        "gpu_1x_h100_sxm5 on-demand in us-west-1",
    ):
        assert place in message
    assert nothing(held(lam, made.pool))


def test_a_quota_says_so_and_a_rate_limit_is_waited_out(lam: LambdaFake) -> None:
    lam.fail("POST", "instance-operations/launch", RATE_LIMITED, times=1)
    seen = _stopped(lam, provider(lam), accelerator="H100")
    assert len(seen["launches"]) == 2  # the 429, then the launch
    lam.fail("POST", "instance-operations/launch", QUOTA, times=1)
    made = request(accelerator="H100")
    with pytest.raises(ProvisionError, match="your Lambda Cloud quota is reached"):
        provider(lam).provision(made, Recorder())
    assert nothing(held(lam, made.pool))


def test_an_instance_that_turns_unhealthy_fails_the_start_and_leaves_nothing(
    lam: LambdaFake,
) -> None:
    lam.boot_reads = 1000  # booting until the test says otherwise

    def sicken() -> bool:
        for instance in lam.listed()[:1]:
            lam.make_unhealthy(instance["id"])
        return False

    made = request(accelerator="H100", deadline=Checkpoint("waiting for", when=sicken))
    with pytest.raises(ProvisionError) as caught:
        provider(lam).provision(made, Recorder())
    assert "is unhealthy: Lambda Cloud reports it unhealthy" in str(caught.value)
    assert nothing(held(lam, made.pool))


def test_a_launch_whose_answer_is_lost_is_still_terminated_by_name(lam: LambdaFake) -> None:
    lam.fail("POST", "instance-operations/launch", INTERNAL, after=True)
    made = request(accelerator="H100")
    with pytest.raises(ProvisionError, match="global/internal-error"):
        provider(lam).provision(made, Recorder())
    assert len(lam.requests("POST", "instance-operations/launch")) == 1  # a create: once
    (terminated,) = lam.requests("POST", "instance-operations/terminate")
    assert len(terminated.body["instance_ids"]) == 2
    assert nothing(held(lam, made.pool))


def test_a_termination_lambda_refuses_while_instances_launch_is_asked_again(
    lam: LambdaFake,
) -> None:
    conflict = ApiError(409, "global/conflict", "The request conflicts with the current state.")
    lam.fail("POST", "instance-operations/terminate", conflict, times=1)
    seen = _stopped(lam, provider(lam), accelerator="H100")  # asserts nothing is held
    terminations = lam.requests("POST", "instance-operations/terminate")
    assert [r.status for r in terminations] == [409, 200]
    assert seen["held"]["instances"]


# ── the leak matrix ──────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("step", "made_by_then"),
    [
        ("registering the pool's SSH key", set()),
        ("creating the firewall ruleset", {"ssh keys"}),
        ("launching 2 x", {"ssh keys", "rulesets"}),
        ("waiting for", {"ssh keys", "rulesets", "instances"}),
    ],
    ids=["before-key", "before-ruleset", "before-launch", "booting"],
)
@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), ProvisionError("injected failure")], ids=["ctrl-c", "failure"]
)
def test_a_start_stopped_at_any_step_leaves_nothing(
    lam: LambdaFake, step: str, made_by_then: set[str], error: BaseException
) -> None:
    at_stop: dict[str, Any] = {}
    made = request(
        accelerator="H100",
        deadline=Checkpoint(
            step, error=error, reached=lambda: at_stop.update(held(lam, made.pool))
        ),
    )
    with pytest.raises(type(error)):
        provider(lam).provision(made, Recorder())
    assert {kind for kind, names in at_stop.items() if names} == made_by_then
    assert nothing(held(lam, made.pool))
    for key in lam.requests("POST", "ssh-keys"):
        assert key_file_of(key.body["public_key"]) is None


_CLIENT = """
import skyward as sky
lam = sky.Lambda(api_key={key!r}, endpoint_url={url!r}, ssh_cidr="10.123.0.0/16",
                 release_timeout=30, boot_timeout=120)
with sky.ComputePool(provider=lam, accelerator="H100", nodes=2, name={pool!r},
                     console="plain") as pool:
    print("READY", flush=True)
"""


@pytest.mark.parametrize("stage", ["booting", "connecting"])
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_client_ended_by_a_signal_at_any_stage_leaves_nothing(
    lam: LambdaFake, tmp_path: Path, stage: str, signal_name: str
) -> None:
    import signal as signals
    import time

    if stage == "booting":
        lam.boot_reads = 10_000  # they boot for as long as the client waits
    else:  # nothing listens there: SSH is refused, and retried as while a VM boots
        lam.address_plan = lambda region, n: (f"127.0.0.{30 + n}", f"127.0.0.{30 + n}")
    pool = f"signalled-{stage[:4]}-{signal_name.lower()}"
    script = _CLIENT.format(key=KEY, url=lam.url, pool=pool)
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
        while (
            len(lam.requests("GET", "instances")) < 2
            if stage == "booting"
            else "connecting" not in log.read_text()
        ):
            assert client.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.05)
        (key,) = lam.requests("POST", "ssh-keys")
        assert key_file_of(key.body["public_key"], tmp_path) is not None
        client.send_signal(getattr(signals, signal_name))
        status = client.wait(60)
    finally:
        client.kill()
        client.wait(30)
        lam.address_plan = None
    assert status == -getattr(signals, signal_name), log.read_text()
    assert nothing(held(lam, pool)), log.read_text()
    assert key_file_of(key.body["public_key"], tmp_path) is None


# ── teardown, loss, leftovers ────────────────────────────────────────────────────────────


def test_what_teardown_cannot_delete_is_named_and_ls_down_find_it_by_name(
    lam: LambdaFake,
) -> None:
    lam.fail("DELETE", "ssh-keys/*", QUOTA, times=None)
    made = request(pool="undeletable", accelerator="H100", deadline=Checkpoint("waiting for"))
    with pytest.raises(KeyboardInterrupt) as caught:
        provider(lam).provision(made, SilentReporter())
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "could not delete ssh key" in notes and "on Lambda Cloud" in notes
    assert "skyward down --pool undeletable --cloud lambdacloud" in notes
    assert held(lam, "undeletable")["ssh keys"] and not held(lam, "undeletable")["instances"]
    lam.faults.clear()
    inventory = provider(lam).inventory()
    assert inventory is not None
    found = inventory.leftovers(pool="undeletable")
    assert {(x.kind, x.pool) for x in found} == {("ssh key", "undeletable")}
    inventory.delete(found, SilentReporter())
    assert nothing(held(lam, "undeletable"))


def test_ls_lists_a_killed_clients_instances_with_their_price_and_down_ends_them(
    lam: LambdaFake,
) -> None:
    lam.fail("POST", "instance-operations/terminate", INTERNAL, times=None)
    made = request(pool="orphaned", accelerator="H100", deadline=Checkpoint("waiting for"))
    with pytest.raises(KeyboardInterrupt):
        provider(lam, release_timeout=3).provision(made, SilentReporter())
    lam.faults.clear()
    inventory = provider(lam).inventory()
    assert inventory is not None
    found = inventory.leftovers()
    kinds = sorted((x.kind, x.pool, x.region) for x in found)
    assert kinds == [
        ("firewall ruleset", "orphaned", "us-east-1"),
        ("instance", "orphaned", "us-east-1"),
        ("instance", "orphaned", "us-east-1"),
    ]  # the key went: only the instances and the ruleset they use are left
    assert {x.hourly_cost for x in found if x.kind == "instance"} == {2.49}
    inventory.delete(found, SilentReporter())
    assert nothing(held(lam, "orphaned"))


def test_loss_reason_says_why_an_instance_ended(lam: LambdaFake) -> None:
    from skyward.providers.cloud.start import CloudPool

    lam_ = provider(lam)
    made = request(accelerator="H100", deadline=Checkpoint("connecting"))
    lam.boot_reads = 0
    pool = CloudPool(lam_, lam_.machines(made), made)
    with pytest.raises(KeyboardInterrupt):
        pool.open(SilentReporter())
    ids = [id for _, id in pool.record.machines()]
    lam.make_unhealthy(ids[0])
    # A quick look may share a listing up to a second old (Lambda's rate limit).
    assert "Lambda Cloud reports it unhealthy" in _eventually(lambda: pool.loss_reason(0))
    pool.terminate()
    said = _eventually(lambda: pool.loss_reason(1))
    assert "is terminated: ended through the API or the console" in said
    assert nothing(held(lam, made.pool))


def test_instances_that_never_answer_fail_the_start_in_time_and_leave_nothing(
    lam: LambdaFake,
) -> None:
    # Nothing listens on these addresses: SSH is refused, and retried as while VMs boot.
    lam.address_plan = lambda region, n: (f"127.0.0.{20 + n}", f"127.0.0.{20 + n}")
    try:
        with pytest.raises(sky.ProvisionError) as caught:
            with sky.ComputePool(
                provider=provider(lam, connect="private"),
                accelerator="H100",
                nodes=2,
                name="unreachable",
                provision_timeout=4,
                quiet=True,
            ):
                pass
    finally:
        lam.address_plan = None
    error = caught.value.__cause__ or caught.value
    message = str(error) + "".join(getattr(error, "__notes__", []))
    assert "provision_timeout (4 s)" in message, message
    assert "SSH did not answer from here" in message, message
    assert "the pool's firewall ruleset" in message and "ssh_cidr" in message, message
    assert nothing(held(lam, "unreachable"))


def _eventually(reason: Any) -> str:
    """``reason()`` once it says something (within 10 s)."""
    import time

    end = time.monotonic() + 10
    while (said := reason()) is None and time.monotonic() < end:
        time.sleep(0.2)
    return str(said)
