"""The AWS provider against the moto server (a real HTTP endpoint speaking EC2 and SSM): what it
asks EC2 for, what it says when EC2 refuses, and that an interrupted or failed start leaves
nothing behind. Reaching the instances over SSH is in ``test_aws_standins.py``."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.exceptions import ClientError
from pydantic import ValidationError
from support import ROOT, TESTS
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import Checkpoint, held, key_file_of, nothing, provider, request
from support.reporter import Recorder

import skyward as sky
from skyward._errors import MissingDependency, ProvisionError
from skyward.providers.aws.api import describe_reason, translate
from skyward.providers.cloud import catalog
from skyward.providers.cloud.boot import WATCHDOG_PATH
from skyward.providers.cloud.start import CloudPool

pytestmark = pytest.mark.timeout(120)


# ── before anything is touched ─────────────────────────────────────────────────────────


def test_an_unknown_accelerator_is_refused_when_the_pool_is_built(moto: MotoServer) -> None:
    with pytest.raises(ValueError) as caught:
        sky.ComputePool(provider=provider(moto), accelerator="A100:3", nodes=2, quiet=True)
    assert "'A100-40GB:8' (p4d.24xlarge)" in str(caught.value)


def test_instance_type_wins_over_the_catalog(moto: MotoServer) -> None:
    assert provider(moto).instance_type_for("A100") == "p4d.24xlarge"
    assert provider(moto, instance_type="g6e.xlarge").instance_type_for("A100") == "g6e.xlarge"
    assert provider(moto).instance_type_for(None) == "m7i.xlarge"


def test_bad_settings_are_validation_errors_naming_the_field() -> None:
    for settings, field in [
        ({"ssh_cidr": "everyone"}, "ssh_cidr"),
        ({"ami": "ubuntu"}, "ami"),
        ({"connect": "bastion"}, "connect"),
        ({"disk_gb": 2}, "disk_gb"),
        ({"idle_timeout": 0}, "idle_timeout"),
    ]:
        with pytest.raises(ValidationError) as caught:
            sky.AWS(**settings)
        assert field in str(caught.value)
    with pytest.raises(ValidationError, match="not both"):
        sky.AWS(ami="ami-0123456789abcdef0", ami_parameter="/x")


def test_an_unknown_profile_is_refused_when_the_pool_is_built(moto: MotoServer) -> None:
    with pytest.raises(ProvisionError, match="no-such-profile"):
        sky.ComputePool(provider=provider(moto, profile="no-such-profile"), nodes=1, quiet=True)


def _no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This process's environment as a machine with no AWS credentials anywhere: none in the
    environment or ~/.aws, no instance metadata (a region is still set)."""
    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_DEFAULT_REGION":
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


