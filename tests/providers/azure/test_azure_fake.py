"""The fake Azure Resource Manager, driven only through the real azure-mgmt SDKs.

These pin what the Azure provider's tests will rely on: the shapes the SDKs send and read,
long-running operations through ``Azure-AsyncOperation``, failures arriving as
``HttpResponseError`` with the code a provider dispatches on, and the state a test inspects.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from azure.core.exceptions import (
    HttpResponseError,
    ODataV4Format,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.mgmt.compute import models as compute
from support.clouds.azure.fake import AddressQueue, AzureClients, AzureFake, sdk_clients

pytestmark = pytest.mark.timeout(60)

LOCATION = "eastus"
CLIENT_CIDR = "203.0.113.7/32"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTestsOnly skyward"
CLOUD_INIT = b"#cloud-config\nruncmd:\n  - echo hello\n"


@pytest.fixture(scope="module")
def fake() -> Iterator[AzureFake]:
    with AzureFake() as server:
        yield server


@pytest.fixture
def arm(fake: AzureFake) -> Iterator[AzureClients]:
    fake.reset()
    fake.page_size, fake.operation_seconds, fake.addresses = 100, 1.0, None
    clients = sdk_clients(fake)
    yield clients
    clients.close()
    assert not fake.errors, fake.errors[0]


def _resource_group(arm: AzureClients, name: str, **tags: str) -> None:
    arm.resource.resource_groups.create_or_update(name, {"location": LOCATION, "tags": tags})


def _network(
    arm: AzureClients, rg: str, name: str, *, nic_delete: str = "Detach", ip: str = "Static"
) -> Any:
    """vnet + subnet (as a child) + NSG open to SSH from the client + static public IP + NIC;
    returns the NIC reference a VM takes."""
    network = arm.network
    network.virtual_networks.begin_create_or_update(
        rg,
        f"{name}-vnet",
        {
            "location": LOCATION,
            "properties": {"addressSpace": {"addressPrefixes": ["10.123.0.0/16"]}},
        },
    ).result()
    nsg = network.network_security_groups.begin_create_or_update(
        rg,
        f"{name}-nsg",
        {
            "location": LOCATION,
            "properties": {
                "securityRules": [
                    {
                        "name": "ssh-from-client",
                        "properties": {
                            "priority": 100,
                            "direction": "Inbound",
                            "access": "Allow",
                            "protocol": "Tcp",
                            "sourceAddressPrefix": CLIENT_CIDR,
                            "sourcePortRange": "*",
                            "destinationAddressPrefix": "*",
                            "destinationPortRange": "22",
                        },
                    }
                ]
            },
        },
    ).result()
    subnet = network.subnets.begin_create_or_update(
        rg,
        f"{name}-vnet",
        "nodes",
        {"properties": {"addressPrefix": "10.123.7.0/24", "networkSecurityGroup": {"id": nsg.id}}},
    ).result()
    public_ip = network.public_ip_addresses.begin_create_or_update(
        rg,
        f"{name}-ip",
        {
            "location": LOCATION,
            "sku": {"name": "Standard"},
            "properties": {"publicIPAllocationMethod": ip},
        },
    ).result()
    nic = network.network_interfaces.begin_create_or_update(
        rg,
        f"{name}-nic",
        {
            "location": LOCATION,
            "properties": {
                "enableAcceleratedNetworking": True,
                "networkSecurityGroup": {"id": nsg.id},
                "ipConfigurations": [
                    {
                        "name": "primary",
                        "properties": {
                            "subnet": {"id": subnet.id},
                            "publicIPAddress": {"id": public_ip.id},
                        },
                    }
                ],
            },
        },
    ).result()
    return compute.NetworkInterfaceReference(
        id=nic.id, properties=compute.NetworkInterfaceReferenceProperties(delete_option=nic_delete)
    )


def _vm_model(nic: Any, *, size: str = "Standard_ND96asr_v4") -> compute.VirtualMachine:
    properties = compute.VirtualMachineProperties(
        hardware_profile=compute.HardwareProfile(vm_size=size),
        storage_profile=compute.StorageProfile(
            image_reference=compute.ImageReference(
                publisher="microsoft-dsvm",
                offer="ubuntu-hpc",
                sku="2204",
                version="latest",
            ),
            os_disk=compute.OSDisk(create_option="FromImage", delete_option="Delete"),
        ),
        os_profile=compute.OSProfile(
            computer_name="node-0",
            admin_username="skyward",
            custom_data=base64.b64encode(CLOUD_INIT).decode(),
            linux_configuration=compute.LinuxConfiguration(
                disable_password_authentication=True,
                ssh=compute.SshConfiguration(
                    public_keys=[
                        compute.SshPublicKey(
                            path="/home/skyward/.ssh/authorized_keys", key_data=SSH_KEY
                        )
                    ]
                ),
            ),
        ),
        network_profile=compute.NetworkProfile(network_interfaces=[nic]),
        priority="Spot",
        eviction_policy="Delete",
        billing_profile=compute.BillingProfile(max_price=-1),
    )
    return compute.VirtualMachine(
        location=LOCATION, tags={"skyward-pool": "p1"}, properties=properties
    )


def _error(caught: pytest.ExceptionInfo[HttpResponseError]) -> ODataV4Format:
    """The ARM error the SDK parsed: what a provider dispatches on (``.code``)."""
    assert caught.value.error is not None, caught.value
    return caught.value.error


def _power(arm: AzureClients, rg: str, vm: str) -> list[str]:
    view = arm.compute.virtual_machines.get(rg, vm, expand="instanceView").instance_view
    return [s.code for s in view.statuses if s.code.startswith("PowerState/")]


# ── resource groups ─────────────────────────────────────────────────────────────────────


def test_resource_groups_are_listed_by_tag_across_pages(fake: AzureFake, arm: AzureClients) -> None:
    fake.page_size = 1  # every group on its own page: the SDK must follow nextLink
    _resource_group(arm, "sky-a", **{"skyward-pool": "p1"})
    _resource_group(arm, "sky-b", **{"skyward-pool": "p1", "owner": "me"})
    _resource_group(arm, "sky-c", **{"skyward-pool": "p2"})

    found = arm.resource.resource_groups.list(
        filter="tagName eq 'skyward-pool' and tagValue eq 'p1'"
    )

    assert sorted(g.name for g in found) == ["sky-a", "sky-b"]
    assert arm.resource.resource_groups.get("SKY-B").tags == {"skyward-pool": "p1", "owner": "me"}
    assert arm.resource.resource_groups.check_existence("sky-c")
    assert not arm.resource.resource_groups.check_existence("sky-z")
    assert arm.credential.scopes[0] == ("https://management.azure.com/.default",)


def test_missing_resource_group_is_not_found(arm: AzureClients) -> None:
    with pytest.raises(ResourceNotFoundError) as caught:
        arm.resource.resource_groups.get("nowhere")
    assert _error(caught).code == "ResourceGroupNotFound"


# ── a whole node: network, VM, read back, deallocate, delete ────────────────────────────


def test_spot_vm_with_custom_data_is_created_and_read_back(
    fake: AzureFake, arm: AzureClients
) -> None:
    fake.addresses = AddressQueue([("10.123.7.21", "10.123.200.21")])
    _resource_group(arm, "pool-1", **{"skyward-pool": "p1"})
    nic = _network(arm, "pool-1", "node-0")

    created = arm.compute.virtual_machines.begin_create_or_update(
        "pool-1", "node-0", _vm_model(nic)
    ).result()

    assert created.provisioning_state == "Succeeded"
    vm = arm.compute.virtual_machines.get("pool-1", "node-0")
    assert vm.hardware_profile.vm_size == "Standard_ND96asr_v4"
    assert vm.priority == "Spot"
    assert vm.eviction_policy == "Delete"
    assert vm.billing_profile.max_price == -1
    assert vm.storage_profile.image_reference.offer == "ubuntu-hpc"
    assert vm.os_profile.admin_username == "skyward"
    assert vm.os_profile.linux_configuration.ssh.public_keys[0].key_data == SSH_KEY
    assert vm.os_profile.custom_data is None  # write-only, as in Azure
    assert fake.custom_data("pool-1", "node-0") == CLOUD_INIT
    assert _power(arm, "pool-1", "node-0") == ["PowerState/running"]
    assert fake.vm_addresses("pool-1", "node-0") == ("10.123.7.21", "10.123.200.21")
    nic_body = arm.network.network_interfaces.get("pool-1", "node-0-nic")
    assert nic_body.enable_accelerated_networking is True
    assert nic_body.virtual_machine.id.lower() == vm.id.lower()
    (rule,) = fake.nsg_rules("pool-1", "node-0-nsg")
    assert rule["properties"]["sourceAddressPrefix"] == CLIENT_CIDR
    assert rule["properties"]["destinationPortRange"] == "22"
    assert [v.name for v in arm.compute.virtual_machines.list("pool-1")] == ["node-0"]
    assert [v.name for v in arm.compute.virtual_machines.list_all()] == ["node-0"]


def test_deallocate_then_deleting_the_resource_group_leaves_nothing(
    fake: AzureFake, arm: AzureClients
) -> None:
    _resource_group(arm, "pool-2")
    nic = _network(arm, "pool-2", "node-0")
    arm.compute.virtual_machines.begin_create_or_update("pool-2", "node-0", _vm_model(nic)).result()

    arm.compute.virtual_machines.begin_deallocate("pool-2", "node-0").result()
    assert _power(arm, "pool-2", "node-0") == ["PowerState/deallocated"]

    arm.resource.resource_groups.begin_delete("pool-2").result()

    assert not arm.resource.resource_groups.check_existence("pool-2")
    assert fake.resource_groups() == []
    assert fake.resources("pool-2") == []


def test_vm_delete_keeps_the_nic_and_ip_unless_told_and_a_nic_in_use_cannot_go(
    fake: AzureFake, arm: AzureClients
) -> None:
    _resource_group(arm, "pool-3")
    nic = _network(arm, "pool-3", "node-0")
    arm.compute.virtual_machines.begin_create_or_update("pool-3", "node-0", _vm_model(nic)).result()

    with pytest.raises(HttpResponseError) as caught:
        arm.network.network_interfaces.begin_delete("pool-3", "node-0-nic").result()
    assert _error(caught).code == "NicInUse"

    arm.compute.virtual_machines.begin_delete("pool-3", "node-0").result()
    left = sorted(r.type for r in arm.resource.resources.list_by_resource_group("pool-3"))
    assert left == [  # the OS disk went with it (deleteOption Delete), the network stayed
        "Microsoft.Network/networkInterfaces",
        "Microsoft.Network/networkSecurityGroups",
        "Microsoft.Network/publicIPAddresses",
        "Microsoft.Network/virtualNetworks",
    ]
    arm.network.network_interfaces.begin_delete("pool-3", "node-0-nic").result()


def test_a_pool_created_in_parallel_all_lands(fake: AzureFake, arm: AzureClients) -> None:
    _resource_group(arm, "pool-p")
    nics = [_network(arm, "pool-p", f"node-{i}") for i in range(4)]

    def create(index: int) -> str:
        poller = arm.compute.virtual_machines.begin_create_or_update(
            "pool-p", f"node-{index}", _vm_model(nics[index])
        )
        return str(poller.result().provisioning_state)

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(create, range(4))) == ["Succeeded"] * 4
    assert sorted(v["powerState"] for v in fake.vms("pool-p")) == ["running"] * 4


def test_a_dynamic_public_ip_has_an_address_only_while_its_vm_runs(
    fake: AzureFake, arm: AzureClients
) -> None:
    _resource_group(arm, "pool-d")
    nic = _network(arm, "pool-d", "node-0", ip="Dynamic")
    assert arm.network.public_ip_addresses.get("pool-d", "node-0-ip").ip_address is None

    arm.compute.virtual_machines.begin_create_or_update("pool-d", "node-0", _vm_model(nic)).result()
    assert arm.network.public_ip_addresses.get("pool-d", "node-0-ip").ip_address

    arm.compute.virtual_machines.begin_deallocate("pool-d", "node-0").result()
    assert arm.network.public_ip_addresses.get("pool-d", "node-0-ip").ip_address is None


def test_leftovers_are_found_by_tag_across_the_subscription(arm: AzureClients) -> None:
    _resource_group(arm, "pool-l")
    arm.network.public_ip_addresses.begin_create_or_update(
        "pool-l", "ip-a", {"location": LOCATION, "tags": {"skyward-pool": "p1"}}
    ).result()
    arm.network.public_ip_addresses.begin_create_or_update(
        "pool-l", "ip-b", {"location": LOCATION, "tags": {"skyward-pool": "p2"}}
    ).result()

    found = arm.resource.resources.list(filter="tagName eq 'skyward-pool' and tagValue eq 'p1'")

    assert [r.name for r in found] == ["ip-a"]


def test_an_operation_nobody_polls_still_finishes(fake: AzureFake, arm: AzureClients) -> None:
    fake.operation_seconds = 0.1
    _resource_group(arm, "pool-f")

    arm.resource.resource_groups.begin_delete("pool-f", polling=False)  # fire and forget
    assert [g["properties"]["provisioningState"] for g in fake.resource_groups()] == ["Deleting"]

    time.sleep(0.15)
    assert fake.resource_groups() == []


# ── failures ────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "code",
    [
        "OperationNotAllowed",
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
    ],
)
def test_a_create_failing_in_its_operation_arrives_with_its_code(
    fake: AzureFake, arm: AzureClients, code: str
) -> None:
    _resource_group(arm, "pool-4")
    nic = _network(arm, "pool-4", "node-0")
    fake.fail_vm_create(code, location=LOCATION, size="Standard_ND96asr_v4")

    with pytest.raises(HttpResponseError) as caught:
        arm.compute.virtual_machines.begin_create_or_update(
            "pool-4", "node-0", _vm_model(nic)
        ).result()

    assert _error(caught).code == code
    # As in Azure, the failed VM stays behind for the provider to delete.
    assert fake.vm("pool-4", "node-0")["properties"]["provisioningState"] == "Failed"
    arm.compute.virtual_machines.begin_delete("pool-4", "node-0").result()
    assert fake.vms("pool-4") == []


def test_quota_beyond_the_limit_is_refused_at_the_put_with_409(
    fake: AzureFake, arm: AzureClients
) -> None:
    fake.set_quota(LOCATION, "lowPriorityCores", 100)
    _resource_group(arm, "pool-5")
    first, second = _network(arm, "pool-5", "node-0"), _network(arm, "pool-5", "node-1")
    arm.compute.virtual_machines.begin_create_or_update(
        "pool-5", "node-0", _vm_model(first)
    ).result()

    with pytest.raises(ResourceExistsError) as caught:
        arm.compute.virtual_machines.begin_create_or_update("pool-5", "node-1", _vm_model(second))

    assert _error(caught).code == "OperationNotAllowed"
    assert "Current Usage: 96" in str(_error(caught).message)
    assert [v["name"] for v in fake.vms("pool-5")] == ["node-0"]


def test_authorization_failure_is_a_403_and_nothing_is_created(
    fake: AzureFake, arm: AzureClients
) -> None:
    _resource_group(arm, "pool-6")
    nic = _network(arm, "pool-6", "node-0")
    fake.fail_requests(403, "AuthorizationFailed", method="PUT", path="/virtualMachines/")

    with pytest.raises(HttpResponseError) as caught:
        arm.compute.virtual_machines.begin_create_or_update("pool-6", "node-0", _vm_model(nic))

    assert caught.value.status_code == 403
    assert _error(caught).code == "AuthorizationFailed"
    assert "Microsoft.Compute/virtualMachines/write" in str(_error(caught).message)
    assert fake.vms() == []
    assert not fake.requests("GET", "Microsoft.Compute/locations")  # no operation started


def test_custom_data_that_is_not_base64_is_refused(arm: AzureClients) -> None:
    _resource_group(arm, "pool-7")
    vm = _vm_model(_network(arm, "pool-7", "node-0"))
    vm.os_profile.custom_data = CLOUD_INIT.decode()  # the SDK does not encode it for you

    with pytest.raises(HttpResponseError) as caught:
        arm.compute.virtual_machines.begin_create_or_update("pool-7", "node-0", vm)

    assert _error(caught).code == "InvalidParameter"
    assert _error(caught).target == "customData"


# ── things that happen to a VM from outside ─────────────────────────────────────────────


def test_a_vm_stopped_from_inside_then_evicted(fake: AzureFake, arm: AzureClients) -> None:
    _resource_group(arm, "pool-8")
    nic = _network(arm, "pool-8", "node-0")
    arm.compute.virtual_machines.begin_create_or_update("pool-8", "node-0", _vm_model(nic)).result()

    fake.stop_from_inside("pool-8", "node-0")
    assert _power(arm, "pool-8", "node-0") == ["PowerState/stopped"]

    fake.evict("pool-8", "node-0")
    with pytest.raises(ResourceNotFoundError):
        arm.compute.virtual_machines.get("pool-8", "node-0")
    left = {r["type"] for r in fake.resources("pool-8")}
    assert "Microsoft.Compute/disks" not in left
    assert "Microsoft.Network/networkInterfaces" in left  # its deleteOption was Detach


# ── sizes ───────────────────────────────────────────────────────────────────────────────


def test_skus_show_capabilities_and_restrictions(fake: AzureFake, arm: AzureClients) -> None:
    fake.restrict_sku("Standard_ND96isr_H100_v5", LOCATION, zones=("2",))

    skus = {s.name: s for s in arm.compute.resource_skus.list(filter=f"location eq '{LOCATION}'")}

    assert set(skus) >= {"Standard_D4s_v5", "Standard_NC24ads_A100_v4", "Standard_ND96asr_v4"}
    capabilities = {c.name: c.value for c in skus["Standard_ND96asr_v4"].capabilities}
    assert (capabilities["vCPUs"], capabilities["MemoryGB"], capabilities["GPUs"]) == (
        "96",
        "900",
        "8",
    )
    (restriction,) = skus["Standard_ND96isr_H100_v5"].restrictions
    assert restriction.type == "Zone"
    assert restriction.reason_code == "NotAvailableForSubscription"
    assert restriction.restriction_info.zones == ["2"]
    assert skus["Standard_D4s_v5"].restrictions == []
    sizes = {s.name: s for s in arm.compute.virtual_machine_sizes.list(LOCATION)}
    assert sizes["Standard_NC40ads_H100_v5"].number_of_cores == 40


def test_a_restricted_size_is_refused_in_that_zone_only(fake: AzureFake, arm: AzureClients) -> None:
    fake.restrict_sku("Standard_ND96asr_v4", LOCATION, zones=("2",))
    _resource_group(arm, "pool-9")
    refused, allowed = (
        _vm_model(_network(arm, "pool-9", "a")),
        _vm_model(_network(arm, "pool-9", "b")),
    )
    refused.zones, allowed.zones = ["2"], ["1"]

    with pytest.raises(ResourceExistsError) as caught:
        arm.compute.virtual_machines.begin_create_or_update("pool-9", "a", refused)
    assert _error(caught).code == "SkuNotAvailable"
    arm.compute.virtual_machines.begin_create_or_update("pool-9", "b", allowed).result()
