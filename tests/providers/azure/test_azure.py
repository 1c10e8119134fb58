"""The Azure provider against the fake Azure Resource Manager (HTTPS, driven by the real
azure-mgmt SDKs): what it asks Azure for, what it says when Azure refuses, where it goes when
there is no room, and that an interrupted or failed start leaves no resource group. Reaching
the VMs over SSH is in ``test_azure_standins.py``."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError
from support import cloudinit
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import Checkpoint, key_file_of, request
from support.clouds.azure.fake import SUBSCRIPTION, AzureFake, VmSku, sdk_clients
from support.clouds.azure.pools import (
    LOCATION,
    groups_of,
    only_group,
    provider,
    signed_in_env,
    skyward_cli,
)
from support.reporter import Recorder
from support.sandbox import Sandbox

import skyward as sky
from skyward._errors import ProvisionError
from skyward.providers.azure import api as arm
from skyward.providers.azure.api import translate
from skyward.providers.azure.watchdog import RELEASE_PATH
from skyward.providers.cloud import catalog
from skyward.providers.cloud.boot import WATCHDOG_PATH, watchdog_script

pytestmark = pytest.mark.timeout(120)

VM_CONTRIBUTOR = "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
_ROLE = "Microsoft.Authorization/roleAssignments"


@pytest.fixture(scope="module")
def server() -> Iterator[AzureFake]:
    with AzureFake() as fake:
        yield fake


@pytest.fixture
def fake(server: AzureFake) -> Iterator[AzureFake]:
    server.reset()
    server.operation_polls, server.operation_seconds = 1, 1.0
    yield server
    assert not server.errors, server.errors[0]


# ── before anything is touched ─────────────────────────────────────────────────────────


def test_bad_settings_are_validation_errors_naming_the_field() -> None:
    for settings, field in [
        ({"ssh_cidr": "everyone"}, "ssh_cidr"),
        ({"image": "ubuntu"}, "image"),
        ({"connect": "bastion"}, "connect"),
        ({"disk_gb": 2}, "disk_gb"),
        ({"idle_timeout": 0}, "idle_timeout"),
        ({"username": "admin"}, "username"),
        ({"subscription_id": "mine"}, "subscription_id"),
        ({"location": "east us!"}, "location"),
        ({"credential": object()}, "credential"),
        ({"base_url": "http://127.0.0.1:1"}, "base_url"),
    ]:
        with pytest.raises(ValidationError) as caught:
            sky.Azure(**settings)
        assert field in str(caught.value), settings
    with pytest.raises(ValueError, match="max_price is for spot VMs"):
        az = sky.Azure(subscription_id=SUBSCRIPTION, location="eastus", max_price=0.5)
        sky.ComputePool(provider=az, quiet=True)


def test_vm_size_wins_over_the_catalog_which_picks_the_smallest_first(fake: AzureFake) -> None:
    az = provider(fake)
    assert [m.type for m in az.machines_for(request(accelerator="A100:8"))] == [
        "Standard_ND96asr_v4",
        "Standard_ND96amsr_A100_v4",  # the failover's alternative: 80 GB instead of 40
    ]
    assert [m.type for m in az.machines_for(request(accelerator="A100-80GB:8"))] == [
        "Standard_ND96amsr_A100_v4"
    ]
    assert az.machines_for(request(accelerator="A100"))[0].type == "Standard_NC24ads_A100_v4"
    sized = provider(fake, vm_size="Standard_ND96asr_v4")
    assert [m.type for m in sized.machines_for(request())] == ["Standard_ND96asr_v4"]
    assert provider(fake, vm_size="Standard_NV36ads_A10_v5").machines_for(request()) == []
    with pytest.raises(ValueError, match="azure has no L4"):
        sky.ComputePool(provider=az, accelerator="L4", quiet=True)
    with pytest.raises(ValueError, match="fewer than vcpus=200"):
        sky.ComputePool(provider=sized, vcpus=200, quiet=True)


def test_a_pool_above_max_hourly_cost_is_refused_when_it_is_built(fake: AzureFake) -> None:
    with pytest.raises(ProvisionError, match=r"about \$54.39/h.*max_hourly_cost=\$20"):
        sky.ComputePool(
            provider=provider(fake), accelerator="A100:8", nodes=2, max_hourly_cost=20, quiet=True
        )
    assert fake.request_log == []


def test_no_subscription_or_location_is_said_when_the_pool_is_built(
    fake: AzureFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    monkeypatch.delenv("AZURE_DEFAULTS_LOCATION", raising=False)
    with pytest.raises(ProvisionError, match="AZURE_SUBSCRIPTION_ID"):
        sky.ComputePool(provider=provider(fake, subscription_id=None), quiet=True)
    with pytest.raises(ValueError, match=r"sky.Azure\(location='eastus'\)"):
        sky.ComputePool(provider=provider(fake, location=None), quiet=True)
    monkeypatch.setenv("AZURE_DEFAULTS_LOCATION", "westus2")
    assert provider(fake, location=None).locations == ["westus2"]
    assert fake.request_log == []


def test_spot_contradicting_the_pools_allocation_is_refused(fake: AzureFake) -> None:
    with pytest.raises(ValueError, match="contradicts allocation='on-demand'"):
        sky.ComputePool(provider=provider(fake, spot=True), allocation="on-demand", quiet=True)


def test_missing_credentials_are_said_before_anything_is_created(
    fake: AzureFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DefaultAzureCredential as a user without any sign-in gets it, limited to the
    # environment (nothing probes the metadata address).
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "EnvironmentCredential")
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_USERNAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ProvisionError, match="no usable Azure credentials") as caught:
        provider(fake, credential=None).provision(request(), Recorder())
    assert "az login" in str(caught.value)
    assert fake.request_log == []


def test_a_missing_azure_sdk_names_the_extra_when_the_pool_is_built() -> None:
    script = (
        "import sys; sys.modules['azure.mgmt.compute'] = None\n"
        "import skyward as sky\n"
        "try:\n"
        "    sky.ComputePool(provider=sky.Azure(location='eastus'), nodes=1, quiet=True)\n"
        "except sky.MissingDependency as e:\n"
        "    print('MISSING', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert "MISSING" in done.stdout, done
    assert "pip install 'skyward[azure]'" in done.stdout


def test_an_unknown_location_is_named_before_anything_is_created(fake: AzureFake) -> None:
    with pytest.raises(ProvisionError, match="Did you mean eastus"):
        provider(fake, location="eastuss").provision(request(), Recorder())
    assert fake.requests("PUT") == []


# ── what the provider asks Azure for ───────────────────────────────────────────────────


def _snapshot(fake: AzureFake, pool: str, into: dict[str, Any]) -> None:
    """Everything the fake holds for ``pool``, taken while provisioning is stopped."""
    group = only_group(fake, pool)
    into["group"] = next(g for g in fake.resource_groups() if g["name"] == group)
    into["resources"] = fake.resources(group)
    into["vms"] = sorted(fake.vms(group), key=lambda vm: vm["name"])
    into["user_data"] = fake.custom_data(group, into["vms"][0]["name"])
    into["nsg"] = next(
        r for r in into["resources"] if r["type"] == "Microsoft.Network/networkSecurityGroups"
    )


def _stopped_while_connecting(
    fake: AzureFake, az: sky.Azure, **options: Any
) -> tuple[dict[str, Any], str]:
    seen: dict[str, Any] = {}
    checkpoint = Checkpoint("connecting", reached=lambda: _snapshot(fake, name, seen))
    made = request(deadline=checkpoint, **options)
    name = made.pool
    with pytest.raises(KeyboardInterrupt):
        az.provision(made, Recorder())
    return seen, name


def test_a_pool_is_one_tagged_resource_group_with_a_vm_per_node(fake: AzureFake) -> None:
    seen, pool = _stopped_while_connecting(fake, provider(fake, disk_gb=120), accelerator="A100:8")
    tags = seen["group"]["tags"]
    assert tags["skyward-pool"] == pool
    assert {"skyward-owner", "skyward-created"} <= set(tags)
    made_by_us = [
        r for r in seen["resources"] if r["type"] not in (_ROLE, "Microsoft.Compute/disks")
    ]
    assert all(r.get("tags") == tags for r in made_by_us)
    assert [vm["name"] for vm in seen["vms"]] == ["node-0", "node-1"]
    for vm in seen["vms"]:
        props = vm["properties"]
        assert props["hardwareProfile"]["vmSize"] == "Standard_ND96asr_v4"
        assert "priority" not in props
        disk = props["storageProfile"]["osDisk"]
        assert (disk["diskSizeGB"], disk["deleteOption"]) == (120, "Delete")
        assert props["storageProfile"]["imageReference"]["offer"] == "ubuntu-hpc"
        (nic,) = props["networkProfile"]["networkInterfaces"]
        assert nic["properties"]["deleteOption"] == "Delete"
        linux = props["osProfile"]["linuxConfiguration"]
        assert linux["disablePasswordAuthentication"] is True
        assert linux["ssh"]["publicKeys"][0]["path"] == "/home/skyward/.ssh/authorized_keys"
        assert vm["powerState"] == "running"
    assert groups_of(fake, pool) == []  # the Ctrl-C deleted the group


def test_a_cpu_pool_gets_the_smallest_cpu_size_and_ubuntu(fake: AzureFake) -> None:
    seen, _ = _stopped_while_connecting(fake, provider(fake))
    props = seen["vms"][0]["properties"]
    assert props["hardwareProfile"]["vmSize"] == "Standard_D4s_v5"
    assert props["storageProfile"]["imageReference"]["publisher"] == "Canonical"


def test_the_nsg_lets_in_ssh_from_the_client_only_and_everything_within_the_pool(
    fake: AzureFake,
) -> None:
    seen, _ = _stopped_while_connecting(fake, provider(fake, ssh_cidr="203.0.113.7/32"))
    rules = {r["name"]: r["properties"] for r in seen["nsg"]["properties"]["securityRules"]}
    assert rules["ssh-from-client"]["sourceAddressPrefixes"] == ["203.0.113.7/32"]
    assert (
        rules["ssh-from-client"]["protocol"],
        rules["ssh-from-client"]["destinationPortRange"],
    ) == (
        "Tcp",
        "22",
    )
    assert rules["within-the-pool"]["sourceAddressPrefixes"] == ["10.77.0.0/24"]
    assert rules["nothing-else"]["access"] == "Deny"
    assert rules["nothing-else"]["priority"] > rules["within-the-pool"]["priority"]
    vnet = next(r for r in seen["resources"] if r["type"] == "Microsoft.Network/virtualNetworks")
    (subnet,) = vnet["properties"]["subnets"]
    assert subnet["properties"]["networkSecurityGroup"]["id"].lower() == seen["nsg"]["id"].lower()


def test_spot_vms_are_deleted_when_evicted_and_capped_at_max_price(fake: AzureFake) -> None:
    seen, _ = _stopped_while_connecting(fake, provider(fake, spot=True, max_price=0.35))
    for vm in seen["vms"]:
        props = vm["properties"]
        assert (props["priority"], props["evictionPolicy"]) == ("Spot", "Delete")
        assert props["billingProfile"]["maxPrice"] == 0.35


def test_the_watchdogs_identity_has_one_role_on_the_pools_group_only(fake: AzureFake) -> None:
    seen, _ = _stopped_while_connecting(fake, provider(fake))
    by_type: dict[str, list[dict[str, Any]]] = {}
    for resource in seen["resources"]:
        by_type.setdefault(resource["type"], []).append(resource)
    (identity,) = by_type["Microsoft.ManagedIdentity/userAssignedIdentities"]
    (role,) = by_type["Microsoft.Authorization/roleAssignments"]
    assert role["properties"]["principalId"] == identity["properties"]["principalId"]
    assert role["properties"]["roleDefinitionId"].endswith(f"/roleDefinitions/{VM_CONTRIBUTOR}")
    assert role["properties"]["scope"] == seen["group"]["id"]
    for vm in seen["vms"]:
        assert list(vm["identity"]["userAssignedIdentities"]) == [identity["id"]]
    document = yaml.safe_load(seen["user_data"])
    files = {f["path"]: f["content"] for f in document["write_files"]}
    assert identity["properties"]["clientId"] in files[RELEASE_PATH]
    runcmd = " ".join(" ".join(c) for c in document["runcmd"])
    # The first client is awaited boot_timeout and a margin, then the idle bound applies.
    assert f"{WATCHDOG_PATH} 1800 22 10 720 {RELEASE_PATH}" in runcmd


def test_without_self_delete_there_is_no_identity_and_the_watchdog_powers_off(
    fake: AzureFake,
) -> None:
    seen, _ = _stopped_while_connecting(fake, provider(fake, self_delete=False))
    kinds = {r["type"] for r in seen["resources"]}
    assert "Microsoft.ManagedIdentity/userAssignedIdentities" not in kinds
    assert "Microsoft.Authorization/roleAssignments" not in kinds
    assert "identity" not in seen["vms"][0]
    document = yaml.safe_load(seen["user_data"])
    assert RELEASE_PATH not in {f["path"] for f in document["write_files"]}


def test_custom_data_is_cloud_config_that_cloud_inits_schema_accepts(fake: AzureFake) -> None:
    seen, _ = _stopped_while_connecting(fake, provider(fake))
    text = seen["user_data"].decode()
    assert text.startswith("#cloud-config\n")
    document = yaml.safe_load(text)
    schema = cloudinit.schema()
    errors = [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(document)]
    assert errors == []
    assert set(document) <= cloudinit.known_keys(schema)


def test_a_private_pool_gets_no_public_ip_and_auto_ssh_is_its_address_space(
    fake: AzureFake,
) -> None:
    az = provider(fake, connect="private", ssh_cidr="auto", address_space="10.88.0.0/16")
    seen, _ = _stopped_while_connecting(fake, az)
    kinds = [r["type"] for r in seen["resources"]]
    assert "Microsoft.Network/publicIPAddresses" not in kinds
    rules = {r["name"]: r["properties"] for r in seen["nsg"]["properties"]["securityRules"]}
    assert rules["ssh-from-client"]["sourceAddressPrefixes"] == ["10.88.0.0/16"]


def test_the_catalog_agrees_with_azure_on_every_size_the_fake_lists(fake: AzureFake) -> None:
    clients = sdk_clients(fake)
    try:
        listed = {
            s.name: {c.name: c.value for c in s.capabilities}
            for s in clients.compute.resource_skus.list(filter=f"location eq '{LOCATION}'")
        }
    finally:
        clients.close()
    known = {m.type: m for m in catalog.machines("azure")}
    checked = 0
    for name, capabilities in listed.items():
        if name in known:
            assert int(capabilities["vCPUs"]) == known[name].vcpus, name
            assert int(capabilities.get("GPUs", 0)) == known[name].count, name
            checked += 1
    assert checked >= 6
    assert all(m.hourly for m in known.values() if m.type != "Standard_ND96isr_H200_v5")


# ── when Azure refuses, and where the pool goes instead ────────────────────────────────


def _failed(fake: AzureFake, az: sky.Azure, **options: Any) -> tuple[ProvisionError, str]:
    made = request(**options)
    with pytest.raises(ProvisionError) as caught:
        az.provision(made, Recorder())
    assert groups_of(fake, made.pool) == [], "a failed start left its resource group"
    return caught.value, made.pool


def test_a_quota_too_small_names_the_family_and_the_limit(fake: AzureFake) -> None:
    fake.set_quota(LOCATION, "standardNDASv4_A100Family", 96)
    error, _ = _failed(fake, provider(fake), accelerator="A100-40GB:8")
    assert "'standardNDASv4_A100Family' vCPU quota in eastus is 96" in str(error)
    assert "96 more needed" in str(error)


def test_a_size_azure_restricts_is_left_out_and_the_next_one_used(fake: AzureFake) -> None:
    fake.restrict_sku("Standard_ND96asr_v4", LOCATION)
    recorder = Recorder()
    seen: dict[str, Any] = {}
    made = request(
        accelerator="A100:8",
        deadline=Checkpoint("connecting", reached=lambda: _snapshot(fake, made.pool, seen)),
    )
    with pytest.raises(KeyboardInterrupt):
        provider(fake).provision(made, recorder)
    assert {vm["properties"]["hardwareProfile"]["vmSize"] for vm in seen["vms"]} == {
        "Standard_ND96amsr_A100_v4"
    }
    assert any("Standard_ND96asr_v4 in eastus: restricted" in s for s in recorder.statuses)
    assert any(s.startswith("2 x Standard_ND96amsr_A100_v4") for s in recorder.statuses)
    assert len(fake.requests("PUT", "/virtualMachines/")) == 2  # no attempt with the restricted


def test_sku_not_available_at_create_moves_to_the_next_size_then_location(
    fake: AzureFake,
) -> None:
    for size in ("Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4"):
        fake.fail_vm_create(
            "SkuNotAvailable", size=size, location=LOCATION, http_status=409, times=None
        )
    seen: dict[str, Any] = {}
    made = request(
        accelerator="A100:8",
        deadline=Checkpoint("connecting", reached=lambda: _snapshot(fake, made.pool, seen)),
    )
    recorder = Recorder()
    with pytest.raises(KeyboardInterrupt):
        provider(fake, location=("eastus", "westus2")).provision(made, recorder)
    assert {
        (vm["location"], vm["properties"]["hardwareProfile"]["vmSize"]) for vm in seen["vms"]
    } == {("westus2", "Standard_ND96asr_v4")}
    # Nothing of the attempts in eastus is left: no VM, NIC or public IP there.
    assert [
        r["type"]
        for r in seen["resources"]
        if r.get("location") == "eastus"
        and (r["type"].endswith(("virtualMachines", "networkInterfaces", "publicIPAddresses")))
    ] == []
    (moved,) = [s for s in recorder.statuses if "trying" in s]
    assert moved.startswith("Standard_ND96asr_v4 on-demand in eastus: this VM size is not")
    assert moved.endswith("; trying Standard_ND96asr_v4 on-demand in westus2")


def test_when_no_size_anywhere_has_room_the_error_lists_every_attempt(fake: AzureFake) -> None:
    fake.fail_vm_create("SkuNotAvailable", http_status=409, times=None)
    error, _ = _failed(fake, provider(fake, location=("eastus", "westus2")), accelerator="A100:8")
    message = str(error)
    assert "tried 4" in message, message
    for where in ("eastus", "westus2"):
        for size in ("Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4"):
            assert f"{size} on-demand in {where}" in message, message


def test_spot_if_available_falls_back_to_on_demand(fake: AzureFake) -> None:
    # Spot capacity refused (through the operation, after the create was accepted).
    fake.fail_vm_create("OverconstrainedAllocationRequest", times=2)
    seen: dict[str, Any] = {}
    made = request(
        deadline=Checkpoint("connecting", reached=lambda: _snapshot(fake, made.pool, seen))
    )
    made = dataclasses.replace(made, allocation="spot-if-available")
    with pytest.raises(KeyboardInterrupt):
        provider(fake).provision(made, Recorder())
    assert {vm["properties"].get("priority") for vm in seen["vms"]} == {None}
    assert len(fake.requests("PUT", "/virtualMachines/")) == 4  # 2 spot refused, 2 on-demand


def test_an_operation_that_fails_after_several_polls_leaves_nothing(fake: AzureFake) -> None:
    fake.operation_polls = 4
    fake.fail_vm_create("AllocationFailed", times=None)
    error, _ = _failed(fake, provider(fake))
    assert "Azure has no capacity for it there now" in str(error)
    polls = [p for _, p in fake.requests("GET", "/operations/")]
    assert len(polls) >= 8, "each create was polled until it failed"


def test_an_authorization_failure_names_the_action(fake: AzureFake) -> None:
    fake.fail_requests(403, "AuthorizationFailed", method="PUT", path="roleAssignments")
    error, _ = _failed(fake, provider(fake))
    assert "Microsoft.Authorization/roleAssignments/write" in str(error)
    assert "self_delete" in str(error) or "docs/providers.md" in str(error)


def test_vcpus_and_memory_pick_the_smallest_size_that_holds_them(fake: AzureFake) -> None:
    for name, vcpus, memory in (("Standard_D16s_v5", 16, 64), ("Standard_D32s_v5", 32, 128)):
        fake.skus[name.lower()] = VmSku(name, "standardDSv5Family", vcpus, memory)
    seen: dict[str, Any] = {}
    made = request(
        deadline=Checkpoint("connecting", reached=lambda: _snapshot(fake, made.pool, seen))
    )
    made = dataclasses.replace(made, vcpus=12, memory_gb=100)
    try:
        with pytest.raises(KeyboardInterrupt):
            provider(fake).provision(made, Recorder())
    finally:
        for name in ("standard_d16s_v5", "standard_d32s_v5"):
            fake.skus.pop(name)
    assert {vm["properties"]["hardwareProfile"]["vmSize"] for vm in seen["vms"]} == {
        "Standard_D32s_v5"
    }


def test_translated_errors_say_what_to_do() -> None:
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    expired = HttpResponseError(message="expired")
    expired.error = type("E", (), {"code": "ExpiredAuthenticationToken", "message": "expired"})()  # type: ignore[assignment]
    assert "az login" in str(translate(expired, "x"))
    assert "az login" in str(translate(ClientAuthenticationError("no"), "x"))


# ── the leak matrix, up to the SSH stage (the rest is in test_azure_standins.py) ────────


@pytest.mark.parametrize(
    "step",
    [
        "creating resource group",
        "making the network",
        "creating VM node-1",
        "connecting",
    ],
)
@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), ProvisionError("injected failure")], ids=["ctrl-c", "failure"]
)
def test_a_start_stopped_at_any_step_leaves_nothing(
    fake: AzureFake, step: str, error: BaseException
) -> None:
    at_stop: dict[str, Any] = {}

    def look() -> None:
        at_stop["groups"] = groups_of(fake, made.pool)
        keys = [
            vm["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]
            for group in at_stop["groups"]
            for vm in fake.vms(group)
        ]
        at_stop["key file"] = key_file_of(keys[0][0]["keyData"]) if keys else None

    made = request(deadline=Checkpoint(step, error=error, reached=look))
    with pytest.raises(type(error)):
        provider(fake).provision(made, Recorder())
    assert len(at_stop["groups"]) == (0 if step == "creating resource group" else 1)
    assert groups_of(fake, made.pool) == []
    if step == "connecting":
        assert at_stop["key file"] is not None
    if at_stop["key file"] is not None:
        assert not at_stop["key file"].exists()


# ── a machine that powers itself off on Azure is still billed: the watchdog's action ──


@pytest.mark.timeout(60)
def test_the_watchdog_runs_its_action_instead_of_powering_off(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    action = tmp_path / "release"
    action.write_text(f"#!/bin/sh\necho released >> {ran}\n")
    action.chmod(0o755)
    script = tmp_path / "watchdog"
    script.write_text(watchdog_script())
    # No SSH client on this port: idle at once; the action runs, nothing powers off.
    main = f"sh {script} 1 1 1 1 {action}\n"
    sandbox = Sandbox(tmp_path / "box", main)
    try:
        end = time.monotonic() + 30
        while not ran.exists() and time.monotonic() < end:
            time.sleep(0.1)
        assert ran.read_text() == "released\n"
        assert sandbox.alive and sandbox.power_state() == ""
    finally:
        sandbox.stop()


# ── skyward ls / down, signed in the way a user is (az login) ──────────────────────────


def _skyward(
    fake: AzureFake, moto: MotoServer, tmp_path: Path, *args: str, answer: str = ""
) -> Any:
    # --azure-base-url alone asks Azure only; AWS, were it asked, would be the moto server,
    # so that nothing of this process, which has no network guard, leaves the machine.
    env = {
        **signed_in_env(fake, tmp_path / "az"),
        "AWS_ENDPOINT_URL": moto.url,
        "AWS_DEFAULT_REGION": moto.region,
    }
    return subprocess.run(
        [skyward_cli(), *args, "--azure-base-url", fake.url],
        input=answer,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _orphan_and_another_group(fake: AzureFake) -> None:
    """A pool's resource group a vanished client left (``skyward-orphan-abc``), and a group
    that is not Skyward's (``someone-elses``)."""
    clients = sdk_clients(fake)
    try:
        tags = {
            "skyward-pool": "orphan",
            "skyward-owner": "me@here",
            "skyward-created": "2025-01-01T00:00:00Z",
        }
        clients.resource.resource_groups.create_or_update(
            "skyward-orphan-abc", {"location": LOCATION, "tags": tags}
        )
        clients.resource.resource_groups.create_or_update(
            "someone-elses", {"location": LOCATION, "tags": {"team": "x"}}
        )
    finally:
        clients.close()


