"""The accelerator catalog: names parse without a cloud; each cloud picks its machine or says
what it has instead."""

from __future__ import annotations

import pytest

from skyward.providers import catalog


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


def test_prices_are_known_for_aws_only_where_the_catalog_has_them() -> None:
    assert catalog.price("aws", "g5.xlarge") == pytest.approx(1.006)
    assert catalog.price("aws", "x9.unknown") is None
    assert catalog.price("gcp", "a2-highgpu-1g") is None


def test_each_cloud_lists_one_machine_per_accelerator_count_and_memory() -> None:
    seen: set[tuple[str, str | None, int, int]] = set()
    for machine in catalog.MACHINES:
        key = (machine.cloud, machine.accelerator, machine.count, machine.memory_gb)
        assert key not in seen, machine
        seen.add(key)
