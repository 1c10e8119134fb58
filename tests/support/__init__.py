"""What the tests build their real components from: SSH hosts in network namespaces, the
package index they install from, process leak checks, pool factories, and (later) the cloud
fakes. Fixtures in ``conftest.py`` start and stop these; tests import helpers from here."""
