"""The Compute Engine fake, driven only through the real ``google-cloud-compute`` clients.

These pin what the GCP provider's tests rely on: the JSON shapes the SDK parses, operations that
finish later and are waited for on this endpoint, list filters and paging evaluated for real,
and GCE's errors arriving as the exceptions and operation errors the SDK makes of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from google.api_core import exceptions
from google.api_core.retry import Retry, if_exception_type
from google.cloud import compute_v1
from support.clouds.gcp.fake import (
    BACKEND_ERROR,
    QUOTA_EXCEEDED,
    RESOURCE_POOL_EXHAUSTED,
    RESOURCE_POOL_EXHAUSTED_DIRECT,
    ComputeClients,
    GCPFake,
    operation_error,
)

PROJECT = "skyward-tests"
ZONE = "us-central1-a"
UBUNTU = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
DONE = compute_v1.Operation.Status.DONE
RUNNING = compute_v1.Operation.Status.RUNNING
USER_DATA = "#cloud-config\nruncmd:\n  - echo hello\n"


@pytest.fixture(scope="module")
def gcp_server() -> Iterator[GCPFake]:
    with GCPFake() as fake, pytest.MonkeyPatch.context() as patch:
        for name, value in fake.environ().items():
            patch.setenv(name, value)
        yield fake


@pytest.fixture
def gcp(gcp_server: GCPFake) -> GCPFake:
    gcp_server.reset()
    return gcp_server


@pytest.fixture(scope="module")
def clients(gcp_server: GCPFake) -> ComputeClients:
    return ComputeClients.at(gcp_server.url)


def vm(
    name: str,
    *,
    zone: str = ZONE,
    machine_type: str = "n2-standard-4",
    labels: dict[str, str] | None = None,
    spot: bool = False,
    termination: str = "DELETE",
    **fields: object,
) -> compute_v1.Instance:
    scheduling = compute_v1.Scheduling(
        provisioning_model="SPOT" if spot else "STANDARD",
        instance_termination_action=termination if spot else None,
        on_host_maintenance="TERMINATE",
        automatic_restart=False,
    )
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{machine_type}",
        labels=labels or {},
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="user-data", value=USER_DATA)]),
        scheduling=scheduling,
        tags=compute_v1.Tags(items=["skyward"]),
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=UBUNTU, disk_size_gb=50
                ),
            )
        ],
        network_interfaces=[
            compute_v1.NetworkInterface(
                network="global/networks/default",
                access_configs=[
                    compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")
                ],
            )
        ],
        **fields,
    )


def create(clients: ComputeClients, instance: compute_v1.Instance, zone: str = ZONE) -> None:
    operation = clients.instances.insert(project=PROJECT, zone=zone, instance_resource=instance)
    done = clients.wait(operation, timeout=10)
    assert not done.error.errors, done.error


def get(clients: ComputeClients, name: str, zone: str = ZONE) -> compute_v1.Instance:
    return clients.instances.get(project=PROJECT, zone=zone, instance=name, retry=None)


# ── instances ───────────────────────────────────────────────────────────────────────────────


def test_insert_returns_a_running_operation_and_the_instance_runs_once_it_is_done(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    gcp.operation_delay = 0.3
    gcp.queue_addresses(("10.123.7.11", "10.123.8.11"))
    started = time.monotonic()
    instance = vm("node-0", machine_type="a2-highgpu-1g", labels={"skyward-pool": "p"}, spot=True)

    operation = clients.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance)

    assert operation.status == RUNNING
    assert operation.operation_type == "insert"
    assert get(clients, "node-0").status == "PROVISIONING"
    done = clients.wait(operation, timeout=10)
    assert done.status == DONE and not done.error.errors
    assert time.monotonic() - started >= 0.3
    node = get(clients, "node-0")
    assert node.status == "RUNNING"
    assert node.id > 0 and node.machine_type.endswith(f"/zones/{ZONE}/machineTypes/a2-highgpu-1g")
    assert dict(node.labels) == {"skyward-pool": "p"}
    assert [(i.key, i.value) for i in node.metadata.items] == [("user-data", USER_DATA)]
    assert node.scheduling.provisioning_model == "SPOT"
    assert node.scheduling.instance_termination_action == "DELETE"
    assert [
        (a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count)
        for a in node.guest_accelerators
    ] == [("nvidia-tesla-a100", 1)]
    assert node.disks[0].boot and node.disks[0].disk_size_gb == 50
    assert list(node.tags.items) == ["skyward"]
    interface = node.network_interfaces[0]
    assert (interface.network_i_p, interface.access_configs[0].nat_i_p) == (
        "10.123.7.11",
        "10.123.8.11",
    )
    # The raw JSON keeps GCE's types: ids and int64 fields travel as decimal strings.
    (raw,) = gcp.instances(PROJECT)
    assert raw["id"].isdigit() and raw["disks"][0]["diskSizeGb"] == "50"
    assert gcp.requests("POST", f"projects/*/zones/{ZONE}/operations/*/wait")


def test_an_address_plan_chooses_addresses_and_no_access_config_means_no_external_one(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    gcp.address_plan = lambda project, zone, name: (f"10.123.9.{name[-1]}", "10.123.10.1")
    internal_only = vm("node-3")
    internal_only.network_interfaces[0].access_configs = []

    create(clients, internal_only)

    interface = get(clients, "node-3").network_interfaces[0]
    assert interface.network_i_p == "10.123.9.3"
    assert not interface.access_configs


def test_list_evaluates_a_label_filter_and_follows_pages(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    for index in range(5):
        create(clients, vm(f"p-{index}", labels={"skyward-pool": "p"}))
    for index in range(2):
        create(clients, vm(f"q-{index}", labels={"skyward-pool": "q"}))
    request = compute_v1.ListInstancesRequest(
        project=PROJECT, zone=ZONE, filter='labels.skyward-pool = "p"', max_results=2
    )

    names = [i.name for i in clients.instances.list(request=request)]

    assert names == [f"p-{index}" for index in range(5)]
    pages = gcp.requests("GET", f"projects/{PROJECT}/zones/{ZONE}/instances")
    assert [("pageToken" in r.query, r.query["maxResults"]) for r in pages] == [
        (False, "2"),
        (True, "2"),
        (True, "2"),
    ]

    def listed(expression: str) -> list[str]:
        found = clients.instances.list(
            request={"project": PROJECT, "zone": ZONE, "filter": expression}
        )
        return [i.name for i in found]

    assert listed('(labels.skyward-pool = "q") AND (status = RUNNING)') == ["q-0", "q-1"]
    assert listed('labels.skyward-pool = "q" OR name = "p-4"') == ["p-4", "q-0", "q-1"]
    assert listed('(name eq "p-[0-1]") (labels.skyward-pool eq p)') == ["p-0", "p-1"]
    assert listed("labels.skyward-pool:*") == [*(f"p-{i}" for i in range(5)), "q-0", "q-1"]
    assert listed('labels.skyward-pool != "p"') == ["q-0", "q-1"]
    with pytest.raises(exceptions.BadRequest):
        listed('(name eq "p-.*") (labels.skyward-pool = "p")')  # the two forms do not mix


def test_aggregated_list_finds_labelled_instances_in_every_zone(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    zones = ["us-central1-a", "us-east4-b", "europe-west4-c"]
    for index, zone in enumerate(zones):
        create(clients, vm(f"left-{index}", zone=zone, labels={"skyward-pool": "p"}), zone)
    create(clients, vm("unrelated", zone="us-east4-b"), "us-east4-b")
    request = compute_v1.AggregatedListInstancesRequest(
        project=PROJECT, filter='labels.skyward-pool = "p"', max_results=1
    )

    found = [
        (scope, instance.name)
        for scope, scoped in clients.instances.aggregated_list(request=request)
        for instance in scoped.instances
    ]

    assert sorted(found) == sorted((f"zones/{z}", f"left-{i}") for i, z in enumerate(zones))
    assert len(gcp.requests("GET", f"projects/{PROJECT}/aggregated/instances")) == 3


def test_delete_stops_the_instance_and_removes_it_when_its_operation_is_done(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    create(clients, vm("node-0"))
    gcp.operation_delay = 0.2

    operation = clients.instances.delete(project=PROJECT, zone=ZONE, instance="node-0")

    assert get(clients, "node-0").status == "STOPPING"
    assert clients.wait(operation, timeout=10).status == DONE
    with pytest.raises(exceptions.NotFound):
        get(clients, "node-0")
    assert not list(clients.instances.list(project=PROJECT, zone=ZONE))
    assert gcp.instances(PROJECT) == []


def test_stop_guest_poweroff_and_preemption_end_instances_as_gce_does(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    create(clients, vm("stopped"))
    create(clients, vm("powered-off"))
    create(clients, vm("spot-delete", spot=True, termination="DELETE"))
    create(clients, vm("spot-stop", spot=True, termination="STOP"))

    operation = clients.instances.stop(project=PROJECT, zone=ZONE, instance="stopped")
    clients.wait(operation, timeout=10)
    gcp.stop_instance(PROJECT, ZONE, "powered-off")
    gcp.preempt(PROJECT, ZONE, "spot-delete")
    gcp.preempt(PROJECT, ZONE, "spot-stop")

    assert get(clients, "stopped").status == "TERMINATED"
    assert get(clients, "powered-off").status == "TERMINATED"
    assert get(clients, "spot-stop").status == "TERMINATED"
    with pytest.raises(exceptions.NotFound):
        get(clients, "spot-delete")
    request = compute_v1.ListZoneOperationsRequest(
        project=PROJECT, zone=ZONE, filter='operationType = "compute.instances.preempted"'
    )
    preempted = [o.target_link.rsplit("/", 1)[-1] for o in clients.zone_operations.list(request)]
    assert preempted == ["spot-delete", "spot-stop"]
    with pytest.raises(ValueError, match="not a Spot VM"):
        gcp.preempt(PROJECT, ZONE, "stopped")


# ── operations ──────────────────────────────────────────────────────────────────────────────


def test_wait_returns_an_unfinished_operation_after_its_limit_until_the_test_finishes_it(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    gcp.operation_delay = None
    gcp.wait_limit = 0.1
    operation = clients.instances.insert(project=PROJECT, zone=ZONE, instance_resource=vm("n"))

    waited = clients.zone_operations.wait(project=PROJECT, zone=ZONE, operation=operation.name)
    assert waited.status == RUNNING
    with pytest.raises(TimeoutError):
        clients.wait(operation, timeout=0.3)
    gcp.wait_limit = 5.0  # a server-side wait longer than the caller's deadline
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        clients.wait(operation, timeout=0.3)
    assert time.monotonic() - started < 1.0

    gcp.finish_operations()
    assert clients.wait(operation, timeout=1).status == DONE
    assert get(clients, "n").status == "RUNNING"


def test_an_operation_error_arrives_in_the_operation_with_its_http_status(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    gcp.fail_next_insert(ZONE, RESOURCE_POOL_EXHAUSTED)
    gcp.queue_addresses(("10.123.7.21", "10.123.8.21"))

    operation = clients.instances.insert(project=PROJECT, zone=ZONE, instance_resource=vm("n"))
    done = clients.wait(operation, timeout=10)

    assert done.status == DONE
    assert [e.code for e in done.error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    assert f"zones/{ZONE}" in done.error.errors[0].message
    # Both fields are set, as GCE sets them: the SDK raises only when it sees both.
    assert (done.http_error_status_code, done.http_error_message) == (503, "SERVICE UNAVAILABLE")
    assert isinstance(operation_error(done), exceptions.ServiceUnavailable)
    with pytest.raises(exceptions.NotFound):
        get(clients, "n")  # a failed insert leaves no instance behind
    # The retry in another zone gets the addresses the failed insert had.
    create(clients, vm("n", zone="us-central1-b"), "us-central1-b")
    assert get(clients, "n", "us-central1-b").network_interfaces[0].network_i_p == "10.123.7.21"


# ── faults a test injects ───────────────────────────────────────────────────────────────────


def test_an_injected_quota_error_is_forbidden_with_reason_quota_exceeded_once(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    gcp.fail_next_insert(ZONE, QUOTA_EXCEEDED)

    with pytest.raises(exceptions.Forbidden) as raised:
        clients.instances.insert(project=PROJECT, zone=ZONE, instance_resource=vm("n"))

    assert raised.value.code == 403
    assert raised.value.errors[0]["reason"] == "quotaExceeded"
    assert "us-central1" in raised.value.message
    assert gcp.instances(PROJECT) == []
    create(clients, vm("n"))  # the fault was for the next insert only
    assert [i["name"] for i in gcp.instances(PROJECT)] == ["n"]


def test_exhausted_zones_and_unoffered_machine_types_are_bad_requests(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    gcp.fail_next_insert(ZONE, RESOURCE_POOL_EXHAUSTED_DIRECT)
    with pytest.raises(exceptions.BadRequest) as exhausted:
        clients.instances.insert(project=PROJECT, zone=ZONE, instance_resource=vm("n"))
    assert exhausted.value.errors[0]["reason"] == "ZONE_RESOURCE_POOL_EXHAUSTED"

    unoffered = vm("n", zone="us-central1-b", machine_type="a3-highgpu-8g")
    with pytest.raises(exceptions.BadRequest) as refused:
        clients.instances.insert(project=PROJECT, zone="us-central1-b", instance_resource=unoffered)
    assert refused.value.errors[0]["reason"] == "invalid"
    assert "does not exist in zone 'us-central1-b'" in refused.value.message
    assert not gcp.requests("POST", "projects/*/zones/*/operations/*/wait")
    assert gcp.instances(PROJECT) == []


def test_a_503_fails_at_once_with_retry_none_and_passes_with_a_bounded_retry(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    create(clients, vm("n"))
    gcp.fail_requests("GET", f"projects/*/zones/{ZONE}/instances/n", BACKEND_ERROR, times=2)

    with pytest.raises(exceptions.ServiceUnavailable):
        get(clients, "n")
    retry = Retry(
        predicate=if_exception_type(exceptions.ServiceUnavailable),
        initial=0.01,
        maximum=0.05,
        timeout=5,
    )
    found = clients.instances.get(project=PROJECT, zone=ZONE, instance="n", retry=retry)

    assert found.status == "RUNNING"
    assert len(gcp.requests("GET", f"projects/*/zones/{ZONE}/instances/n")) == 3


def test_gce_refuses_what_the_provider_must_not_send(gcp: GCPFake, clients: ComputeClients) -> None:
    create(clients, vm("n"))

    def insert(instance: compute_v1.Instance) -> None:
        clients.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance)

    with pytest.raises(exceptions.Conflict) as duplicate:
        insert(vm("n"))
    assert duplicate.value.errors[0]["reason"] == "alreadyExists"
    with pytest.raises(exceptions.BadRequest, match="Label key 'Pool'"):
        insert(vm("m", labels={"Pool": "p"}))
    migrating = vm("m", machine_type="g2-standard-4")
    migrating.scheduling.on_host_maintenance = "MIGRATE"
    with pytest.raises(exceptions.BadRequest, match="guest accelerators"):
        insert(migrating)
    unknown_image = vm("m")
    unknown_image.disks[0].initialize_params.source_image = UBUNTU.replace("2404", "9999")
    with pytest.raises(exceptions.NotFound):
        insert(unknown_image)
    assert [i["name"] for i in gcp.instances(PROJECT)] == ["n"]


# ── firewalls ───────────────────────────────────────────────────────────────────────────────


def test_firewalls_insert_list_by_name_and_delete_with_global_operations(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    def firewall(name: str) -> compute_v1.Firewall:
        return compute_v1.Firewall(
            name=name,
            description="skyward pool p",
            network="global/networks/default",
            allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
            source_ranges=["0.0.0.0/0"],
            target_tags=["skyward-p"],
        )

    for name in ("skyward-p-ssh", "other-rule"):
        operation = clients.firewalls.insert(project=PROJECT, firewall_resource=firewall(name))
        assert "/global/operations/" in operation.self_link
        assert clients.wait(operation, timeout=10).status == DONE

    rule = clients.firewalls.get(project=PROJECT, firewall="skyward-p-ssh")
    assert (rule.allowed[0].I_p_protocol, list(rule.allowed[0].ports)) == ("tcp", ["22"])
    assert list(rule.target_tags) == ["skyward-p"] and rule.direction == "INGRESS"
    for expression in ('name eq "skyward-p-.*"', 'name = "skyward-p-*"'):
        listed = clients.firewalls.list(request={"project": PROJECT, "filter": expression})
        assert [f.name for f in listed] == ["skyward-p-ssh"]

    operation = clients.firewalls.delete(project=PROJECT, firewall="skyward-p-ssh")
    assert clients.wait(operation, timeout=10).status == DONE
    with pytest.raises(exceptions.NotFound):
        clients.firewalls.get(project=PROJECT, firewall="skyward-p-ssh")
    assert [f["name"] for f in gcp.firewalls(PROJECT)] == ["other-rule"]


# ── the catalogue ───────────────────────────────────────────────────────────────────────────


def test_machine_types_give_cpus_memory_and_gpus_and_differ_by_zone(
    gcp: GCPFake, clients: ComputeClients
) -> None:
    a2 = clients.machine_types.get(project=PROJECT, zone=ZONE, machine_type="a2-highgpu-8g")
    assert (a2.guest_cpus, a2.memory_mb) == (96, 696320)
    assert [(a.guest_accelerator_type, a.guest_accelerator_count) for a in a2.accelerators] == [
        ("nvidia-tesla-a100", 8)
    ]

    offered = {m.name for m in clients.machine_types.list(project=PROJECT, zone="us-central1-f")}
    assert {"n2-standard-4", "a2-highgpu-1g", "a2-highgpu-8g"} <= offered
    assert not {"a2-ultragpu-1g", "a3-highgpu-8g"} & offered
    with pytest.raises(exceptions.NotFound):
        clients.machine_types.get(
            project=PROJECT, zone="us-central1-f", machine_type="a3-highgpu-8g"
        )
    with pytest.raises(exceptions.NotFound):
        clients.machine_types.get(project=PROJECT, zone=ZONE, machine_type="z9-giant-1g")
    l4 = clients.accelerator_types.get(project=PROJECT, zone=ZONE, accelerator_type="nvidia-l4")
    assert l4.maximum_cards_per_instance == 8


def test_image_families_and_the_zones_of_a_region(gcp: GCPFake, clients: ComputeClients) -> None:
    ubuntu = clients.images.get_from_family(
        project="ubuntu-os-cloud", family="ubuntu-2404-lts-amd64"
    )
    assert ubuntu.self_link.startswith(
        "https://www.googleapis.com/compute/v1/projects/ubuntu-os-cloud/global/images/ubuntu-2404"
    )
    learning = clients.images.get_from_family(
        project="deeplearning-platform-release", family="common-cu124-ubuntu-2204-py310"
    )
    assert learning.family == "common-cu124-ubuntu-2204-py310" and learning.disk_size_gb == 50
    with pytest.raises(exceptions.NotFound):
        clients.images.get_from_family(project="ubuntu-os-cloud", family="ubuntu-9999-lts")

    in_region = [z.name for z in clients.region_zones.list(project=PROJECT, region="us-east4")]
    assert in_region == ["us-east4-a", "us-east4-b", "us-east4-c"]
    region = clients.regions.get(project=PROJECT, region="us-east4")
    assert [z.rsplit("/", 1)[-1] for z in region.zones] == in_region
    listed = clients.zones.list(request={"project": PROJECT, "filter": 'region eq ".*/us-east4"'})
    assert [z.name for z in listed] == in_region