def test_missing_credentials_are_refused_when_the_pool_is_built(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_credentials(monkeypatch, tmp_path)
    aws = sky.AWS(endpoint_url=moto.url, region="us-east-1", ssh_cidr="10.0.0.0/8")
    with pytest.raises(ProvisionError) as caught:
        sky.ComputePool(provider=aws, nodes=1, quiet=True)  # built, never started
    message = str(caught.value)
    assert "no AWS credentials found" in message
    for what in ("aws configure", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "sky.AWS(profile="):
        assert what in message


def test_credentials_from_the_environment_are_enough_to_build_the_pool(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    aws = sky.AWS(endpoint_url=moto.url, region="us-east-1", ssh_cidr="10.0.0.0/8")
    pool = sky.ComputePool(provider=aws, nodes=1, quiet=True)
    assert pool.statistics().state == "new"


def test_a_missing_boto3_names_the_extra_when_the_pool_is_built() -> None:
    script = (
        "import sys; sys.modules['boto3'] = None\n"
        "import skyward as sky\n"
        "try:\n"
        "    sky.ComputePool(provider=sky.AWS(region='us-east-1'), nodes=1, quiet=True)\n"
        "except sky.MissingDependency as e:\n"
        "    print('MISSING', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert "MISSING" in done.stdout, done
    assert "pip install 'skyward[aws]'" in done.stdout
    assert issubclass(MissingDependency, ImportError)


# ── what the provider asks EC2 for ─────────────────────────────────────────────────────


def _snapshot(moto: MotoServer, pool: str, into: dict[str, Any]) -> None:
    """Everything moto holds for ``pool``, taken while provisioning is stopped mid-way."""
    ec2 = moto.client("ec2")
    tag = [{"Name": "tag:skyward-pool", "Values": [pool]}]
    instances = [
        i for r in ec2.describe_instances(Filters=tag)["Reservations"] for i in r["Instances"]
    ]
    into["instances"] = instances
    into["shutdown"] = [
        ec2.describe_instance_attribute(
            InstanceId=i["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
        )["InstanceInitiatedShutdownBehavior"]["Value"]
        for i in instances
    ]
    user_data = ec2.describe_instance_attribute(
        InstanceId=instances[0]["InstanceId"], Attribute="userData"
    )["UserData"]["Value"]
    into["user_data"] = base64.b64decode(user_data).decode()
    into["volumes"] = ec2.describe_volumes(Filters=tag)["Volumes"]
    into["groups"] = ec2.describe_security_groups(Filters=tag)["SecurityGroups"]
    into["keys"] = ec2.describe_key_pairs(Filters=tag, IncludePublicKey=True)["KeyPairs"]
    into["interfaces"] = ec2.describe_network_interfaces(
        Filters=[{"Name": "attachment.instance-id", "Values": [instances[0]["InstanceId"]]}]
    )["NetworkInterfaces"]


def _stopped_after_launch(
    moto: MotoServer, aws: sky.AWS, **options: Any
) -> tuple[dict[str, Any], str]:
    seen: dict[str, Any] = {}
    checkpoint = Checkpoint("waiting for", reached=lambda: _snapshot(moto, name, seen))
    made = request(deadline=checkpoint, **options)
    name = made.pool
    with pytest.raises(KeyboardInterrupt):
        aws.provision(made, Recorder())
    return seen, name


def test_instances_are_launched_as_one_tagged_all_or_nothing_request(moto: MotoServer) -> None:
    # g6.12xlarge has EFA: without cluster_network=False it would get a placement group and
    # EFA interfaces (test_aws_capacity.py checks that shape).
    aws = provider(moto, disk_gb=120, cluster_network=False)
    seen, pool = _stopped_after_launch(moto, aws, accelerator="L4:4")
    instances = seen["instances"]
    assert len(instances) == 2
    assert {i["InstanceType"] for i in instances} == {"g6.12xlarge"}
    assert len({i["AmiLaunchIndex"] for i in instances}) == 2
    assert len({i["ImageId"] for i in instances}) == 1
    for instance in instances:
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags["skyward-pool"] == pool
        assert {"skyward-owner", "skyward-created", "Name"} <= set(tags)
        assert instance["MetadataOptions"]["HttpTokens"] == "required"
        assert instance.get("InstanceLifecycle") != "spot"
        assert instance["KeyName"] == seen["keys"][0]["KeyName"]
        (root,) = instance["BlockDeviceMappings"]
        assert root["Ebs"]["DeleteOnTermination"] is True
    assert seen["shutdown"] == ["terminate", "terminate"]
    volumes = seen["volumes"]
    assert len(volumes) == 2
    for volume in volumes:
        assert (volume["Size"], volume["VolumeType"]) == (120, "gp3")
    assert seen["interfaces"][0]["Groups"][0]["GroupId"] == seen["groups"][0]["GroupId"]
    assert nothing(held(moto, pool))


def test_spot_is_asked_through_market_options(moto: MotoServer) -> None:
    seen, pool = _stopped_after_launch(moto, provider(moto, spot=True))
    assert {i.get("InstanceLifecycle") for i in seen["instances"]} == {"spot"}
    assert nothing(held(moto, pool))


def test_the_group_lets_in_ssh_from_the_cidr_only_and_everything_from_itself(
    moto: MotoServer,
) -> None:
    seen, _ = _stopped_after_launch(moto, provider(moto, ssh_cidr="203.0.113.7/32"))
    (group,) = seen["groups"]
    rules = group["IpPermissions"]
    ssh = [r for r in rules if r["IpProtocol"] == "tcp"]
    assert [(r["FromPort"], r["ToPort"]) for r in ssh] == [(22, 22)]
    assert [c["CidrIp"] for c in ssh[0]["IpRanges"]] == ["203.0.113.7/32"]
    everything = [r for r in rules if r["IpProtocol"] == "-1"]
    assert [p["GroupId"] for p in everything[0]["UserIdGroupPairs"]] == [group["GroupId"]]
    assert not everything[0].get("IpRanges")
    assert len(rules) == 2
    tags = {t["Key"] for t in group["Tags"]}
    assert {"skyward-pool", "skyward-owner", "skyward-created"} <= tags


def test_the_key_pair_is_the_pools_own_and_the_user_data_pins_a_host_key(
    moto: MotoServer,
) -> None:
    seen, _ = _stopped_after_launch(moto, provider(moto, idle_timeout=600, boot_timeout=900))
    (key,) = seen["keys"]
    assert key["KeyType"] == "ed25519"
    document = yaml.safe_load(seen["user_data"])
    assert seen["user_data"].startswith("#cloud-config\n")
    assert document["ssh_authorized_keys"] == [key["PublicKey"].strip()]
    assert document["ssh_keys"]["ed25519_public"].startswith("ssh-ed25519 ")
    runcmd = " ".join(" ".join(c) for c in document["runcmd"])
    # The first client is waited for boot_timeout and a margin, not idle_timeout.
    assert f"{WATCHDOG_PATH} 600 22 10 1020" in runcmd


def test_a_private_pool_gets_no_public_address_and_auto_ssh_is_the_vpc(
    moto: MotoServer,
) -> None:
    seen, _ = _stopped_after_launch(moto, provider(moto, connect="private", ssh_cidr="auto"))
    assert all("PublicIpAddress" not in i for i in seen["instances"])
    ssh = [r for r in seen["groups"][0]["IpPermissions"] if r["IpProtocol"] == "tcp"]
    assert [c["CidrIp"] for c in ssh[0]["IpRanges"]] == ["172.31.0.0/16"]  # moto's default VPC


def test_the_catalog_agrees_with_ec2_on_every_type_ec2_describes(moto: MotoServer) -> None:
    ec2 = moto.client("ec2")
    known = {m.type: m for m in catalog.machines("aws")}
    described = {}
    for name in known:
        try:
            described[name] = ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"][0]
        except ClientError:
            continue
    # moto's data lacks only the P3 family; every other type must be described and agree.
    assert set(known) - set(described) <= {"p3.2xlarge", "p3.8xlarge", "p3.16xlarge"}
    for name, info in described.items():
        machine = known[name]
        assert info["VCpuInfo"]["DefaultVCpus"] == machine.vcpus, name
        gpus = info.get("GpuInfo", {}).get("Gpus", [])
        if machine.accelerator is None:
            assert not gpus, name
            continue
        assert (gpus[0]["Name"], gpus[0]["Count"]) == (machine.accelerator, machine.count)
        gib = gpus[0]["MemoryInfo"]["SizeInMiB"] / 1024
        assert abs(gib - machine.memory_gb) / machine.memory_gb < 0.1, name


# ── when EC2 refuses ───────────────────────────────────────────────────────────────────


def test_an_unknown_ami_is_named_and_nothing_is_left(moto: MotoServer) -> None:
    made = request()
    with pytest.raises(ProvisionError, match=r"unknown AMI.*ami-0000000000000000f"):
        provider(moto, ami="ami-0000000000000000f", ami_parameter=None).provision(made, Recorder())
    assert nothing(held(moto, made.pool))


def test_a_missing_ami_parameter_is_named(moto: MotoServer) -> None:
    with pytest.raises(ProvisionError, match="/no/such/parameter"):
        provider(moto, ami_parameter="/no/such/parameter").provision(request(), Recorder())


def test_no_credentials_says_how_to_give_them(moto: MotoServer, tmp_path: Any) -> None:
    script = (
        "import skyward as sky\n"
        "from skyward.providers.base import ProvisionRequest, identity_tags\n"
        "from skyward.client.futures import Deadline\n"
        "from skyward.client.phases import SilentReporter\n"
        f"aws = sky.AWS(endpoint_url={moto.url!r}, region='us-east-1', ssh_cidr='10.0.0.0/8')\n"
        "r = ProvisionRequest('p', 1, None, sky.Image(), identity_tags('p'), Deadline(60, 'x'))\n"
        "try:\n"
        "    aws.provision(r, SilentReporter())\n"
        "except sky.ProvisionError as e:\n"
        "    print('ERROR', e)\n"
    )
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("AWS_") or k == "AWS_DEFAULT_REGION"
    }
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert "ERROR" in done.stdout, done
    assert "no AWS credentials found" in done.stdout
    assert "aws configure" in done.stdout


def _client_error(code: str, message: str, operation: str = "RunInstances") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


def test_a_refused_call_names_the_iam_action() -> None:
    error = translate(_client_error("UnauthorizedOperation", "You are not authorized."), "x", "r")
    assert "ec2:RunInstances" in str(error)
    error = translate(_client_error("AccessDeniedException", "no", "GetParameter"), "x", "r")
    assert "ssm:GetParameter" in str(error)


def test_no_capacity_names_the_type_and_zone() -> None:
    message = (
        "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone "
        "you requested (us-east-1a)."
    )
    error = translate(
        _client_error("InsufficientInstanceCapacity", message),
        "launching",
        "us-east-1",
        {"InstanceType": "p4d.24xlarge"},
    )
    assert "p4d.24xlarge" in str(error)
    assert "us-east-1a" in str(error)
    assert "spot=True" in str(error)


def test_a_vcpu_quota_is_named_with_its_code() -> None:
    message = "You have requested more vCPU capacity than your current vCPU limit of 0 allows."
    error = translate(
        _client_error("VcpuLimitExceeded", message),
        "launching",
        "us-east-1",
        {"InstanceType": "p5.48xlarge"},
    )
    assert "Running On-Demand P instances" in str(error)
    assert "L-417A185B" in str(error)
    assert "limit of 0" in str(error)
    spot = translate(
        _client_error("VcpuLimitExceeded", message),
        "launching",
        "us-east-1",
        {"InstanceType": "g5.xlarge", "InstanceMarketOptions": {"MarketType": "spot"}},
    )
    assert "All G and VT Spot Instance Requests" in str(spot)


def test_expired_credentials_say_to_renew_them() -> None:
    error = translate(_client_error("ExpiredToken", "The security token expired"), "x", "r")
    assert "renew" in str(error)


# ── the leak matrix, up to the SSH stage (the rest is in test_aws_standins.py) ──────────


@pytest.mark.parametrize(
    ("step", "made_by_then"),
    [
        ("creating the security group", {"key pairs"}),
        ("launching", {"key pairs", "security groups"}),
        ("waiting for", {"key pairs", "security groups", "instances"}),
    ],
    ids=["after-key-pair", "after-security-group", "after-run"],
)
@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), ProvisionError("injected failure")], ids=["ctrl-c", "failure"]
)
def test_a_start_stopped_at_any_step_leaves_nothing(
    moto: MotoServer, step: str, made_by_then: set[str], error: BaseException
) -> None:
    at_stop: dict[str, Any] = {}

    def look() -> None:
        at_stop["held"] = held(moto, made.pool)
        keys = moto.client("ec2").describe_key_pairs(
            KeyNames=at_stop["held"]["key pairs"], IncludePublicKey=True
        )["KeyPairs"]
        at_stop["key file"] = key_file_of(keys[0]["PublicKey"])

    made = request(deadline=Checkpoint(step, error=error, reached=look))
    with pytest.raises(type(error)):
        provider(moto).provision(made, Recorder())
    assert {kind for kind, ids in at_stop["held"].items() if ids} == made_by_then
    assert at_stop["key file"] is not None
    assert nothing(held(moto, made.pool))
    assert not at_stop["key file"].exists()


