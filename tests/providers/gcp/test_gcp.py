"""The GCP provider against the Compute Engine fake (a real HTTP endpoint the real
google-cloud-compute talks to): what it asks GCE for, what it says when GCE refuses, how it
moves to another zone, and that an interrupted or failed start leaves nothing behind.
Reaching the instances over SSH is in ``test_gcp_standins.py``."""

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
from support.clouds.gcp.fake import (
    ACCELERATOR_TYPES,
    BACKEND_ERROR,
    QUOTA_EXCEEDED,
    QUOTA_EXCEEDED_IN_OPERATION,
    RESOURCE_POOL_EXHAUSTED,
    AcceleratorType,
    Fault,
    GCPFake,
)
from support.clouds.gcp.standins import PROJECT, ZONE, held, metadata_of, nothing, provider
from support.dispositions import as_from_a_terminal
from support.reporter import Recorder

import skyward as sky
from skyward._errors import ProvisionError
from skyward.client.phases import SilentReporter
from skyward.providers.cloud import catalog
from skyward.providers.cloud.boot import BEFORE_POWEROFF_PATH, WATCHDOG_PATH
from skyward.providers.cloud.capacity import CapacityError, Offer
from skyward.providers.cloud.catalog import Machine
from skyward.providers.cloud.start import CloudPool
from skyward.providers.gcp.api import Api

pytestmark = pytest.mark.timeout(120)

DENIED = Fault(
    403,
    "forbidden",
    "Required 'compute.firewalls.create' permission for 'projects/{project}/global/firewalls'",
)


# ── before anything is touched ─────────────────────────────────────────────────────────


def test_an_unknown_count_is_refused_when_the_pool_is_built_listing_what_exists(
    gce: GCPFake,
) -> None:
    with pytest.raises(ValueError) as caught:
        sky.ComputePool(provider=provider(gce), accelerator="L4:3", nodes=2, quiet=True)
    assert "'L4-24GB:2' (g2-standard-24)" in str(caught.value)
    assert gce.requests() == []


def test_machines_come_from_the_catalog_and_machine_type_wins(gce: GCPFake) -> None:
    def first(gcp: sky.GCP, accelerator: str | None, **sizes: Any) -> str:
        return gcp.machines_for(request(accelerator=accelerator, **sizes))[0].type

    assert first(provider(gce), "H100") == "a3-highgpu-8g"  # 1-4 GPU A3s are spot only
    assert first(provider(gce), "A100-80GB:1") == "a2-ultragpu-1g"
    assert first(provider(gce), None) == "n2-standard-4"
    assert first(provider(gce, machine_type="n2-standard-8"), None) == "n2-standard-8"
    with pytest.raises(ValueError, match="fewer than vcpus=64"):
        sky.ComputePool(provider=provider(gce, machine_type="n2-standard-8"), vcpus=64, quiet=True)


def test_bad_settings_are_validation_errors_naming_the_field() -> None:
    for settings, field in [
        ({"ssh_cidr": "everyone"}, "ssh_cidr"),
        ({"zone": "central"}, "zone"),
        ({"image": "ubuntu"}, "image"),
        ({"connect": "bastion"}, "connect"),
        ({"disk_gb": 2}, "disk_gb"),
        ({"idle_timeout": 0}, "idle_timeout"),
        ({"network": "Not A Name"}, "network"),
    ]:
        with pytest.raises(ValidationError) as caught:
            sky.GCP(**settings)
        assert field in str(caught.value)


