"""What the tests build their real components from: SSH hosts in network namespaces, the
package index they install from, process leak checks, pool factories, and (later) the cloud
fakes. Fixtures in ``conftest.py`` start and stop these; tests import helpers from here."""

from pathlib import Path

# Tests sit in folders laid out like the package (tests/pool/, tests/providers/aws/, ...), so
# a test names the checkout and this folder through these, not by counting parents.
TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