# ── the docs' IAM policy, enforced by moto ─────────────────────────────────────────────


def _docs_policy() -> dict[str, Any]:
    page = (ROOT / "docs" / "providers.md").read_text()
    section = page[page.index("### Minimal IAM policy") :]
    block = section[section.index("```json\n") + len("```json\n") :]
    return dict(json.loads(block[: block.index("```")]))


@pytest.fixture
def iam_user(moto: MotoServer) -> Iterator[Callable[[dict[str, Any]], dict[str, str]]]:
    """Makes an IAM user with a policy and returns its credentials; then moto enforces IAM
    on every request (until the test ends)."""
    iam = moto.client("iam")

    def make(policy: dict[str, Any]) -> dict[str, str]:
        name = f"skyward-{secrets.token_hex(3)}"
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="skyward", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        _enforce(moto, "0")
        return {
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }

    try:
        yield make
    finally:
        _enforce(moto, "inf")


def _enforce(moto: MotoServer, count: str) -> None:
    """moto checks IAM on requests after the first ``count`` ("inf": never)."""
    post = urllib.request.Request(
        f"{moto.url}/moto-api/reset-auth",
        data=count.encode(),
        headers={"Content-Type": "text/plain"},  # not a form: moto reads the raw body
    )
    with urllib.request.urlopen(post, timeout=30):
        pass