def test_no_zone_or_region_and_a_zone_outside_its_region_are_said_at_once(
    gce: GCPFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("CLOUDSDK_COMPUTE_ZONE", "CLOUDSDK_COMPUTE_REGION"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ProvisionError, match="CLOUDSDK_COMPUTE_ZONE"):
        sky.ComputePool(provider=provider(gce, zone=None), quiet=True)
    with pytest.raises(ValueError, match="us-east4-a is not in region us-central1"):
        sky.ComputePool(provider=provider(gce, zone="us-east4-a", region="us-central1"), quiet=True)
    assert gce.requests() == []


_BUILD = """
import sys
{hide}
import skyward as sky
try:
    sky.ComputePool(provider=sky.GCP(zone='us-central1-a'{project}), nodes=1, quiet=True)
    print('BUILT')
except (sky.MissingDependency, sky.ProvisionError) as e:
    print(type(e).__name__, e)
"""


def _build_elsewhere(gce: GCPFake, *, hide: str = "", project: str = "") -> str:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_", "GCE_"))
    }
    env.update(gce.environ(), HOME="/nonexistent", CLOUDSDK_CONFIG="/nonexistent")
    done = subprocess.run(
        [sys.executable, "-c", _BUILD.format(hide=hide, project=project)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    return done.stdout + done.stderr


def test_a_missing_sdk_names_the_extra_when_the_pool_is_built(gce: GCPFake) -> None:
    out = _build_elsewhere(gce, hide="sys.modules['google.cloud.compute_v1'] = None")
    assert "MissingDependency" in out and "pip install 'skyward[gcp]'" in out, out


def test_no_credentials_say_how_to_give_them_when_the_pool_is_built(gce: GCPFake) -> None:
    out = _build_elsewhere(gce, project=", project='my-proj-1'")
    assert "ProvisionError no Google Cloud credentials" in out, out
    assert "gcloud auth application-default login" in out


def test_no_project_says_how_to_name_one(gce: GCPFake, tmp_path: Any) -> None:
    from google.auth.credentials import AnonymousCredentials

    gcp = provider(gce, project=None, credentials=AnonymousCredentials())
    with pytest.raises(ProvisionError, match="GOOGLE_CLOUD_PROJECT"):
        gcp.check(request())


# ── what the provider asks GCE for ─────────────────────────────────────────────────────


def _stopped_after_launch(gce: GCPFake, gcp: sky.GCP, **options: Any) -> tuple[dict[str, Any], str]:
    seen: dict[str, Any] = {}

    def look() -> None:
        seen["instances"] = [i for i in gce.instances(PROJECT) if i["status"] == "RUNNING"]
        seen["firewalls"] = gce.firewalls(PROJECT)

    made = request(deadline=Checkpoint("waiting for", reached=look), **options)
    with pytest.raises(KeyboardInterrupt):
        gcp.provision(made, Recorder())
    assert nothing(held(gce, made.pool))
    return seen, made.pool


def test_instances_carry_labels_keys_user_data_tag_and_a_disk_deleted_with_them(
    gce: GCPFake,
) -> None:
    seen, pool = _stopped_after_launch(
        gce, provider(gce, disk_gb=120, idle_timeout=600, boot_timeout=900), accelerator="L4"
    )
    instances = seen["instances"]
    assert len(instances) == 2 and len({i["name"] for i in instances}) == 2
    assert len({tuple(i["tags"]["items"]) for i in instances}) == 1
    for instance in instances:
        assert instance["labels"]["skyward-pool"] == pool
        assert {"skyward-owner", "skyward-created"} <= set(instance["labels"])
        assert instance["zone"].endswith(f"/zones/{ZONE}")
        assert instance["machineType"].endswith("/machineTypes/g2-standard-4")
        assert "guestAccelerators" not in instance or instance["guestAccelerators"][0][
            "acceleratorType"
        ].endswith("nvidia-l4")  # built in, as GCE reports it
        assert instance["scheduling"]["onHostMaintenance"] == "TERMINATE"
        assert instance["scheduling"]["provisioningModel"] == "STANDARD"
        (disk,) = instance["disks"]
        assert disk["boot"] and disk["autoDelete"] and disk["diskSizeGb"] == "120"
        assert instance["serviceAccounts"][0]["scopes"] == [
            "https://www.googleapis.com/auth/compute"
        ]
        interface = instance["networkInterfaces"][0]
        assert interface["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"  # connect="public"
    user, entry = metadata_of(instances[0], "ssh-keys").split(":", 1)
    key = " ".join(entry.split()[:2])
    assert user == "skyward" and key.startswith("ssh-ed25519 ")
    assert metadata_of(instances[0], "block-project-ssh-keys") == "TRUE"
    assert metadata_of(instances[0], "enable-oslogin") == "FALSE"
    text = metadata_of(instances[0], "user-data")
    document = yaml.safe_load(text)
    schema = cloudinit.schema()
    assert [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(document)] == []
    assert set(document) <= cloudinit.known_keys(schema)
    assert document["ssh_authorized_keys"] == [key]
    assert document["ssh_keys"]["ed25519_public"].startswith("ssh-ed25519 ")
    runcmd = " ".join(" ".join(c) for c in document["runcmd"])
    assert f"{WATCHDOG_PATH} 600 22 10 1020" in runcmd  # boot_timeout + 120 for a first client
    hooks = [f for f in document["write_files"] if f["path"] == BEFORE_POWEROFF_PATH]
    assert len(hooks) == 1 and "instances/$name" in hooks[0]["content"]
    assert key_file_of(key) is None  # the pool key went with the pool


@pytest.mark.parametrize(
    ("accelerator", "machine_type", "attached"),
    [
        (None, "n2-standard-4", None),
        ("T4", "n1-standard-4", ("nvidia-tesla-t4", 1)),
        ("A100-80GB:1", "a2-ultragpu-1g", None),
        ("H100:8", "a3-highgpu-8g", None),
    ],
)
def test_each_kind_of_machine_is_asked_for_as_gce_sells_it(
    gce: GCPFake, accelerator: str | None, machine_type: str, attached: tuple[str, int] | None
) -> None:
    seen, _ = _stopped_after_launch(gce, provider(gce), accelerator=accelerator, nodes=1)
    (instance,) = seen["instances"]
    assert instance["machineType"].endswith(f"/{machine_type}")
    asked = gce.requests("POST", f"projects/{PROJECT}/zones/*/instances")[0].body
    assert asked is not None
    if attached is None:
        assert "guestAccelerators" not in asked
    else:
        (config,) = asked["guestAccelerators"]
        assert config["acceleratorType"].endswith(f"/acceleratorTypes/{attached[0]}")
        assert int(config["acceleratorCount"]) == attached[1]
    gpu = accelerator is not None
    image = asked["disks"][0]["initializeParams"]["sourceImage"]
    assert ("deeplearning-platform-release" in image) == gpu
    assert ("ubuntu-os-cloud" in image) == (not gpu)
    assert instance["scheduling"]["onHostMaintenance"] == ("TERMINATE" if gpu else "MIGRATE")


def test_a_zone_without_the_attached_gpu_is_passed_over_before_any_insert(gce: GCPFake) -> None:
    # N1 machines are everywhere; the T4 (acceleratorTypes.list) only in -b and -c here.
    t4 = AcceleratorType(
        "nvidia-tesla-t4", "NVIDIA T4", 4, frozenset({"us-central1-b", "us-central1-c"})
    )
    others = [a for a in ACCELERATOR_TYPES if a.name != t4.name]
    with GCPFake(accelerator_types=[t4, *others]) as fake:
        seen, _ = _stopped_after_launch(fake, provider(fake), accelerator="T4", nodes=1)
        assert [i["zone"].rsplit("/", 1)[-1] for i in seen["instances"]] == ["us-central1-b"]
        assert fake.requests("POST", f"projects/{PROJECT}/zones/{ZONE}/instances") == []
        assert fake.requests("GET", f"projects/{PROJECT}/zones/{ZONE}/acceleratorTypes")


def test_spot_is_asked_with_deletion_when_gce_reclaims_it(gce: GCPFake) -> None:
    seen, _ = _stopped_after_launch(gce, provider(gce, spot=True), accelerator="L4")
    for instance in seen["instances"]:
        scheduling = instance["scheduling"]
        assert scheduling["provisioningModel"] == "SPOT"
        assert scheduling["instanceTerminationAction"] == "DELETE"
        assert scheduling["automaticRestart"] is False


def test_the_rules_let_in_ssh_from_the_client_only_and_everything_within_the_pool(
    gce: GCPFake,
) -> None:
    seen, pool = _stopped_after_launch(gce, provider(gce, ssh_cidr="203.0.113.7/32"))
    rules = {r["name"].rsplit("-", 1)[-1]: r for r in seen["firewalls"]}
    assert set(rules) == {"ssh", "pool"}
    (tag,) = {t for i in seen["instances"] for t in i["tags"]["items"]}
    ssh, within = rules["ssh"], rules["pool"]
    assert ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert ssh["sourceRanges"] == ["203.0.113.7/32"] and ssh["targetTags"] == [tag]
    assert within["allowed"] == [{"IPProtocol": "all"}]
    assert within["sourceTags"] == [tag] and within["targetTags"] == [tag]
    assert "sourceRanges" not in within
    for rule in rules.values():  # firewall rules take no labels: the tags ride along
        assert f'"skyward-pool": "{pool}"' in rule["description"]


def test_a_private_pool_gets_no_external_address(gce: GCPFake) -> None:
    seen, _ = _stopped_after_launch(gce, provider(gce, connect="private", ssh_cidr="auto"))
    assert all("accessConfigs" not in i["networkInterfaces"][0] for i in seen["instances"])
    ssh = next(r for r in seen["firewalls"] if r["name"].endswith("-ssh"))
    assert ssh["sourceRanges"] == ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]


def test_the_catalog_agrees_with_gce_on_every_type_gce_describes(gce: GCPFake) -> None:
    api = _api(gce)
    for name in {m.type for m in catalog.machines("gcp")}:
        try:
            described = api.machine_types.get(project=PROJECT, zone=ZONE, machine_type=name)
        except Exception:
            continue  # not in this fake's (or this zone's) catalogue
        for machine in (m for m in catalog.machines("gcp") if m.type == name):
            assert described.guest_cpus == machine.vcpus, name
            assert abs(described.memory_mb / 1024 - machine.ram_gb) < 1, name
            built_in = [a.guest_accelerator_count for a in described.accelerators]
            assert built_in == ([] if machine.attach or not machine.count else [machine.count])


# ── when GCE refuses ───────────────────────────────────────────────────────────────────


def test_a_quota_is_named_with_its_region_and_nothing_is_left(gce: GCPFake) -> None:
    gce.fail_next_insert(ZONE, QUOTA_EXCEEDED)
    made = request(accelerator="A100")
    with pytest.raises(ProvisionError) as caught:
        provider(gce).provision(made, SilentReporter())
    assert "quota NVIDIA_A100_GPUS in us-central1 is too small" in str(caught.value)
    assert not isinstance(caught.value, CapacityError)  # another zone would not help
    assert nothing(held(gce, made.pool))


def test_an_exhausted_zone_moves_the_pool_to_the_next_zone_and_leaves_nothing_there(
    gce: GCPFake,
) -> None:
    gce.fail_next_insert(ZONE, RESOURCE_POOL_EXHAUSTED, times=None)
    recorder = Recorder()
    seen, _ = {}, None
    made = request(
        accelerator="L4",
        deadline=Checkpoint(
            "waiting for", reached=lambda: seen.update(held=gce.instances(PROJECT))
        ),
    )
    with pytest.raises(KeyboardInterrupt):
        provider(gce).provision(made, recorder)
    zones = {i["zone"].rsplit("/", 1)[-1] for i in seen["held"]}
    assert zones == {"us-central1-b"}
    assert any(
        "g2-standard-4 on-demand in us-central1-a" in line and "no capacity" in line
        for line in recorder.statuses
    ), recorder.statuses
    assert nothing(held(gce, made.pool))


def test_when_every_zone_is_exhausted_the_error_names_each_one_tried(gce: GCPFake) -> None:
    for zone in ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"):
        gce.fail_next_insert(zone, RESOURCE_POOL_EXHAUSTED, times=None)
    made = request(accelerator="A100-80GB:1")
    with pytest.raises(CapacityError) as caught:
        provider(gce).provision(made, SilentReporter())
    message = str(caught.value)
    # a2-ultragpu-1g is offered in -a and -c only (the fake's catalogue, like GCE's).
    assert "a2-ultragpu-1g on-demand in us-central1-a" in message
    assert "a2-ultragpu-1g on-demand in us-central1-c" in message
    assert "us-central1-b" not in message
    assert nothing(held(gce, made.pool))


def test_spot_if_available_falls_back_to_on_demand(gce: GCPFake) -> None:
    for zone in ("us-central1-a", "us-central1-b", "us-central1-c"):
        gce.fail_requests(
            "POST", f"projects/*/zones/{zone}/instances", RESOURCE_POOL_EXHAUSTED, times=2
        )
    seen: dict[str, Any] = {}
    made = request(
        accelerator="L4",
        deadline=Checkpoint(
            "waiting for", reached=lambda: seen.update(held=gce.instances(PROJECT))
        ),
    )
    made = dataclasses.replace(made, allocation="spot-if-available")
    with pytest.raises(KeyboardInterrupt):
        provider(gce).provision(made, SilentReporter())
    models = {i["scheduling"]["provisioningModel"] for i in seen["held"]}
    assert models == {"STANDARD"}  # every zone refused spot (2 inserts each): on-demand
    assert nothing(held(gce, made.pool))


def test_a_missing_permission_is_named(gce: GCPFake) -> None:
    gce.fail_requests("POST", "projects/*/global/firewalls", DENIED)
    made = request()
    with pytest.raises(ProvisionError, match=r"lacks the permission compute\.firewalls\.create"):
        provider(gce).provision(made, SilentReporter())
    assert nothing(held(gce, made.pool))


def test_an_operation_that_fails_after_several_polls_is_raised_translated(gce: GCPFake) -> None:
    gce.operation_delay = 0.8
    gce.fail_next_insert(ZONE, QUOTA_EXCEEDED_IN_OPERATION)
    made = request(nodes=1)
    with pytest.raises(ProvisionError, match="quota CPUS in us-central1 is too small"):
        provider(gce).provision(made, SilentReporter())
    polls = gce.requests("GET", f"projects/{PROJECT}/zones/{ZONE}/operations/*")
    assert len(polls) >= 3
    assert nothing(held(gce, made.pool))


def test_the_api_not_enabled_says_how_to_enable_it(gce: GCPFake) -> None:
    disabled = Fault(
        403,
        "accessNotConfigured",
        "Compute Engine API has not been used in project 123 before or it is disabled.",
    )
    gce.fail_requests("GET", "projects/*/regions/*", disabled)
    with pytest.raises(ProvisionError, match=r"gcloud services enable compute\.googleapis\.com"):
        provider(gce).provision(request(), SilentReporter())


def test_an_unknown_image_or_zone_is_named_before_anything_is_created(gce: GCPFake) -> None:
    image = "projects/ubuntu-os-cloud/global/images/family/ubuntu-9999-lts"
    with pytest.raises(ProvisionError, match="the image does not exist"):
        provider(gce, image=image).provision(request(), SilentReporter())
    with pytest.raises(ProvisionError, match="zone us-central1-z is not in us-central1"):
        provider(gce, zone="us-central1-z").provision(request(), SilentReporter())
    assert gce.requests("POST") == []


def test_max_hourly_cost_refuses_before_anything_is_created(gce: GCPFake) -> None:
    with pytest.raises(ProvisionError, match=r"about \$176.98/h"):
        sky.ComputePool(
            provider=provider(gce), accelerator="H100", nodes=2, max_hourly_cost=100, quiet=True
        )
    assert gce.requests() == []


def test_a_503_on_a_read_is_retried_within_bounds(gce: GCPFake) -> None:
    gce.fail_requests("GET", "projects/*/regions/*", BACKEND_ERROR, times=2)
    _stopped_after_launch(gce, provider(gce))
    assert len(gce.requests("GET", "projects/*/regions/*")) == 3


# ── the leak matrix, up to the SSH stage (the rest is in test_gcp_standins.py) ──────────


@pytest.mark.parametrize(
    ("step", "made_by_then"),
    [
        ("creating the firewall rules", set()),
        ("creating instance", {"firewall rules", "instances"}),
        ("waiting for", {"firewall rules", "instances"}),
    ],
    ids=["before-rules", "insert-in-flight", "after-insert"],
)
@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), ProvisionError("injected failure")], ids=["ctrl-c", "failure"]
)
def test_a_start_stopped_at_any_step_leaves_nothing(
    gce: GCPFake, step: str, made_by_then: set[str], error: BaseException
) -> None:
    gce.operation_delay = 0.3  # inserts are still running when the checkpoint is polled
    at_stop: dict[str, Any] = {}

    def look() -> None:
        at_stop["held"] = held(gce, made.pool)
        at_stop["key file"] = _key_file_of_pool(gce)

    made = request(deadline=Checkpoint(step, error=error, reached=look))
    with pytest.raises(type(error)):
        provider(gce).provision(made, Recorder())
    assert {kind for kind, names in at_stop["held"].items() if names} == made_by_then
    assert at_stop["key file"] is None or not at_stop["key file"].exists()
    assert nothing(held(gce, made.pool))


