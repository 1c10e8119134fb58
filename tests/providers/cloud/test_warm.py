"""``keep_warm``'s parts that need no machine: the option's validation and refusals, the
records of kept sets in the user's state directory, the lock that gives a set to one pool,
and what must match for a pool to adopt one. End to end: tests/providers/gcp/test_gcp_warm.py
and, for the other clouds, the stand-in contract's ``runs_kept_warm_and_adopted``
(tests/support/standin_contract.py)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pydantic
import pytest
from google.auth.credentials import AnonymousCredentials

import skyward as sky
from skyward.client.futures import Deadline
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud import warm


def _set(
    directory: Path, *, spec: str = "s1", nodes: int = 2, kept_at: float = 0.0
) -> warm.WarmSet:
    machines = tuple(
        warm.WarmMachine(rank, f"10.0.0.{rank}", 22, "u", f"10.0.0.{rank}", "z", f"vm-{rank}")
        for rank in range(nodes)
    )
    now = kept_at or time.time()
    kept = warm.WarmSet(
        id=warm.new_id(),
        cloud="gcp",
        spec=spec,
        image="i1",
        pool="p",
        owner="me@here",
        kept_at=now,
        until=now + 600,
        hourly_cost=0.19,
        describe=f"{nodes} x n2-standard-2",
        host_key="ssh-ed25519 AAAA",
        label="skyward-p-abc123",
        key_dir=str(directory / "key"),
        gpus=None,
        machine_type="n2-standard-2",
        instance_profile=False,
        down="skyward down --pool p",
        machines=machines,
        record={"pool": "p", "resources": [["firewall rule", "r"]]},
    )
    warm.save(kept, directory)
    return kept


# ── the option ─────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("value", [-1, float("inf"), float("nan"), "soon"])
def test_keep_warm_must_be_a_non_negative_number(value: object) -> None:
    with pytest.raises(pydantic.ValidationError, match="keep_warm"):
        sky.ComputePool(
            provider=sky.GCP(project="skyward-tests", zone="us-central1-a"), keep_warm=value
        )


def test_keep_warm_is_refused_where_there_is_no_machine_to_keep() -> None:
    with pytest.raises(ValueError, match="keep_warm=60 cannot be honoured: the local pool"):
        sky.ComputePool(keep_warm=60, quiet=True)
    with pytest.raises(ValueError, match="keep_warm=60 cannot be honoured: SSH runs on hosts"):
        sky.ComputePool(provider=sky.SSH(hosts=["h1"]), keep_warm=60, quiet=True)
    # Slurm keeps its pool's job (tests/providers/slurm/test_slurm.py)
    assert sky.ComputePool(provider=sky.Slurm(), keep_warm=60, quiet=True).spec.keep_warm == 60


def test_keep_warm_zero_is_todays_close_everywhere() -> None:
    assert sky.ComputePool(quiet=True).spec.keep_warm == 0
    gcp = sky.GCP(project="skyward-tests", zone="us-central1-a", credentials=AnonymousCredentials())
    assert sky.ComputePool(provider=gcp, keep_warm=600, quiet=True).spec.keep_warm == 600


# ── what must match ─────────────────────────────────────────────────────────────────────


def _request(pool: str = "a", **fields: object) -> ProvisionRequest:
    request = ProvisionRequest(
        pool=pool,
        nodes=2,
        accelerator=None,
        image=sky.Image(),
        tags={},
        deadline=Deadline(60, "test"),
    )
    return dataclasses.replace(request, **fields)  # type: ignore[arg-type]


def test_the_spec_digest_ignores_the_pools_name_and_image_but_not_the_machines() -> None:
    gcp = sky.GCP(project="skyward-tests", zone="us-central1-a", credentials=AnonymousCredentials())
    first = warm.spec_digest(gcp, _request("a"))
    assert warm.spec_digest(gcp, _request("b", image=sky.Image(pip=["numpy"]))) == first
    other = sky.GCP(
        project="skyward-tests", zone="us-central1-a", credentials=AnonymousCredentials()
    )
    assert warm.spec_digest(other, _request("c")) == first  # another credentials object
    assert warm.spec_digest(gcp.model_copy(update={"idle_timeout": 60.0}), _request()) != first
    assert warm.spec_digest(gcp, _request(vcpus=8)) != first
    assert warm.spec_digest(gcp, _request(allocation="spot")) != first


# ── the records and their lock ──────────────────────────────────────────────────────────


def test_the_state_directory_follows_the_environment(tmp_path: Path) -> None:
    assert warm.state_dir({"SKYWARD_STATE_DIR": str(tmp_path)}) == tmp_path
    assert warm.state_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "skyward"
    assert warm.state_dir({}) == Path.home() / ".local" / "state" / "skyward"


def test_a_record_is_private_and_read_back_whole(tmp_path: Path) -> None:
    kept = _set(tmp_path)
    assert (tmp_path / f"{kept.id}.json").stat().st_mode & 0o777 == 0o600
    assert warm.kept(tmp_path) == [kept]
    (tmp_path / "broken.json").write_text("{")  # half written, or damaged: left out
    assert warm.kept(tmp_path) == [kept]


def test_only_a_set_of_the_same_cloud_spec_and_size_is_claimed(tmp_path: Path) -> None:
    kept = _set(tmp_path)
    assert warm.claim("aws", "s1", 2, directory=tmp_path) is None
    assert warm.claim("gcp", "s2", 2, directory=tmp_path) is None
    assert warm.claim("gcp", "s1", 3, directory=tmp_path) is None
    held = warm.claim("gcp", "s1", 2, directory=tmp_path)
    assert held is not None and held.warm == kept
    held.release()


def test_a_claimed_set_is_nobody_elses_until_released_and_gone_once_forgotten(
    tmp_path: Path,
) -> None:
    _set(tmp_path)
    with warm.claim("gcp", "s1", 2, directory=tmp_path) as first:  # type: ignore[union-attr]
        assert warm.claim("gcp", "s1", 2, directory=tmp_path) is None
    again = warm.claim("gcp", "s1", 2, directory=tmp_path)
    assert again is not None
    again.forget()
    again.release()
    assert warm.claim("gcp", "s1", 2, directory=tmp_path) is None
    assert list(tmp_path.iterdir()) == []
    assert first.warm.id not in {w.id for w in warm.kept(tmp_path)}


def test_the_newest_free_set_is_claimed_first(tmp_path: Path) -> None:
    older = _set(tmp_path, kept_at=time.time() - 60)
    newer = _set(tmp_path)
    with warm.claim("gcp", "s1", 2, directory=tmp_path) as first:  # type: ignore[union-attr]
        assert first.warm == newer
        second = warm.claim("gcp", "s1", 2, directory=tmp_path)
        assert second is not None and second.warm == older
        second.release()


_HOLDER = """
import sys, time
from pathlib import Path
from skyward.providers.cloud import warm
held = warm.claim("gcp", "s1", 2, directory=Path(sys.argv[1]))
print("HELD" if held else "NONE", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(60)
def test_a_crashed_clients_claim_goes_with_its_process(tmp_path: Path) -> None:
    _set(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLDER), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
        assert warm.claim("gcp", "s1", 2, directory=tmp_path) is None
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
        after = warm.claim("gcp", "s1", 2, directory=tmp_path)
        assert after is not None
        after.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)


def test_down_forgets_a_kept_slurm_job_only_on_the_cluster_it_was_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skyward.cli.leftovers import _forget_warm
    from skyward.providers.scope import Given

    monkeypatch.setenv("SKYWARD_STATE_DIR", str(tmp_path))
    here, there = (
        dataclasses.replace(
            _set(warm.warm_dir()), cloud="slurm", key_dir="", record={"job": "7", "login": login}
        )
        for login in ("local", "me@login.cluster")
    )
    for kept in (here, there):
        warm.save(kept)
    _forget_warm({"p"}, {"slurm"}, Given({"slurm_logins": ("local",)}))
    assert [k.id for k in warm.kept()] == [there.id]