_PROVISION_AS = """
import os, sys
import skyward as sky
from skyward.client.phases import SilentReporter
sys.path.insert(0, {tests!r})
from support.clouds.aws.pools import Checkpoint, provider, request
from support.clouds.aws.fake import MotoServer

class Server(MotoServer):
    def __init__(self): self.url, self.region = {url!r}, "us-east-1"

made = request(pool={pool!r}, deadline=Checkpoint("waiting for"))
try:
    provider(Server()).provision(made, SilentReporter())
except KeyboardInterrupt as e:
    print("STOPPED", getattr(e, "__notes__", []))
except sky.ProvisionError as e:
    print("ERROR", e, getattr(e, "__notes__", []))
"""


def _provision_as(moto: MotoServer, credentials: dict[str, str], pool: str) -> str:
    script = _PROVISION_AS.format(tests=str(TESTS), url=moto.url, pool=pool)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, **credentials},
    )
    return done.stdout + done.stderr


def test_the_docs_iam_policy_is_enough_to_make_and_delete_a_pool(
    moto: MotoServer, iam_user: Callable[[dict[str, Any]], dict[str, str]]
) -> None:
    output = _provision_as(moto, iam_user(_docs_policy()), "iam-ok")
    _enforce(moto, "inf")
    assert "STOPPED []" in output, output  # it got as far as the launch, and cleaned up
    assert nothing(held(moto, "iam-ok"))


