"""The accelerator catalog: names parse without a cloud; each cloud picks its machine or says
what it has instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from skyward.providers.cloud import catalog


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A100", catalog.Accelerator("A100")),
        ("a100:8", catalog.Accelerator("A100", 8)),
        ("A100-80GB:8", catalog.Accelerator("A100", 8, 80)),
        ("a100-80gb", catalog.Accelerator("A100", None, 80)),
        (" H100:1 ", catalog.Accelerator("H100", 1)),
        ("l40s:4", catalog.Accelerator("L40S", 4)),
        ("A10G", catalog.Accelerator("A10G")),
    ],
)
def test_parse_reads_name_memory_and_count(text: str, expected: catalog.Accelerator) -> None:
    assert catalog.parse(text) == expected


def test_every_name_the_docs_promise_exists() -> None:
    for name in ("A100", "H100", "L4", "T4", "A10G", "L40S", "V100", "H200"):
        assert catalog.parse(name).name == name


@pytest.mark.parametrize("text", ["B9000", "A100:", "A100:x", "", "A100-80:8", "A100:0"])
def test_parse_refuses_what_no_cloud_has_and_lists_what_exists(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        catalog.parse(text)
    assert "A100" in str(caught.value)


def test_a_bare_name_takes_the_smallest_machine_of_that_cloud() -> None:
    # AWS sells A100s only eight at a time, GCP one at a time.
    assert catalog.choose("aws", "A100").type == "p4d.24xlarge"
    assert catalog.choose("gcp", "A100").type == "a2-highgpu-1g"
    assert catalog.choose("aws", "L4").type == "g6.xlarge"
    assert catalog.choose("azure", "T4").type == "Standard_NC4as_T4_v3"


def test_memory_disambiguates_a100_40_and_80_gb() -> None:
    assert catalog.choose("aws", "A100:8").memory_gb == 40
    assert catalog.choose("aws", "A100-80GB:8").type == "p4de.24xlarge"
    assert catalog.choose("gcp", "A100-80GB:4").type == "a2-ultragpu-4g"
    assert catalog.choose("azure", "A100-40GB:8").type == "Standard_ND96asr_v4"


def test_counts_reach_the_machine_description() -> None:
    machine = catalog.choose("aws", "H100:8")
    assert (machine.type, machine.count, machine.memory_gb, machine.vcpus) == (
        "p5.48xlarge",
        8,
        80,
        192,
    )
    assert catalog.choose("gcp", "T4:2").attach == "nvidia-tesla-t4"


def test_none_is_a_cpu_machine_on_every_cloud() -> None:
    for cloud in ("aws", "gcp", "azure"):
        machine = catalog.choose(cloud, None)
        assert (machine.accelerator, machine.count) == (None, 0)


def test_an_unavailable_count_lists_the_counts_that_exist() -> None:
    with pytest.raises(ValueError) as caught:
        catalog.choose("aws", "A100:1")
    message = str(caught.value)
    assert "'A100-40GB:8' (p4d.24xlarge)" in message
    assert "'A100-80GB:8' (p4de.24xlarge)" in message


def test_an_accelerator_a_cloud_lacks_lists_what_it_has() -> None:
    with pytest.raises(ValueError) as caught:
        catalog.choose("gcp", "A10G")
    assert "gcp has no A10G" in str(caught.value)
    assert "L4" in str(caught.value)


def test_prices_are_per_region_and_unknown_where_the_table_has_none() -> None:
    assert catalog.price("aws", "g5.xlarge") == pytest.approx(1.006)  # us-east-1
    assert catalog.price("aws", "g5.xlarge", "us-east-1") == pytest.approx(1.006)
    assert catalog.price("aws", "g5.xlarge", "eu-west-1") > 1.006  # dearer in Ireland
    assert catalog.price("aws", "m7i.xlarge", "eu-west-1") == pytest.approx(0.2247)
    assert catalog.price("aws", "x9.unknown") is None
    assert catalog.price("aws", "p5.48xlarge", "xx-nowhere-1") is None
    # GCP's table is per region too (us-central1 is its reference region).
    assert catalog.price("gcp", "a2-highgpu-1g") == pytest.approx(3.673385)
    assert catalog.price("gcp", "a2-highgpu-1g", "europe-west4") == pytest.approx(3.747972)
    assert catalog.price("gcp", "a2-highgpu-1g", "xx-nowhere1") is None
    # Sold in a few regions only, and not in the reference one.
    assert catalog.price("gcp", "a3-megagpu-8g") is None
    assert catalog.price("gcp", "a3-megagpu-8g", "europe-west4") is not None


def test_every_gcp_machine_with_built_in_gpus_or_none_has_prices_in_several_regions() -> None:
    for machine in catalog.machines("gcp"):
        if machine.attach is None and machine.type != "a3-ultragpu-8g":
            table = catalog.ON_DEMAND["gcp"][machine.type]
            assert len(table) >= 9, machine.type


def test_gcp_n1_machines_are_priced_by_their_gpus_not_by_their_shared_type() -> None:
    t4, v100 = catalog.choose("gcp", "T4:2"), catalog.choose("gcp", "V100:1")
    assert t4.type == v100.type == "n1-standard-8"
    assert catalog.machine_price(t4) == pytest.approx(0.38 + 2 * 0.35, abs=0.001)
    assert catalog.machine_price(v100) == pytest.approx(0.38 + 2.48, abs=0.001)
    assert v100.hourly == catalog.machine_price(v100)
    assert catalog.machine_price(v100, "europe-west4") is None
    unpriced = {m.type for m in catalog.machines("gcp") if m.hourly is None}
    assert unpriced == {"a3-megagpu-8g", "a3-ultragpu-8g"}  # not published per machine


def test_every_aws_machine_has_a_price_in_the_reference_region() -> None:
    assert all(m.hourly for m in catalog.machines("aws")), "aws/prices.json lacks a type"


def test_each_machine_type_is_listed_once_per_accelerator() -> None:
    seen: set[tuple[str, str, str | None]] = set()
    for machine in catalog.MACHINES:
        key = (machine.cloud, machine.type, machine.accelerator)
        assert key not in seen, machine
        seen.add(key)


def test_vcpus_and_memory_pick_the_cheapest_machine_that_has_them() -> None:
    assert catalog.choose("aws", None, vcpus=64, memory_gb=256).type == "m7i.16xlarge"
    assert catalog.choose("aws", None, vcpus=2).type == "m7i.large"
    assert catalog.choose("aws", None).type == "m7i.xlarge"  # the default, unasked
    assert catalog.choose("aws", "L4", vcpus=16).type == "g6.4xlarge"
    assert catalog.choose("aws", "L4:4", memory_gb=300).type == "g6.24xlarge"
    assert catalog.choose("aws", "A10G", memory_gb=100).type == "g5.8xlarge"


def test_a_request_no_machine_satisfies_names_the_largest() -> None:
    with pytest.raises(ValueError) as caught:
        catalog.choose("aws", "L4:1", vcpus=128)
    assert "g6.16xlarge (64 vCPUs" in str(caught.value)


def test_matching_lists_every_fitting_machine_cheapest_first() -> None:
    found = [m.type for m in catalog.matching("aws", "T4", vcpus=8)]
    assert found[0] == "g4dn.2xlarge"
    assert "g4dn.xlarge" not in found
    assert found == sorted(found, key=lambda t: catalog.price("aws", t) or 0)


def test_failover_alternatives_keep_the_accelerator_count_and_grow_only() -> None:
    a100 = catalog.choose("aws", "A100:8")
    assert [m.type for m in catalog.alternatives(a100, "A100:8")] == ["p4de.24xlarge"]
    assert catalog.alternatives(a100, "A100-40GB:8") == []  # memory pinned
    l4 = catalog.choose("aws", "L4")
    moved = [m.type for m in catalog.alternatives(l4, "L4")]
    assert moved[0] == "g6.2xlarge" and all(catalog.find("aws", t).count == 1 for t in moved)
    assert catalog.alternatives(catalog.choose("aws", None), None) == []


def test_an_instance_type_smaller_than_the_request_is_refused() -> None:
    small = catalog.find("aws", "m7i.xlarge")
    assert small is not None
    with pytest.raises(ValueError, match="fewer than vcpus=64"):
        catalog.refuse_contradiction(small, vcpus=64, memory_gb=None, given="instance_type")
    with pytest.raises(ValueError, match="less than memory_gb=256"):
        catalog.refuse_contradiction(small, vcpus=None, memory_gb=256, given="instance_type")
    catalog.refuse_contradiction(small, vcpus=4, memory_gb=16, given="instance_type")


def test_the_catalog_reads_each_clouds_data_files_and_imports_no_clouds_code() -> None:
    script = (
        "import sys\n"
        "from skyward.providers.cloud import catalog\n"
        "catalog.catalog(); catalog.choose('aws', 'A100'); catalog.price('gcp', 'g2-standard-4')\n"
        "loaded = [m for m in sys.modules if m.split('.')[:3][-1] in catalog.CLOUDS\n"
        "          or m.split('.')[0] in ('boto3', 'google', 'azure')]\n"
        "print(loaded)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert ran.stdout.strip() == "[]", ran.stdout
    providers = Path(catalog.__file__).parent.parent
    with_data = {p.parent.name for p in providers.glob("*/machines.json")}
    assert with_data == set(catalog.CLOUDS)
    assert all((providers / cloud / "prices.json").is_file() for cloud in catalog.CLOUDS)
