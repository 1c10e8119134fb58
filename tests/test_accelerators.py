"""``sky.accelerators``: accelerators as values that mean exactly what their strings mean,
the catalog's machine types and prices as rows, and refusals that name who offers what was
asked for."""

from __future__ import annotations

import pydantic
import pytest

import skyward as sky
from skyward.accelerators import A100, H100, Custom
from skyward.providers.cloud import catalog
from skyward.providers.slurm import gres_for


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (A100(), "A100"),
        (A100(count=8), "A100:8"),
        (A100(memory="80GB"), "A100-80GB"),
        (A100(memory=40, count=8), "A100-40GB:8"),
        (H100(count=4), "H100:4"),
        (sky.accelerators.H200(), "H200"),
        (sky.accelerators.L4(count=4), "L4:4"),
        (sky.accelerators.L40S(), "L40S"),
        (sky.accelerators.A10G(), "A10G"),
        (sky.accelerators.T4(), "T4"),
        (sky.accelerators.V100(count=8), "V100:8"),
        (Custom("MI300X", count=8, memory="192GB"), "MI300X-192GB:8"),
        (sky.accelerators.MI300X(count=8), "MI300X:8"),
        (sky.accelerators.RTX_4090(count=2), "RTX_4090:2"),
        (sky.accelerators.RTX_3080(memory="10GB"), "RTX_3080-10GB"),
    ],
)
def test_a_value_is_the_request_its_string_is(
    value: sky.accelerators.Accelerator, text: str
) -> None:
    assert str(value) == text
    if value.name in catalog.NAMES:
        assert catalog.parse(text) == value


def test_every_name_in_the_catalog_or_a_marketplace_has_a_factory_and_nothing_else_does() -> None:
    factories = {
        name
        for name in sky.accelerators.__all__
        if name not in {"Accelerator", "CudaAccelerator", "Custom", "Machine", "machines", "names"}
        and name not in sky.accelerators.NOT_OFFERED
        # Cloud TPU types come from GCP's TPU table (tests/providers/gcp/test_tpu.py).
        and name != "TPU"
        and not name.startswith("TPUv")
    }
    marketplaces = set(sky.accelerators.MARKETPLACE)
    assert set(sky.accelerators.names()) == set(catalog.NAMES)
    assert factories == set(catalog.NAMES) | marketplaces
    assert not marketplaces & set(catalog.NAMES)
    for name in factories:
        assert getattr(sky.accelerators, name)().name == name


def test_the_value_reads_as_skyward_05_wrote_it() -> None:
    value = A100(count=8, memory="80GB")
    assert (value.name, value.count, value.memory, value.memory_gb) == ("A100", 8, "80GB", 80)
    assert value.with_count(4) == A100(count=4, memory=80)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: A100(count=0), "count must be a whole number >= 1"),
        (lambda: A100(count=True), "count must be a whole number >= 1"),
        (lambda: A100(memory="lots"), "memory is written '80GB' or 80"),
        (lambda: A100(memory="48GB"), "A100 comes with 40 or 80 GB per device"),
        (lambda: Custom("8 GPUs"), "an accelerator's name is letters"),
    ],
)
def test_a_wrong_value_says_what_is_wrong(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_a_pool_takes_the_value_wherever_it_takes_the_string() -> None:
    ssh = sky.SSH(hosts=["a", "b"])
    pool = sky.ComputePool(provider=ssh, accelerator=A100(count=8), nodes=2)
    assert pool.spec.accelerator == "A100:8"
    assert pool.spec.request(pool.image).accelerator == "A100:8"  # what providers receive
    custom = sky.ComputePool(provider=sky.Slurm(), accelerator=Custom("MI300X", count=8))
    assert gres_for(custom.spec.accelerator) == "gpu:mi300x:8"


def test_anything_else_as_an_accelerator_is_refused_naming_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="accelerator is a name such as"):
        sky.ComputePool(provider=sky.SSH(hosts=["a"]), accelerator=8)  # type: ignore[arg-type]


def test_a_local_pool_refuses_an_accelerator_naming_every_provider_that_offers_it() -> None:
    with pytest.raises(ValueError) as caught:
        sky.ComputePool(accelerator=A100(count=8))
    message = str(caught.value)
    assert "the local pool has no A100:8" in message
    assert "sky.AWS (p4d.24xlarge, p4de.24xlarge)" in message
    assert "sky.GCP (a2-highgpu-8g, a2-ultragpu-8g)" in message
    assert "sky.Azure (Standard_ND96asr_v4, Standard_ND96amsr_A100_v4)" in message


def test_a_name_no_catalog_has_points_at_the_providers_that_take_any_name() -> None:
    with pytest.raises(ValueError, match=r"sky\.SSH and sky\.Slurm run on machines that have it"):
        sky.ComputePool(accelerator=Custom("MI300X"))


def test_a_cloud_without_the_count_asked_for_names_the_cloud_that_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as caught:
        sky.ComputePool(provider=sky.AWS(region="us-east-1"), accelerator=H100(count=4))
    message = str(caught.value)
    assert "aws has no machine with H100:4" in message
    assert "H100:4 is offered by sky.GCP (a3-highgpu-4g)" in message
    assert "sky.Lambda (gpu_4x_h100_sxm5)" in message and "sky.Verda (4H100.80S.176V)" in message


def test_a_cloud_without_the_accelerator_names_who_has_it() -> None:
    with pytest.raises(ValueError, match=r"A10G is offered by sky.AWS \(g5.xlarge, g5.2xlarge"):
        catalog.choose("gcp", "A10G")


def test_machines_lists_the_catalog_with_each_clouds_types_and_prices() -> None:
    rows = sky.accelerators.machines()
    assert {(m.cloud, m.type, m.accelerator) for m in rows} == {
        (m.cloud, m.type, m.accelerator) for m in catalog.MACHINES if m.accelerator
    }
    assert len(rows) == len({(m.cloud, m.type, m.accelerator) for m in rows})
    p5 = next(m for m in rows if m.type == "p5.48xlarge")
    assert (p5.cloud, p5.accelerator, p5.count, p5.memory_gb) == ("aws", "H100", 8, 80)
    assert p5.hourly == catalog.price("aws", "p5.48xlarge")
    order = [m.accelerator for m in rows]
    assert order == sorted(order, key=catalog.NAMES.index)  # grouped by accelerator


def test_machines_filters_by_accelerator_count_memory_and_cloud() -> None:
    h100x4 = sky.accelerators.machines(H100(count=4))
    assert [(m.cloud, m.type) for m in h100x4] == [
        ("gcp", "a3-highgpu-4g"),
        ("lambdacloud", "gpu_4x_h100_sxm5"),
        ("verda", "4H100.80S.176V"),
    ]
    assert sky.accelerators.machines("H100:4") == h100x4
    a100_80 = sky.accelerators.machines(A100(memory="80GB"), cloud="azure")
    assert a100_80 and all(m.memory_gb == 80 and m.cloud == "azure" for m in a100_80)
    assert [m.count for m in a100_80] == sorted(m.count for m in a100_80)
    with pytest.raises(ValueError, match="cloud is one of aws, gcp, azure, lambdacloud, verda"):
        sky.accelerators.machines(cloud="oracle")