def test_an_action_the_policy_lacks_is_named(
    moto: MotoServer, iam_user: Callable[[dict[str, Any]], dict[str, str]]
) -> None:
    policy = _docs_policy()
    for statement in policy["Statement"]:
        statement["Action"] = [a for a in statement["Action"] if a != "ec2:RunInstances"]
    output = _provision_as(moto, iam_user(policy), "iam-short")
    _enforce(moto, "inf")
    assert "ERROR" in output, output
    assert "ec2:RunInstances" in output
    assert nothing(held(moto, "iam-short"))


# ── why a node was lost ────────────────────────────────────────────────────────────────


def test_loss_reason_asks_ec2_why_an_instance_ended(moto: MotoServer) -> None:
    ec2 = moto.client("ec2")
    image = ec2.describe_images(Filters=[{"Name": "name", "Values": ["*ubuntu*"]}])["Images"][0]
    (instance,) = [
        i["InstanceId"]
        for i in ec2.run_instances(
            ImageId=image["ImageId"], InstanceType="g5.xlarge", MinCount=1, MaxCount=1
        )["Instances"]
    ]
    options = sky.AWS(
        region=moto.region, endpoint_url=moto.url, connect="private", release_timeout=10
    )
    made = request(nodes=1)
    allocation = CloudPool(options, options.machines(made), made)
    allocation.record.made(moto.region, [instance])
    allocation.record.place(0, moto.region, instance)
    assert allocation.loss_reason(0) is None  # still running: not a machine loss
    ec2.terminate_instances(InstanceIds=[instance])
    assert allocation.loss_reason(0) == (
        f"instance {instance} is terminated: terminated through the API or the console"
    )
    allocation.terminate()
    assert allocation.loss_reason(5) is None


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ({"Code": "Server.SpotInstanceTermination"}, "reclaimed by AWS (spot interruption)"),
        ({"Code": "Server.SpotInstanceShutdown"}, "reclaimed by AWS (spot interruption)"),
        ({"Code": "Client.InstanceInitiatedShutdown"}, "it powered itself off"),
        ({"Code": "Server.InternalError", "Message": "Internal error"}, "Internal error"),
    ],
)
def test_state_reasons_read_as_words(reason: dict[str, str], words: str) -> None:
    assert words in describe_reason({"StateReason": reason})


