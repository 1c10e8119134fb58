"""Fixtures the torch plugin's test files share."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from support.sshhosts import Hosts, PackageIndex

_WHEEL_CACHE = Path.home() / ".cache" / "skyward-tests" / "wheels"


@pytest.fixture(scope="session")
def torch_index(
    ssh_hosts: Hosts, package_index: PackageIndex, tmp_path_factory: Any
) -> Iterator[str]:
    """PyTorch's index as the plugin reads it (``<url>/cpu/torch/``), serving the CPU torch
    this machine runs, on the test bridge; torch's dependencies are on the hosts' main index.
    The plugin's ``index_url`` points here, so the hosts install torch from this index only."""
    package_index.download(
        ["filelock", "typing-extensions", "setuptools", "sympy", "networkx", "jinja2", "fsspec"],
        _WHEEL_CACHE,
    )
    root = tmp_path_factory.mktemp("torch-index")
    index = PackageIndex(root, ssh_hosts.bridge_address, port=8702)
    try:
        (root / "cpu").symlink_to(root / "simple")
        index.download([f"torch=={metadata.version('torch')}", "--no-deps"], _WHEEL_CACHE / "torch")
        yield f"http://{ssh_hosts.bridge_address}:8702/"
    finally:
        index.close()