def _key_file_of_pool(gce: GCPFake, root: Path | None = None) -> Any:
    for instance in gce.instances(PROJECT):
        entry = metadata_of(instance, "ssh-keys").split(":", 1)[1]
        return key_file_of(" ".join(entry.split()[:2]), root)
    return None


# ── teardown, loss, leftovers ──────────────────────────────────────────────────────────


def test_what_teardown_cannot_delete_is_named_with_the_command_that_removes_it(
    gce: GCPFake,
) -> None:
    refused = Fault(403, "forbidden", "Required 'compute.firewalls.delete' permission for 'x'")
    gce.fail_requests("DELETE", "projects/*/global/firewalls/*", refused, times=None)
    made = request(pool="undeletable", deadline=Checkpoint("waiting for"))
    with pytest.raises(KeyboardInterrupt) as caught:
        provider(gce).provision(made, SilentReporter())
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "could not delete firewall rule skyward-undeletable-" in notes
    assert "skyward down --pool undeletable" in notes
    left = held(gce, "undeletable")
    assert left["instances"] == [] and len(left["firewall rules"]) == 2
    gce.clear_faults()
    inventory = provider(gce).inventory()
    assert inventory is not None
    found = inventory.leftovers(pool="undeletable")
    assert {(x.kind, x.pool, x.region) for x in found} == {
        ("firewall rule", "undeletable", "global")
    }
    inventory.delete(found, SilentReporter())
    assert nothing(held(gce, "undeletable"))