def test_ls_and_down_find_a_pools_resource_group_by_tag(
    fake: AzureFake, moto: MotoServer, tmp_path: Path
) -> None:
    _orphan_and_another_group(fake)
    listed = _skyward(fake, moto, tmp_path, "ls")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "skyward-orphan-abc" in listed.stdout and "someone-elses" not in listed.stdout
    assert "azure" in listed.stdout and "me@here" in listed.stdout
    refused = _skyward(fake, moto, tmp_path, "down", "--pool", "orphan", answer="n\n")
    assert refused.returncode != 0
    assert groups_of(fake, "orphan") == ["skyward-orphan-abc"]
    removed = _skyward(fake, moto, tmp_path, "down", "--pool", "orphan", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert groups_of(fake, "orphan") == []
    assert [g["name"] for g in fake.resource_groups()] == ["someone-elses"]
    assert "Nothing left" in _skyward(fake, moto, tmp_path, "ls").stdout


def test_the_inventory_asks_arm_for_the_pools_groups_by_tag(fake: AzureFake) -> None:
    _orphan_and_another_group(fake)
    inventory = provider(fake).inventory()
    assert inventory is not None
    found = inventory.leftovers(pool="orphan")
    assert [(x.kind, x.id) for x in found] == [("resource group", "skyward-orphan-abc")]
    assert inventory.leftovers(pool="another") == []  # what `down --pool` would delete
    everything = inventory.leftovers()
    assert [(x.kind, x.id) for x in everything] == [("resource group", "skyward-orphan-abc")]


def test_custom_data_round_trips_as_base64(fake: AzureFake) -> None:
    site = arm.Site(location=LOCATION, subnet_id="/x", subnet_prefix="10.0.0.0/24")
    spec = arm.VmSpec(
        size="Standard_D4s_v5",
        spot=False,
        max_price=None,
        image=arm.ImageRef.parse("Canonical:ubuntu-24_04-lts:server:latest"),
        disk_gb=30,
        disk_type="Premium_LRS",
        username="skyward",
        public_key="ssh-ed25519 AAAA",
        user_data="#cloud-config\n{}\n",
        public_ip=False,
        accelerated_networking=True,
        tags={},
    )
    body = arm.vm_body(spec, site, "node-0", "/nic")
    assert base64.b64decode(body["properties"]["osProfile"]["customData"]) == b"#cloud-config\n{}\n"
    assert json.dumps(body)  # plain JSON, nothing the SDK must convert
    assert SUBSCRIPTION


def test_a_failed_sign_in_shows_skywards_one_line_not_the_sdks_dump(
    fake: AzureFake, tmp_path: Path
) -> None:
    # As a user runs it: a script whose program configured no logging, no sign-in anywhere
    # (the environment only: nothing probes the metadata address).
    script = (
        "import skyward as sky\n"
        "try:\n"
        "    sky.ComputePool(provider=sky.Azure(location='eastus',\n"
        "        subscription_id='00000000-0000-0000-0000-000000000001',\n"
        f"        base_url={fake.url!r}, connection_verify={fake.ca_path!r}), nodes=1,\n"
        f"        logging=sky.LogConfig(level='DEBUG', file={str(tmp_path / 'debug.log')!r},\n"
        "            console=False), quiet=True).__enter__()\n"
        "except sky.ProvisionError as e:\n"
        "    print('REFUSED', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
    env |= {"AZURE_TOKEN_CREDENTIALS": "EnvironmentCredential", "HOME": str(tmp_path)}
    env["SKYWARD_LOG_DIR"] = str(tmp_path / "logs")
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert "REFUSED" in done.stdout and "no usable Azure credentials" in done.stdout, done
    assert "DefaultAzureCredential failed" not in done.stderr, done.stderr
    assert "EnvironmentCredential" not in done.stderr, done.stderr
    logged = (tmp_path / "debug.log").read_text()
    assert "EnvironmentCredential" in logged  # the SDK's detail, in Skyward's DEBUG log
    assert fake.request_log == []
