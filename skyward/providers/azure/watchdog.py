"""What an Azure VM does when its client has been gone for ``idle_timeout``: delete itself.

The billing trap: a VM that powers itself off from inside is *stopped*, not deallocated, and
Azure bills a stopped VM's compute as if it ran. So on Azure the shared idle watchdog
(``providers/cloud/boot.py``) does not power off; it runs ``skyward-release``::

    skyward-watchdog (idle)  ──>  skyward-release
                                    token   IMDS, as the pool's managed identity (no secret
                                            on the VM; the identity's only role is Virtual
                                            Machine Contributor on the pool's resource group)
                                    whoami  IMDS: this VM's resource id
                                    DELETE  the VM (its OS disk, NIC and public IP go with it:
                                            deleteOption Delete); if refused, deallocate it
                                 <──  exit 0, or 1 and the watchdog tries again a minute later

What stays after that is free or nearly so (the resource group, its network, the identity,
and a public IP the deletion could not take), found by ``skyward ls``. The script's frame is
every such cloud's (``boot.release_script``); this module gives Azure's metadata service and
calls.
"""

from __future__ import annotations

import shlex
import urllib.parse

from skyward.providers.azure.api import audience
from skyward.providers.cloud import boot

RELEASE_PATH = "/usr/local/sbin/skyward-release"
COMPUTE_API = "2024-07-01"
IMDS = "http://169.254.169.254/metadata"


def release_script(*, base_url: str, client_id: str, ca_pem: str | None = None) -> str:
    """``skyward-release`` for a pool whose identity has ``client_id``, calling the ARM
    endpoint ``base_url``; ``ca_pem``: a CA bundle to trust for it (a private endpoint)."""
    resource = urllib.parse.quote(audience(base_url), safe="")
    token_query = (
        f"identity/oauth2/token?api-version=2018-02-01&resource={resource}"
        f"&client_id={urllib.parse.quote(client_id)}"
    )
    trust = "cacert="
    if ca_pem:
        # The bundle travels inside the script: one file, written once by cloud-init.
        trust = "\n".join(
            [
                "cacert=$(mktemp) || exit 1",
                "trap 'rm -f \"$cacert\"' EXIT",
                "cat > \"$cacert\" <<'SKYWARD_CA'",
                ca_pem.strip(),
                "SKYWARD_CA",
            ]
        )
    vm = f"$arm$vm?api-version={COMPUTE_API}"
    return boot.release_script(
        metadata=IMDS,
        header="Metadata: true",
        token=token_query,
        trust=trust,
        find=f"arm={shlex.quote(base_url.rstrip('/'))}\n"
        "vm=$(metadata 'instance/compute/resourceId?api-version=2021-02-01&format=text')\n"
        'case $vm in /subscriptions/*) ;; *) say "no resource id from IMDS"; return 2 ;; esac',
        # Deleting takes the OS disk, NIC and public IP too (deleteOption Delete); a
        # deallocated VM, if that is refused, bills no compute.
        steps=[
            ("DELETE", vm, "deleting $vm"),
            ("POST", vm.replace("?", "/deallocate?"), "deallocating $vm"),
        ],
    )