def _api(gce: GCPFake) -> Api:
    from google.auth.credentials import AnonymousCredentials

    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    return Api.connect(project=PROJECT, credentials=credentials, endpoint=gce.url)


def test_loss_reason_says_a_spot_vm_was_preempted_and_a_machine_powered_off(
    gce: GCPFake,
) -> None:
    seen, pool = {}, "lost"
    made = request(
        pool=pool,
        deadline=Checkpoint("waiting for", reached=lambda: seen.update(i=gce.instances(PROJECT))),
    )
    with pytest.raises(KeyboardInterrupt):
        provider(gce, spot=True).provision(made, SilentReporter())
    # Made again by hand (the provision above cleaned up): two spot VMs of the pool.
    options = provider(gce, spot=True)
    machines = options.machines(request(pool=pool))
    from skyward.providers.gcp import api as gce_resources

    machines._template = gce_resources.InstanceSpec(
        machine_type="n2-standard-4",
        attach=None,
        gpu=False,
        image="projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64",
        disk_gb=20,
        network="default",
        subnetwork=None,
        tag="skyward-lost-0",
        labels={},
        metadata={},
        public=False,
        spot=False,
        service_account=None,
    )
    allocation = CloudPool(options, machines, request(pool=pool))
    offer = Offer(Machine("gcp", "n2-standard-4", None, 0, 0, 0), ZONE, "spot", None)
    names = allocation._launch(offer, [0, 1], allocation.launching)
    assert allocation.loss_reason(0) is None  # running: not a loss
    gce.preempt(PROJECT, ZONE, names[0])
    gce.stop_instance(PROJECT, ZONE, names[1])
    assert allocation.loss_reason(0) == (
        f"instance {names[0]} is gone: reclaimed by GCP (spot preemption)"
    )
    assert allocation.loss_reason(1) == (
        f"instance {names[1]} is TERMINATED: it powered itself off (the idle watchdog, or a "
        f"shutdown run on it)"
    )
    allocation.terminate()
    assert gce.instances(PROJECT) == []


