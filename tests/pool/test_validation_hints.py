"""Bad input is named alike everywhere, before anything is made: a misspelled keyword or
place gets "did you mean", counts and timeouts are numbers (not strings that look like
them), and what needs no network (the machine asked for) is judged before what does (the
credentials)."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

import skyward as sky


def test_a_misspelled_pool_keyword_says_which_was_meant() -> None:
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'node'; did you mean 'nodes'\?"
    ):
        sky.ComputePool(node=2)
    with pytest.raises(TypeError, match=r"'start_timout'; did you mean 'start_timeout'\?"):
        sky.ComputePool(start_timout=30)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("nodes", "4"),
        ("nodes", True),
        ("provision_timeout", "30"),
        ("start_timeout", "1e3"),
        ("concurrency", 2.0),
        ("max_hourly_cost", "1.5"),
    ],
)
def test_counts_and_timeouts_must_be_numbers_of_their_kind(option: str, value: object) -> None:
    with pytest.raises(pydantic.ValidationError, match=option):
        sky.ComputePool(**{option: value}, quiet=True)


def test_numbers_of_the_right_kind_still_pass() -> None:
    pool = sky.ComputePool(nodes=(1, 3), start_timeout=30, max_hourly_cost=2, quiet=True)
    assert (pool.spec.min_nodes, pool.spec.nodes, pool.spec.start_timeout) == (1, 3, 30.0)


@pytest.mark.parametrize(
    ("option", "value", "meant"),
    [
        ("zone", "us-centrall-a", "'us-central1-a'"),
        ("zone", "uscentral1-b", "'us-central1-b'"),
        ("region", "europe_west4", "'europe-west4'"),
    ],
)
def test_a_misspelled_gcp_place_says_which_was_meant(option: str, value: str, meant: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=f"did you mean {meant}") as caught:
        sky.GCP(**{option: value})
    assert "pattern" not in str(caught.value)
    assert sky.GCP(zone="us-central1-a").zone == "us-central1-a"
    assert sky.GCP(region="me-central9").region == "me-central9"  # newer than the catalog


def test_a_count_aws_does_not_sell_is_said_before_missing_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    aws = sky.AWS(region="us-east-1")
    with pytest.raises(ValueError, match="aws has no machine with A100:3"):
        sky.ComputePool(provider=aws, accelerator="A100:3", quiet=True)
    with pytest.raises(sky.ProvisionError, match="no AWS credentials found"):
        sky.ComputePool(provider=aws, accelerator="A100:8", quiet=True)
