"""Browsing the catalog: ``sky.catalog()`` and ``skyward catalog`` list what ``accelerator=``
can get on each cloud, with GPUs, memory and price per hour, filtered by accelerator, cloud
and region; a table on a terminal or in a pipe, JSON with ``--json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.clouds.aws.fake import MotoServer

import skyward as sky
from skyward.providers.cloud import catalog

SCRIPT = Path(sys.executable).parent / "skyward"


def _skyward(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


def test_every_machine_a_pool_can_choose_is_listed_once_per_cloud() -> None:
    entries = sky.catalog()
    listed = {(e.cloud, e.type, e.accelerator, e.accelerators) for e in entries}
    assert listed == {(m.cloud, m.type, m.accelerator, m.count) for m in catalog.MACHINES}
    assert {e.cloud for e in entries} == {"aws", "gcp", "azure"}


def test_an_accelerator_filter_keeps_its_machines_cheapest_first() -> None:
    a100 = sky.catalog("A100")
    assert a100 and all(e.accelerator == "A100" for e in a100)
    on_aws = [e for e in a100 if e.cloud == "aws"]
    assert [e.type for e in on_aws] == ["p4d.24xlarge", "p4de.24xlarge"]
    assert [e.accelerator_memory_gb for e in sky.catalog("A100-80GB:8", cloud="aws")] == [80]
    cpu = sky.catalog("cpu", cloud="gcp")
    assert cpu and all(e.accelerator is None and e.accelerators == 0 for e in cpu)


def test_a_region_names_its_cloud_and_its_prices() -> None:
    west = sky.catalog("A100", region="us-west-2")
    assert {e.cloud for e in west} == {"aws"} and {e.region for e in west} == {"us-west-2"}
    p4d = next(e for e in west if e.type == "p4d.24xlarge")
    assert p4d.on_demand == catalog.price("aws", "p4d.24xlarge", "us-west-2")
    assert p4d.vcpus == 96 and p4d.memory_gb == 1152 and p4d.accelerators == 8
    assert {e.cloud for e in sky.catalog("L4", region="us-central1")} == {"gcp"}
    assert {e.cloud for e in sky.catalog("T4", region="eastus")} == {"azure"}


def test_a_region_whose_price_list_lacks_a_type_leaves_it_out() -> None:
    # The price list has p5en.48xlarge in some regions only: where it lacks it, AWS sells none.
    table = catalog.ON_DEMAND["aws"]["p5en.48xlarge"]
    missing = next(r for r in catalog.ON_DEMAND["aws"]["m7i.xlarge"] if r not in table)
    assert "p5en.48xlarge" not in {e.type for e in sky.catalog("H200", region=missing)}


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"accelerator": "B300"}, "unknown accelerator 'B300'"),
        ({"cloud": "oracle"}, "unknown cloud 'oracle'"),
        ({"region": "Mars/North"}, "is no region of aws, gcp, azure"),
    ],
)
def test_bad_filters_say_what_exists(kwargs: dict[str, str], words: str) -> None:
    accelerator = kwargs.pop("accelerator", None)
    with pytest.raises(ValueError, match=words):
        sky.catalog(accelerator, **kwargs)


def test_the_command_prints_a_table_with_prices_and_json_on_request() -> None:
    table = _skyward("catalog", "A100", "--cloud", "aws", "--region", "us-west-2")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["CLOUD", "TYPE", "ACCELERATOR"] and "$/H" in header
    assert rows[0].split() == [
        "aws", "p4d.24xlarge", "A100", "8", "40", "GB", "96", "1152", "GB", "us-west-2",
        f"{catalog.price('aws', 'p4d.24xlarge', 'us-west-2'):.2f}",
    ]  # fmt: skip
    as_json = _skyward("catalog", "H100", "--json")
    assert as_json.returncode == 0, as_json.stderr
    parsed = json.loads(as_json.stdout)
    assert parsed == [e.as_dict() for e in sky.catalog("H100")]
    bad = _skyward("catalog", "B300")
    assert bad.returncode != 0 and "unknown accelerator 'B300'" in bad.stderr


def test_spot_prices_are_the_lowest_of_the_zones_asked_once_per_region_through_the_lookup() -> None:
    asked: list[tuple[str, list[str]]] = []

    def quotes(region: str, types: list[str]) -> dict[tuple[str, str], float]:
        asked.append((region, types))
        return {("g6.xlarge", f"{region}a"): 0.31, ("g6.xlarge", f"{region}b"): 0.29}

    priced = sky.catalog("L4", region="us-east-1", spot=True, spot_prices={"aws": quotes})
    g6 = next(e for e in priced if e.type == "g6.xlarge")
    assert g6.spot == 0.29
    assert all(e.spot is None for e in priced if e.type != "g6.xlarge")  # no quote: unknown
    assert asked == [("us-east-1", sorted(e.type for e in priced))]
    everywhere = sky.catalog("T4", spot=True, spot_prices={"aws": quotes})
    assert {e.cloud for e in everywhere if e.cloud != "aws"} == {"gcp", "azure"}
    assert all(e.spot is None for e in everywhere if e.cloud != "aws")  # no lookup: unknown
    assert all(e.spot is None for e in sky.catalog("L4", cloud="aws"))  # not asked: no call
    assert len(asked) == 2


def test_spot_prices_come_from_each_clouds_registry_entry_by_default(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    priced = sky.catalog("L4", cloud="aws", region="us-east-1", spot=True)
    quoted = moto.client("ec2").describe_spot_price_history(InstanceTypes=["g6.xlarge"])
    lowest = min(float(q["SpotPrice"]) for q in quoted["SpotPriceHistory"])
    assert next(e for e in priced if e.type == "g6.xlarge").spot == lowest


def test_the_cli_asks_aws_for_its_spot_prices(moto: MotoServer) -> None:
    listed = _skyward(
        "catalog", "L4", "--cloud", "aws", "--region", "us-east-1", "--spot", "--json",
        env={"AWS_ENDPOINT_URL": moto.url},
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    quoted = moto.client("ec2").describe_spot_price_history(InstanceTypes=["g6.xlarge"])
    prices = [float(p["SpotPrice"]) for p in quoted["SpotPriceHistory"]]
    g6 = next(e for e in json.loads(listed.stdout) if e["type"] == "g6.xlarge")
    assert prices and g6["spot"] == min(prices)


def test_spot_prices_that_cannot_be_had_are_said_in_one_line_and_fail_the_command(
    tmp_path: Path,
) -> None:
    # No credentials anywhere boto3 looks (and no instance identity to ask).
    env = {
        "HOME": str(tmp_path),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    env |= {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "HOME"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(SCRIPT), *args]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=60, env=env, check=False
        )

    listed = run("catalog", "H100", "--cloud", "aws", "--spot")
    assert listed.returncode != 0
    errors = [line for line in listed.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, listed.stderr
    assert "no spot prices could be had" in errors[0] and "no AWS credentials" in errors[0]
    plain = run("catalog", "H100", "--cloud", "aws")  # no --spot: no network
    assert plain.returncode == 0, plain.stderr


def test_a_lookup_that_fails_for_some_clouds_keeps_the_others_prices() -> None:
    def refused(region: str, types: list[str]) -> dict[tuple[str, str], float]:
        raise sky.ProvisionError("refused by the test")

    def quotes(region: str, types: list[str]) -> dict[tuple[str, str], float]:
        return {(types[0], f"{region}-a"): 0.5}

    with pytest.raises(sky.ProvisionError, match=r"no spot prices could be had: aws .*refused"):
        sky.catalog("T4", spot=True, spot_prices={"aws": refused})
    mixed = sky.catalog("T4", spot=True, spot_prices={"aws": refused, "gcp": quotes})
    assert any(e.spot == 0.5 for e in mixed if e.cloud == "gcp")
    assert all(e.spot is None for e in mixed if e.cloud == "aws")