def test_the_inventory_finds_instances_in_every_zone_and_rules_by_their_description(
    gce: GCPFake,
) -> None:
    seen: dict[str, Any] = {}
    inventory = provider(gce).inventory()
    assert inventory is not None

    def look() -> None:
        seen["pool"] = inventory.leftovers(pool="Left Over")
        seen["all"] = inventory.leftovers()
        seen["other"] = inventory.leftovers(pool="someone else")

    made = request(
        pool="Left Over", accelerator="T4", deadline=Checkpoint("waiting for", reached=look)
    )
    with pytest.raises(KeyboardInterrupt):
        provider(gce).provision(made, SilentReporter())
    kinds = sorted((x.kind, x.pool, x.state) for x in seen["pool"])
    assert kinds == [
        ("firewall rule", "Left Over", "exists"),
        ("firewall rule", "Left Over", "exists"),
        ("instance", "Left Over", "running"),
        ("instance", "Left Over", "running"),
    ]
    instances = [x for x in seen["pool"] if x.kind == "instance"]
    assert {x.region for x in instances} == {ZONE}
    assert all(x.hourly_cost == pytest.approx(0.539999) for x in instances)  # N1 + T4
    assert all(x.created is not None and x.owner for x in seen["pool"])
    assert seen["all"] == seen["pool"]
    assert seen["other"] == []  # what `down --pool "someone else"` would delete
    # Every list asked GCE to filter it: the aggregated list by label, the rules by name.
    listed = gce.requests("GET", f"projects/{PROJECT}/aggregated/instances")
    assert listed and all("labels.skyward-pool" in r.query["filter"] for r in listed)
    rules = gce.requests("GET", f"projects/{PROJECT}/global/firewalls")
    assert rules and all(r.query["filter"] == 'name eq "skyward-.*"' for r in rules)


