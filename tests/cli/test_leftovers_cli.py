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
from support.clouds.aws.proxy import Ec2Proxy

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


def test_every_configured_cloud_is_asked_by_default_and_one_unchecked_fails_the_command(
    moto: MotoServer, tmp_path: Path
) -> None:
    # Azure is configured (a subscription named) but its extra cannot be imported; GCP has
    # credentials named that do not exist: both asked, neither checked.
    env = _env(
        tmp_path,
        **_aws(moto),
        AZURE_SUBSCRIPTION_ID="00000000-0000-0000-0000-000000000000",
        GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "missing-key.json"),
    )
    result = _skyward("ls", env=env, hide="azure.mgmt.compute")
    assert result.returncode != 0
    assert "azure: not checked; install it with: pip install 'skyward[azure]'" in result.stderr
    assert "gcp: not checked" in result.stderr and "GOOGLE_APPLICATION_CREDENTIALS" in result.stderr
    assert "--cloud" in result.stderr  # how to leave out the clouds one does not use
    assert "Checked: aws:" in result.stderr  # what was searched is still said
    assert "Nothing found in what was checked." in result.stdout
    assert "Nothing left by Skyward" not in result.stdout


def test_a_machine_with_no_cloud_configured_is_told_so_and_the_command_succeeds(
    tmp_path: Path,
) -> None:
    result = _skyward("ls", env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "No cloud is configured here" in result.stderr
    assert "not checked" not in result.stderr and "Error" not in result.stderr
    assert "Nothing left by Skyward" not in result.stdout  # nothing was looked at
    down = _skyward("down", "--all", "--yes", env=_env(tmp_path))
    assert down.returncode == 0, down.stderr
    assert "No cloud is configured here" in down.stderr


def test_clouds_not_configured_are_named_and_left_out(moto: MotoServer, tmp_path: Path) -> None:
    result = _skyward("ls", env=_env(tmp_path, **_aws(moto)))
    assert result.returncode == 0, result.stderr
    [left_out] = [x for x in result.stderr.splitlines() if "Not configured here" in x]
    assert "gcp" in left_out and "azure" in left_out and "aws" not in left_out
    assert "Checked: aws:" in result.stderr
    assert "Nothing left by Skyward." in result.stdout
    # Named on the command line, an unconfigured cloud is asked, and fails the command.
    named = _skyward("ls", "--cloud", "aws", "--cloud", "gcp", env=_env(tmp_path, **_aws(moto)))
    assert named.returncode != 0
    assert "gcp: not checked" in named.stderr


def test_the_gcp_credentials_hint_names_what_the_command_reads(tmp_path: Path) -> None:
    result = _skyward("ls", "--cloud", "gcp", env=_env(tmp_path))
    assert result.returncode != 0
    assert "or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file" in result.stderr
    assert "or pass GOOGLE_APPLICATION_CREDENTIALS" not in result.stderr
    assert "sky.GCP(" not in result.stderr


@pytest.mark.parametrize("answer", ["page", "denied"])
def test_a_listing_that_fails_is_no_all_clear_and_is_said_in_one_line(
    moto: MotoServer, tmp_path: Path, answer: str
) -> None:
    with Ec2Proxy(moto.url) as proxy:
        if answer == "page":
            html = (
                "<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n"
                "<h1>Internal Server Error</h1>\n<p>The server encountered an internal error"
                "</p>\n"
            )
            proxy.refuse("DescribePlacementGroups", "", status=500, page=html)
        else:
            proxy.refuse(
                "DescribePlacementGroups",
                "UnauthorizedOperation",
                "You are not authorized to perform this operation.",
                status=403,
            )
        env = _env(tmp_path, **(_aws(moto) | {"AWS_ENDPOINT_URL": proxy.url}))
        for command in (("ls",), ("down", "--all", "--yes")):
            result = _skyward(*command, "--cloud", "aws", "--region", "us-east-1", env=env)
            assert result.returncode == 1, result.stdout
            assert "Nothing left by Skyward" not in result.stdout
            assert "Nothing found" not in result.stdout  # nothing was searched through
            lines = [x for x in result.stderr.splitlines() if ": not checked: " in x]
            assert len(lines) == 1, result.stderr
            assert "placement groups" in lines[0]
            assert "<" not in result.stderr  # no page, no markup
            if answer == "page":
                assert "did not answer as EC2 does (500 Internal Server Error)" in lines[0]
                assert "AWS_ENDPOINT_URL" in lines[0] and "sky.AWS" not in lines[0]
            else:
                assert "ec2:DescribePlacementGroups" in lines[0]


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