def test_what_teardown_cannot_delete_is_named_with_the_command_that_removes_it(
    moto: MotoServer, iam_user: Callable[[dict[str, Any]], dict[str, str]]
) -> None:
    policy = _docs_policy()
    for statement in policy["Statement"]:
        statement["Action"] = [a for a in statement["Action"] if a != "ec2:DeleteSecurityGroup"]
    output = _provision_as(moto, iam_user(policy), "undeletable")
    _enforce(moto, "inf")
    assert "STOPPED" in output, output
    assert "could not delete security group sg-" in output
    assert "skyward down --pool undeletable" in output
    left = held(moto, "undeletable")
    assert left["instances"] == [] and left["key pairs"] == []  # the rest went
    assert len(left["security groups"]) == 1
    env = {**os.environ, "AWS_ENDPOINT_URL": moto.url}
    command = ["down", "--pool", "undeletable", "--yes", "--cloud", "aws"]
    down = subprocess.run(
        [str(Path(sys.executable).parent / "skyward"), *command],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert down.returncode == 0, down.stdout + down.stderr
    assert nothing(held(moto, "undeletable"))


# ── skyward ls / down: every region, and the keys a killed client left ─────────────────


def _cli(moto: MotoServer, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": moto.url,
        "AWS_DEFAULT_REGION": "us-east-1",
        "TMPDIR": str(tmp),
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / "skyward"), *args, "--cloud", "aws"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_ls_and_down_find_a_pool_in_another_region_and_its_stale_key_file(
    moto: MotoServer, tmp_path: Path
) -> None:
    west = moto.client("ec2", region="us-west-2")
    tags = [{"Key": "skyward-pool", "Value": "west"}, {"Key": "skyward-owner", "Value": "me@x"}]
    west.create_key_pair(
        KeyName="skyward-west-abc", TagSpecifications=[{"ResourceType": "key-pair", "Tags": tags}]
    )
    group = west.create_security_group(
        GroupName="skyward-west-abc",
        Description="x",
        TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}],
    )["GroupId"]
    west.create_placement_group(
        GroupName="skyward-west-pg",
        Strategy="cluster",
        TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}],
    )
    west.create_placement_group(GroupName="someone-elses", Strategy="cluster")
    # The key a client killed mid-start left, labelled as the provider labels it.
    from skyward.providers.ssh.connection import PoolKey

    about = {"provider": "aws", "region": "us-west-2", "pool": "west", "endpoint": moto.url}
    key = PoolKey(directory=tmp_path)
    key.label({**about, "key_pair": "gone", "pid": "0"})
    live = PoolKey(directory=tmp_path)
    live.label({**about, "key_pair": "skyward-west-abc", "pid": "0"})
    running = PoolKey(directory=tmp_path)  # its client (this process) still runs
    running.label({**about, "key_pair": "gone", "pid": str(os.getpid())})

    listed = _cli(moto, "ls", tmp=tmp_path)  # no --region: every enabled region
    assert listed.returncode == 0, listed.stderr
    assert group in listed.stdout and "us-west-2" in listed.stdout
    assert listed.stdout.count("skyward-west-pg") == 1  # in its region only
    assert "someone-elses" not in listed.stdout
    assert str(key.directory) in listed.stdout and "stale" in listed.stdout
    assert str(live.directory) not in listed.stdout  # its key pair is still there
    assert str(running.directory) not in listed.stdout
    narrowed = _cli(moto, "ls", "--region", "eu-west-1", tmp=tmp_path)
    assert group not in narrowed.stdout

    removed = _cli(moto, "down", "--pool", "west", "--yes", tmp=tmp_path)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    tagged = [{"Name": "tag:skyward-pool", "Values": ["west"]}]
    assert west.describe_security_groups(Filters=tagged)["SecurityGroups"] == []
    left = west.describe_placement_groups()["PlacementGroups"]
    assert [g["GroupName"] for g in left] == ["someone-elses"]
    assert not key.directory.exists() and not live.directory.exists()
    assert running.directory.exists()
    assert "Nothing left" in _cli(moto, "ls", tmp=tmp_path).stdout


@pytest.mark.parametrize(
    ("error", "words"),
    [
        ("ConnectionClosedError", "AWS closed the connection before answering"),
        ("EndpointConnectionError", "cannot reach AWS"),
        ("ReadTimeoutError", "AWS did not answer in time"),
        ("ConnectTimeoutError", "connecting timed out"),
        ("NoRegionError", "no AWS region"),
        ("ParamValidationError", "this is a Skyward bug"),
    ],
)
def test_botocore_errors_without_an_answer_are_readable(error: str, words: str) -> None:
    import botocore.exceptions as bex

    kind = getattr(bex, error)
    made = (
        kind(report="bad")
        if error == "ParamValidationError"
        else kind()
        if error == "NoRegionError"
        else kind(endpoint_url="https://ec2.us-east-1.amazonaws.com")
    )
    translated = translate(made, "launching 2 m7i.xlarge instance(s)", "us-east-1")
    assert str(translated).startswith("launching 2 m7i.xlarge instance(s): ")
    assert words in str(translated)
    assert "NoneType" not in str(translated)
