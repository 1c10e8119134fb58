"""The moto server: a real HTTP endpoint speaking the EC2 and SSM APIs, started by the tests on
loopback and stopped by PID.

::

    boto3 ──> url: Ec2Proxy (in the test process) ──> moto_server (loopback, its own process)
              answers EC2's placement-group calls,    everything else
              which moto does not implement

moto raises NotImplementedError for Create/Describe/DeletePlacementGroups; EC2 has them, and
the AWS provider calls them as EC2 documents (``skyward ls`` lists placement groups). The
proxy in front answers them as EC2 does (tags, tag filters, InvalidPlacementGroup.Unknown).
``placement_groups=False`` leaves moto bare (S3 only: the volumes' tests).

The conftest's fake credentials (``AWS_ACCESS_KEY_ID=testing``, metadata lookups off) keep
boto3 from looking for real ones. ``reset()`` wipes every resource between tests; moto's
first EC2 call loads its data for a few seconds, which ``start`` pays once.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import boto3

from support.clouds.aws.proxy import Ec2Proxy

# What moto has that stands in for the public AMI parameters (it holds none under
# /aws/service and refuses writes there): tests seed this path and point AWS() at it.
AMI_PARAMETER = "/skyward-tests/ubuntu/ami-id"


class MotoServer:
    """``moto.server`` (behind the placement groups' proxy) at ``url``, on ``host``;
    ``close()`` stops it by PID."""

    def __init__(
        self, host: str = "127.0.0.1", region: str = "us-east-1", *, placement_groups: bool = True
    ) -> None:
        self.region = region
        self.log = Path(tempfile.mkstemp(prefix="moto-", suffix=".log")[1])
        behind = "127.0.0.1" if placement_groups else host
        with socket.socket() as probe:
            probe.bind((behind, 0))
            port = probe.getsockname()[1]
        self.upstream = f"http://{behind}:{port}"
        self.front = Ec2Proxy(self.upstream, host=host) if placement_groups else None
        self.url = self.front.url if self.front is not None else self.upstream
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", behind, "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            self._wait_until_it_answers(timeout=60)
            self.client("ec2").describe_regions()  # moto loads its EC2 data now, once
        except BaseException:
            self.close()
            raise

    def _wait_until_it_answers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto_server exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.upstream}/moto-api/", timeout=2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def client(self, service: str, region: str | None = None) -> Any:
        return boto3.client(service, endpoint_url=self.url, region_name=region or self.region)

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.upstream}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=30):
            pass
        if self.front is not None:
            self.front.forget()

    def seed_ami(self) -> str:
        """An Ubuntu AMI of moto's, published under ``AMI_PARAMETER``; its id."""
        ec2 = self.client("ec2")
        images = ec2.describe_images(Filters=[{"Name": "name", "Values": ["*ubuntu*"]}])
        image = sorted(images["Images"], key=lambda i: i["ImageId"])[0]["ImageId"]
        self.client("ssm").put_parameter(
            Name=AMI_PARAMETER, Value=image, Type="String", Overwrite=True
        )
        return str(image)

    def close(self) -> None:
        if self.front is not None:
            self.front.close_proxy()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.unlink(missing_ok=True)
