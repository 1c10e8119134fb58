"""The public surface: what ``skyward`` exports, and what importing it costs."""

from __future__ import annotations

import subprocess
import sys

import skyward as sky

EXPECTED = [
    "AWS",
    "Allocation",
    "App",
    "Azure",
    "BootstrapError",
    "CallGroup",
    "CallbackWriter",
    "CatalogEntry",
    "ChannelError",
    "CollectiveHang",
    "Compute",
    "ComputeFunction",
    "ComputePool",
    "DEFAULT_IMAGE",
    "GCP",
    "HostKeyError",
    "Image",
    "InstanceInfo",
    "Lambda",
    "Local",
    "LogConfig",
    "MissingDependency",
    "NoSpecStarted",
    "PendingCall",
    "PendingCompute",
    "PendingComputeGroup",
    "PipIndex",
    "Plugin",
    "PluginError",
    "PoolClosed",
    "PoolSpec",
    "PoolStatistics",
    "Provider",
    "ProvisionCancelled",
    "ProvisionError",
    "ProvisionRequest",
    "RemoteError",
    "RemoteTraceback",
    "RunPod",
    "SSH",
    "SerializationError",
    "SkywardError",
    "Slurm",
    "Spec",
    "Stacks",
    "StartError",
    "Terminated",
    "VastAI",
    "Verda",
    "VersionMismatch",
    "Volume",
    "Worker",
    "WorkerLost",
    "__version__",
    "accelerators",
    "barrier",
    "catalog",
    "compute",
    "counter",
    "dict",
    "function",
    "gather",
    "instance_info",
    "is_head",
    "lock",
    "metrics",
    "plugins",
    "queue",
    "redirect_output",
    "set",
    "shard",
    "silent",
    "stderr",
    "stdout",
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


def _heavy_modules_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; which heavy modules did it import?"""
    heavy = [
        "jax",
        "keras",
        "boto3",
        "paramiko",
        "google.cloud",
        "azure",
        "numpy",
        "pydantic",
        "cloudpickle",
    ]
    probe = f"import sys\n{code}\nprint(*[m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.split()


def test_importing_skyward_imports_nothing_heavy() -> None:
    assert _heavy_modules_after("import skyward, skyward.plugins") == []


def test_using_the_pool_api_imports_no_sdk_and_no_jax() -> None:
    code = "import skyward as sky\nsky.ComputePool, sky.compute, sky.Image, sky.Local, sky.plugins"
    assert set(_heavy_modules_after(code)) <= {"pydantic", "cloudpickle"}
