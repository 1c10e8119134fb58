"""Fixtures of the GCP provider's own tests: the Compute Engine fake on loopback, which only
``test_gcp.py`` uses (the stand-in tests and the contract suite use the one on the bridge,
``gce_bridge`` in ``tests/providers/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.clouds.gcp.fake import GCPFake

# ── the Compute Engine fake ─────────────────────────────────────────────────────────────


@pytest.fixture(scope="session")
def gce_server() -> Iterator[GCPFake]:
    with GCPFake() as fake, pytest.MonkeyPatch.context() as patch:
        for name, value in fake.environ().items():  # no metadata server for google.auth
            patch.setenv(name, value)
        yield fake


@pytest.fixture
def gce(gce_server: GCPFake) -> GCPFake:
    """The Compute Engine fake on loopback, empty, operations done at once."""
    gce_server.reset()
    return gce_server