# ── a client ended by a signal (a job scheduler's cancel, a closed terminal) ───────────

_CLIENT = """
from google.auth.credentials import AnonymousCredentials
import skyward as sky
gcp = sky.GCP(project={project!r}, zone={zone!r}, endpoint={url!r},
              credentials=AnonymousCredentials(), ssh_cidr="10.123.0.0/16",
              release_timeout=30, boot_timeout=120)
with sky.ComputePool(provider=gcp, nodes=2, name={pool!r}, console="plain") as pool:
    print("READY", flush=True)
"""


@pytest.mark.parametrize("stage", ["inserting", "connecting"])
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_client_ended_by_a_signal_at_any_stage_leaves_nothing(
    gce: GCPFake, tmp_path: Any, stage: str, signal_name: str
) -> None:
    import signal as signals
    import time

    pool = f"signalled-{stage[:3]}-{signal_name.lower()}"  # no phase name in it

    def plan(project: str, zone: str, name: str) -> tuple[str, str]:
        if stage == "inserting":  # from the first insert on, operations run until told
            gce.operation_delay = None
            return f"10.128.0.{10 + int(name[-1])}", ""
        # Nothing listens there: SSH is refused and retried, as while a VM boots.
        return f"127.0.0.{10 + int(name[-1])}", ""

    gce.address_plan = plan
    script = _CLIENT.format(project=PROJECT, zone=ZONE, url=gce.url, pool=pool)
    log = tmp_path / "client.log"
    with open(log, "wb") as out:  # signalled as from a terminal, however this run started
        client = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=out,
            stderr=out,
            env={**os.environ, "TMPDIR": str(tmp_path)},  # its key, should it be killed
            preexec_fn=as_from_a_terminal,
        )
    try:
        end = time.monotonic() + 60
        while not (
            len(gce.requests("POST", f"projects/{PROJECT}/zones/*/instances")) == 2
            if stage == "inserting"
            else "connecting" in log.read_text()
        ):
            assert client.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.05)
        key = _key_file_of_pool(gce, tmp_path)
        assert key is not None and key.exists(), (gce.instances(PROJECT), log.read_text())
        gce.operation_delay = 0.0  # what the teardown asks for is done at once
        client.send_signal(getattr(signals, signal_name))
        status = client.wait(60)
    finally:
        client.kill()
        client.wait(30)
    assert status == -getattr(signals, signal_name), log.read_text()
    assert nothing(held(gce, pool)), log.read_text()
    assert not key.exists()


def test_instances_that_never_answer_fail_the_start_in_time_and_leave_nothing(
    gce: GCPFake,
) -> None:
    # Nothing listens on these addresses: SSH is refused, and retried as while VMs boot.
    gce.address_plan = lambda project, zone, name: (f"127.0.0.{20 + int(name[-1])}", "")
    with pytest.raises(sky.ProvisionError) as caught:
        with sky.ComputePool(
            provider=provider(gce, connect="private"),
            nodes=2,
            name="unreachable",
            provision_timeout=15,  # the machines' SSH fails for all of it
            quiet=True,
        ):
            pass
    error = caught.value.__cause__ or caught.value
    message = str(error) + "".join(getattr(error, "__notes__", []))
    assert "provision_timeout (15 s)" in message, message
    assert "SSH did not answer from here" in message and "ssh_cidr" in message, message
    # Every silent machine is named, not only the one whose failure ended the start.
    assert "127.0.0.20" in message and "127.0.0.21" in message, message
    assert nothing(held(gce, "unreachable"))
