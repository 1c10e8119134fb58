"""Fixtures of the Verda provider's own tests: the REST API fake on loopback (``verda``). The
stand-in tests and the contract suite use the fake on the bridge, ``verda_standins`` in
``tests/providers/conftest.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.clouds.verda.fake import VerdaFake


@pytest.fixture(scope="session")
def verda_server() -> Iterator[VerdaFake]:
    with VerdaFake() as fake:
        yield fake


@pytest.fixture
def verda(verda_server: VerdaFake) -> VerdaFake:
    """The fake on loopback, emptied; instances pass each state in two reads."""
    verda_server.reset()
    return verda_server
