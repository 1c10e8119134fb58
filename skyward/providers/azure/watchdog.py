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
and a public IP the deletion could not take), found by ``skyward ls``. Needs ``sh``, ``sed``
and ``curl``, which every Ubuntu image has.
"""

from __future__ import annotations

import shlex
import urllib.parse

from skyward.providers.azure.api import audience

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
    q = shlex.quote
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
    else:
        trust = "cacert="
    return f"""#!/bin/sh
# Skyward on Azure: end this VM's billing (run by skyward-watchdog when the pool's client is
# gone). Powering off would only *stop* the VM, which Azure still bills; this deletes it as
# the pool's managed identity, whose only role is on the pool's resource group.
arm={q(base_url.rstrip("/"))}
imds={q(IMDS)}
token_query={q(token_query)}
{trust}
say() {{
    echo "skyward-release: $*" >&2
    logger -t skyward-release "$*" 2>/dev/null || true
}}
metadata() {{
    curl -sS --max-time 20 --noproxy '*' -H Metadata:true "$imds/$1"
}}
arm_call() {{  # METHOD PATH: prints the HTTP status
    curl -sS --max-time 60 ${{cacert:+--cacert "$cacert"}} -o /dev/null -w '%{{http_code}}' \\
        -X "$1" -H "Authorization: Bearer $token" -H 'Content-Length: 0' \\
        "$arm$2?api-version={COMPUTE_API}"
}}
token=$(metadata "$token_query" | sed -n 's/.*"access_token" *: *"\\([^"]*\\)".*/\\1/p')
[ -n "$token" ] || {{ say "no token from the instance metadata service"; exit 1; }}
vm=$(metadata 'instance/compute/resourceId?api-version=2021-02-01&format=text')
case $vm in /subscriptions/*) ;; *) say "no resource id from the metadata service"; exit 1 ;; esac
status=$(arm_call DELETE "$vm")
case $status in 200|202|204) say "deleting $vm"; exit 0 ;; esac
say "deleting $vm was refused (HTTP $status); deallocating it"
status=$(arm_call POST "$vm/deallocate")
case $status in 200|202) say "deallocating $vm"; exit 0 ;; esac
say "deallocating $vm was refused too (HTTP $status)"
exit 1
"""
