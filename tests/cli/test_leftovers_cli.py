"""``skyward ls`` / ``down`` never give a false all-clear: a cloud that could not be checked
(its extra missing, no credentials, no subscription) fails the command, naming what to
install or set; what was checked is said; advice names the command's flags; and ``ls``
shows the pools that ran here recently, with their state and where their logs are.

The CLI runs as a user runs it (a subprocess) against the moto server; no cloud variable of
this process reaches it unless a test sets it, and no instance-metadata probe leaves the
machine (``AWS_EC2_METADATA_DISABLED``, ``GCE_METADATA_HOST`` on a closed loopback port)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.clouds.aws.fake import MotoServer

import skyward as sky
from skyward.cli.leftovers import _for_the_command_line

SCRIPT = Path(sys.executable).parent / "skyward"


def _env(home: Path, **extra: str) -> dict[str, str]:
    clouds = ("AWS_", "GOOGLE_", "CLOUDSDK_", "AZURE_", "SKYWARD_GCP")
    env = {k: v for k, v in os.environ.items() if not k.startswith(clouds)}
    return env | {
        "HOME": str(home),
        "TMPDIR": str(home),  # pool keys of other tests are not judged here
        "SKYWARD_LOG_DIR": str(home / "pool-logs"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(home / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-credentials"),
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9",
        "NO_GCE_CHECK": "True",
        "NO_COLOR": "1",
        **extra,
    }


def _aws(moto: MotoServer) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": moto.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def _skyward(*args: str, env: dict[str, str], hide: str = "") -> subprocess.CompletedProcess[str]:
    """``skyward ARGS``; ``hide``: a module made unimportable first (an extra not installed)."""
    code = "import sys\n" + (f"sys.modules[{hide!r}] = None\n" if hide else "")
    code += "from skyward.cli import main\nmain(sys.argv[1:], prog_name='skyward')\n"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_ls_without_the_aws_extra_fails_naming_it(tmp_path: Path) -> None:
    result = _skyward("ls", "--cloud", "aws", env=_env(tmp_path), hide="boto3")
    assert result.returncode != 0, result.stdout
    assert "aws: not checked; install it with: pip install 'skyward[aws]'" in result.stderr
    assert "Nothing left by Skyward" not in result.stdout
    assert "not an all-clear" in result.stderr


def test_down_all_without_the_aws_extra_fails_too(tmp_path: Path) -> None:
    result = _skyward("down", "--all", "--yes", "--cloud", "aws", env=_env(tmp_path), hide="boto3")
    assert result.returncode != 0
    assert "pip install 'skyward[aws]'" in result.stderr


def test_ls_without_aws_credentials_fails_naming_what_to_set(
    moto: MotoServer, tmp_path: Path
) -> None:
    env = _env(tmp_path, AWS_ENDPOINT_URL=moto.url, AWS_DEFAULT_REGION="us-east-1")
    result = _skyward("ls", "--region", "us-west-2", env=env)
    assert result.returncode != 0
    assert "no AWS credentials found" in result.stderr
    assert "--profile NAME" in result.stderr and "sky.AWS(" not in result.stderr


def test_every_cloud_is_asked_by_default_and_one_unchecked_fails_the_command(
    moto: MotoServer, tmp_path: Path
) -> None:
    result = _skyward("ls", env=_env(tmp_path, **_aws(moto)))
    assert result.returncode != 0
    assert "azure: not checked; set AZURE_SUBSCRIPTION_ID or pass --subscription" in result.stderr
    assert "gcp: not checked" in result.stderr and "GOOGLE_APPLICATION_CREDENTIALS" in result.stderr
    assert "--cloud" in result.stderr  # how to leave out the clouds one does not use
    assert "Checked: aws:" in result.stderr  # what was searched is still said
    assert "Nothing found in what was checked." in result.stdout


def test_ls_says_which_regions_it_checked(moto: MotoServer, tmp_path: Path) -> None:
    env = _env(tmp_path, **_aws(moto))
    one = _skyward("ls", "--region", "us-west-2", env=env)
    assert one.returncode == 0, one.stderr
    assert "Checked: aws: us-west-2." in one.stderr
    assert "Nothing left by Skyward." in one.stdout
    every = _skyward("ls", "--cloud", "aws", env=env)
    assert every.returncode == 0, every.stderr
    assert "regions (" in every.stderr  # every enabled region, counted


def test_region_advice_names_the_flag_not_the_python_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from skyward.providers.aws.api import Api

    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(sky.ProvisionError) as caught:
        Api.session(region=None, profile=None)
    assert "sky.AWS(region=" in str(caught.value)  # the Python API's own advice
    advice = _for_the_command_line(str(caught.value))
    assert "--region us-east-1" in advice and "sky.AWS" not in advice


def test_ls_shows_recent_pools_with_their_state_and_logs(
    moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SKYWARD_LOG_DIR", str(tmp_path / "pool-logs"))
    with sky.ComputePool(quiet=True) as pool:
        name, directory = pool.name, pool.log_dir
    result = _skyward("ls", "--region", "us-east-1", env=_env(tmp_path, **_aws(moto)))
    assert result.returncode == 0, result.stderr
    [row] = [line for line in result.stdout.splitlines() if name in line]
    assert "closed" in row and "local" in row and str(directory) in row
    assert "Recent pools on this machine" in result.stdout
