"""The public surface: what ``skyward`` exports, and what importing it costs."""

from __future__ import annotations

import subprocess
import sys

import skyward as sky

EXPECTED = [
    "BootstrapError",
    "CallGroup",
    "ChannelError",
    "Compute",
    "ComputePool",
    "Image",
    "InstanceInfo",
    "Local",
    "PendingCall",
    "PipIndex",
    "Plugin",
    "PluginError",
    "PoolClosed",
    "PoolSpec",
    "PoolStatistics",
    "Provider",
    "ProvisionError",
    "RemoteError",
    "RemoteTraceback",
    "SerializationError",
    "SkywardError",
    "StartError",
    "VersionMismatch",
    "WorkerLost",
    "__version__",
    "compute",
    "instance_info",
    "plugins",
]


def test_all_is_pinned_and_sorted() -> None:
    assert sorted(EXPECTED) == EXPECTED
    assert sky.__all__ == EXPECTED


def test_every_public_name_resolves() -> None:
    for name in sky.__all__:
        assert getattr(sky, name) is not None, name


def test_every_error_is_a_skyward_error() -> None:
    for name in sky.__all__:
        value = getattr(sky, name)
        if isinstance(value, type) and issubclass(value, Exception) and name != "RemoteTraceback":
            assert issubclass(value, sky.SkywardError), name
    assert issubclass(sky.WorkerLost, sky.ChannelError)
    assert issubclass(sky.VersionMismatch, sky.ChannelError)


def test_importing_skyward_imports_no_sdk_no_jax_and_nothing_heavy() -> None:
    code = (
        "import sys, skyward, skyward.plugins\n"
        "heavy = ['jax', 'keras', 'boto3', 'paramiko', 'google', 'azure', 'numpy', "
        "'pydantic', 'cloudpickle']\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_using_the_pool_api_still_imports_no_sdk_and_no_jax() -> None:
    code = (
        "import sys, skyward as sky\n"
        "sky.ComputePool, sky.compute, sky.Image, sky.Local, sky.plugins\n"
        "heavy = ['jax', 'keras', 'boto3', 'paramiko', 'google.cloud', 'azure']\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
