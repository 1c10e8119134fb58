"""The azure-mgmt boundary: clients, long-running operations waited within our own bounds,
and every SDK error translated into one that says what to do.

::

    Api.connect(...)      three management clients (resources, network, compute) sharing one
                          credential, base URL, CA bundle and polling interval
    api.call(op, doing)   one request; an SDK error becomes a ProvisionError about `doing`
    api.wait(op, doing,   a long-running operation (begin_*), polled by the SDK's own thread
             deadline)    while we wait in short slices, so a closing pool or the start's
                          deadline ends the wait at once (the SDK's result() would not)

Errors arrive as ``HttpResponseError`` (every 409 is a ``ResourceExistsError``, a 404 a
``ResourceNotFoundError``); ``error.code`` says what happened. ``failure_code`` reads it back
from a translated error, for the failover's choices.

Through them, the Azure resources of one pool are made and unmade: everything lives in one
resource group.

::

    create_group     the pool's resource group, tagged (pool, owner, creation time)
    make_site        per location used: a virtual network and subnet with a network security
                     group (SSH from the client only, everything within the subnet, nothing
                     else), and the pool's managed identity with one role on the group
                     (Virtual Machine Contributor: the idle watchdog deletes its own VM)
    create_vm        a node's public IP (connect="public"), a NIC, the VM
                     (the pool's key, cloud-init user data as customData, spot settings);
                     disk, NIC and IP are deleted with the VM (deleteOption Delete)
    delete_vms       a failed attempt's VMs, NICs and IPs, before the next one
    delete_group     one operation removes everything; waited for

Names inside the group need only be unique there: ``net-<location>``, ``node-<rank>``...
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skyward._errors import ProvisionError
from skyward.client.extras import require
from skyward.client.futures import Deadline, parallel
from skyward.providers.cloud.api import Boundary, Refusals, cause, poll
from skyward.providers.cloud.start import unique_name

if TYPE_CHECKING:
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.network import NetworkManagementClient
    from azure.mgmt.resource.resources import ResourceManagementClient

PUBLIC_CLOUD = "https://management.azure.com"
ROLE_HINT = "the roles a pool needs are in docs/providers.md (Azure)"
_WAIT_SLICE = 0.5  # seconds between looks at the deadline while an operation runs

# Codes that mean "no room for this size here now": the failover moves on.
CAPACITY = frozenset(
    {
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "SpotMaxPriceTooLow",
    }
)
# Codes of a refused spot request that on-demand may not meet: the spot quota.
_SPOT_QUOTA = frozenset({"OperationNotAllowed", "QuotaExceeded"})
REFUSALS = Refusals(
    cloud="Azure",
    renew="`az login` again, or renew the service principal's secret",
    grant="Give it a role that includes {action}",
    roles=ROLE_HINT,
    capacity=CAPACITY,
    spot=_SPOT_QUOTA,
)
_CREDENTIALS = frozenset(
    {
        "InvalidAuthenticationToken",
        "InvalidAuthenticationTokenTenant",
        "ExpiredAuthenticationToken",
        "AuthenticationFailed",
    }
)
_QUOTA = re.compile(
    r"approved (?P<family>.+?) Cores quota.*?Location: (?P<location>[\w-]+).*?"
    r"Current Limit: (?P<limit>\d+).*?Current Usage: (?P<usage>\d+).*?"
    r"Additional Required: (?P<need>\d+)",
    re.S,
)
_ACTION = re.compile(r"perform action '(?P<action>[^']+)' over scope '(?P<scope>[^']+)'")


def audience(base_url: str | None) -> str:
    """The token audience for an ARM endpoint: the public cloud's unless another is given
    (a sovereign cloud, Azure Stack Hub, the tests' fake)."""
    return (base_url or PUBLIC_CLOUD).rstrip("/") + "/"


@dataclass(frozen=True)
class Api(Boundary):
    """The management clients of one subscription. ``call`` and ``wait`` translate errors;
    nothing else here does I/O. Thread-safe (the SDK's clients are)."""

    resource: ResourceManagementClient
    network: NetworkManagementClient
    compute: ComputeManagementClient
    subscription: str
    base_url: str
    credential: Any

    @classmethod
    def connect(
        cls,
        *,
        subscription: str,
        credential: Any,
        base_url: str | None,
        connection_verify: str | None,
        polling_interval: float,
    ) -> Api:
        """Clients for ``subscription``. ``credential`` None: ``DefaultAzureCredential``
        (environment, workload identity, managed identity, the Azure CLI's login...)."""
        compute = require("azure.mgmt.compute", feature="sky.Azure")
        network = require("azure.mgmt.network", feature="sky.Azure")
        resources = require("azure.mgmt.resource.resources", feature="sky.Azure")
        if credential is None:
            identity = require("azure.identity", feature="sky.Azure")
            _sign_in_detail_to_debug()
            credential = identity.DefaultAzureCredential()
        url = (base_url or PUBLIC_CLOUD).rstrip("/")
        options: dict[str, Any] = {
            "base_url": url,
            "credential_scopes": [audience(base_url) + ".default"],
            "polling_interval": polling_interval,
            # A few retries for a dropped connection or a 429/5xx, not the SDK's ten with
            # backoff: a start that cannot get through says so within a minute.
            "retry_total": 3,
        }
        if connection_verify is not None:
            options["connection_verify"] = connection_verify
        return cls(
            resource=resources.ResourceManagementClient(credential, subscription, **options),
            network=network.NetworkManagementClient(credential, subscription, **options),
            compute=compute.ComputeManagementClient(credential, subscription, **options),
            subscription=subscription,
            base_url=url,
            credential=credential,
        )

    def sign_in(self) -> None:
        """Ask for a token now: missing or expired credentials are said before anything
        is created (the clients would ask only with their first request)."""
        try:
            self.credential.get_token(audience(self.base_url) + ".default")
        except Exception as exc:
            raise translate(exc, "signing in to Azure") from exc

    def raised_by_sdk(self, exc: BaseException) -> bool:
        return is_sdk_error(exc)

    def translate(self, exc: BaseException, doing: str, request: Any) -> ProvisionError:
        return translate(exc, doing)

    def wait(
        self,
        operation: Callable[..., Any],
        doing: str,
        deadline: Deadline | None,
        /,
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Start a long-running operation (``begin_*``) and wait for its result, within
        ``deadline``, or without one ``timeout`` seconds (600 when not given). An operation
        left behind keeps running in Azure; whoever stopped waiting deletes what it made."""
        if deadline is not None:
            deadline.check(doing)  # a closed pool starts nothing more
        poller = self.call(operation, doing, *args, **kwargs)
        # Polled by the SDK's own thread; we look in short slices, so that our bound ends it.
        bound = deadline or Deadline(timeout or 600.0, f"{timeout or 600.0:g} s")
        poll(lambda: poller.done() or None, doing, bound, pause=0.02, most=_WAIT_SLICE)
        return self.call(poller.result, doing)


def is_sdk_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("azure.", "msrest"))


def failure_code(exc: BaseException | None) -> str:
    """The ARM error code behind an error (or its cause): ``"SkuNotAvailable"``, or ``""``."""
    code = cause(exc, lambda e: getattr(getattr(e, "error", None), "code", None) or None)
    return "" if code is None else str(code)


def _message(exc: BaseException) -> str:
    error = getattr(exc, "error", None)
    message = getattr(error, "message", None)
    return str(message or getattr(exc, "message", None) or exc).strip()


class _SignInDetail(logging.Handler):
    """``azure.identity`` logs every failed sign-in at WARNING, the whole chain of
    credentials tried; in a program that configured no logging, Python's last resort
    prints it on stderr, fifteen lines before Skyward's one line that says what to do. The
    records go on to ``skyward.azure.identity`` at DEBUG instead: kept where Skyward's
    log is kept (``sky.LogConfig(level="DEBUG")``), never shown by default."""

    def emit(self, record: logging.LogRecord) -> None:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        logging.getLogger("skyward.azure.identity").handle(record)


def _sign_in_detail_to_debug() -> None:
    """Once, and only where the program has no logging of its own: a program that
    configured handlers sees the SDK's records as it configured them."""
    sdk = logging.getLogger("azure.identity")
    if logging.getLogger().handlers or any(isinstance(h, _SignInDetail) for h in sdk.handlers):
        return
    sdk.addHandler(_SignInDetail())
    sdk.propagate = False


def translate(exc: BaseException, doing: str) -> ProvisionError:
    """A ``ProvisionError`` that says what went wrong in ``doing`` and what to do."""
    name = type(exc).__name__
    code = failure_code(exc)
    message = _message(exc)
    if name in ("ClientAuthenticationError", "CredentialUnavailableError"):
        return ProvisionError(
            f"{doing}: no usable Azure credentials ({message.splitlines()[0][:300]}). Run "
            f"`az login`, set AZURE_CLIENT_ID / AZURE_TENANT_ID / AZURE_CLIENT_SECRET, or pass "
            f"sky.Azure(credential=...)"
        )
    if name in ("ServiceRequestError", "ServiceRequestTimeoutError", "ServiceResponseError"):
        return REFUSALS.unreachable(doing, message)
    if code in _CREDENTIALS:
        return REFUSALS.credentials_refused(doing, f"{code}: {message}")
    if code == "AuthorizationFailed":
        found = _ACTION.search(message)
        where = f"on {found['scope'] if found else '?'}"
        return REFUSALS.denied(doing, found["action"] if found else "?", where, code)
    if code in _SPOT_QUOTA and "quota" in message.lower():
        found = _QUOTA.search(message)
        if found:
            return REFUSALS.quota(
                doing,
                f"'{found['family']}' vCPU quota",
                found["location"],
                limit=found["limit"],
                detail=f"{found['usage']} in use, {found['need']} more needed",
                ask="portal: Quotas > Compute, or `az quota update`",
                more=", or another location",
            )
        return ProvisionError(f"{doing}: a quota is too small ({code}: {message})")
    if code == "SkuNotAvailable":
        return ProvisionError(f"{doing}: this VM size is not available there now ({message})")
    if code in CAPACITY:
        return ProvisionError(f"{doing}: Azure has no capacity for it there now ({message})")
    if code in ("SubscriptionNotFound", "InvalidSubscriptionId"):
        return ProvisionError(
            f"{doing}: Azure does not know the subscription ({code}: {message}); check "
            f"sky.Azure(subscription_id=...) or AZURE_SUBSCRIPTION_ID"
        )
    if code in ("LocationNotAvailableForResourceType", "NoRegisteredProviderFound"):
        return ProvisionError(
            f"{doing}: the location is wrong or not enabled for it ({code}: {message}); "
            f"check sky.Azure(location=...)"
        )
    if code == "MissingSubscriptionRegistration":
        return ProvisionError(
            f"{doing}: a resource provider is not registered in the subscription ({message}). "
            f"Register it once: az provider register --namespace <the namespace named above>"
        )
    if code:
        return REFUSALS.said(doing, code, message)
    return ProvisionError(f"{doing}: {name}: {message}")


# ── the pool's resources ──────────────────────────────────────────────────────────────────

# Built-in role "Virtual Machine Contributor": manage VMs, not log in to them. Its id is the
# same in every tenant.
VM_CONTRIBUTOR = "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
IDENTITY_API = "2023-01-31"
ROLE_API = "2022-04-01"
SUBNET_BITS = 24  # the pool's subnet: the first /24 of the address space


@dataclass(frozen=True)
class ImageRef:
    """A marketplace image (``publisher:offer:sku:version``) or an image's resource id."""

    publisher: str = ""
    offer: str = ""
    sku: str = ""
    version: str = "latest"
    id: str = ""

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        if text.startswith("/subscriptions/"):
            return cls(id=text)
        parts = text.split(":")
        if len(parts) != 4 or not all(parts):
            raise ValueError(
                f"image {text!r}: give 'publisher:offer:sku:version' (for example "
                f"'Canonical:ubuntu-24_04-lts:server:latest') or an image's resource id"
            )
        return cls(*parts)

    def body(self) -> dict[str, str]:
        if self.id:
            return {"id": self.id}
        return {
            "publisher": self.publisher,
            "offer": self.offer,
            "sku": self.sku,
            "version": self.version,
        }

    def __str__(self) -> str:
        return self.id or f"{self.publisher}:{self.offer}:{self.sku}:{self.version}"


@dataclass(frozen=True)
class Site:
    """The pool's network (and identity) in one location."""

    location: str
    subnet_id: str
    subnet_prefix: str
    identity_id: str | None = None
    identity_client_id: str | None = None


@dataclass(frozen=True)
class VmSpec:
    """Everything a node's VM is made from, kept so that a lost one is replaced alike."""

    size: str
    spot: bool
    max_price: float | None
    image: ImageRef
    disk_gb: int
    disk_type: str
    username: str
    public_key: str
    user_data: str
    public_ip: bool
    accelerated_networking: bool
    tags: Mapping[str, str]


def group_name(pool: str) -> str:
    """The pool's resource group: unique, in the characters Azure accepts (90 at most)."""
    return unique_name(pool, unsafe=r"[^A-Za-z0-9_.()-]", length=60)


def create_group(api: Api, name: str, location: str, tags: Mapping[str, str]) -> None:
    api.call(
        api.resource.resource_groups.create_or_update,
        f"creating resource group {name}",
        name,
        {"location": location, "tags": dict(tags)},
    )


def make_site(
    api: Api,
    group: str,
    location: str,
    *,
    address_space: str,
    ssh_cidrs: Sequence[str],
    identity: bool,
    tags: Mapping[str, str],
    deadline: Deadline,
) -> Site:
    """The network security group, the virtual network with its subnet, and (``identity``)
    the pool's managed identity with its one role on the group."""
    subnet = _first_subnet(address_space)
    nsg = api.wait(
        api.network.network_security_groups.begin_create_or_update,
        f"creating the network security group in {location}",
        deadline,
        group,
        f"nsg-{location}",
        {
            "location": location,
            "tags": dict(tags),
            "properties": {"securityRules": security_rules(ssh_cidrs, subnet)},
        },
    )
    vnet = api.wait(
        api.network.virtual_networks.begin_create_or_update,
        f"creating the virtual network in {location}",
        deadline,
        group,
        f"net-{location}",
        {
            "location": location,
            "tags": dict(tags),
            "properties": {
                "addressSpace": {"addressPrefixes": [address_space]},
                "subnets": [
                    {
                        "name": "nodes",
                        "properties": {
                            "addressPrefix": subnet,
                            "networkSecurityGroup": {"id": nsg.id},
                        },
                    }
                ],
            },
        },
    )
    site = Site(location=location, subnet_id=str(vnet.subnets[0].id), subnet_prefix=subnet)
    if not identity:
        return site
    made = api.wait(
        api.resource.resources.begin_create_or_update_by_id,
        f"creating the pool's managed identity in {location}",
        deadline,
        _group_id(api, group)
        + f"/providers/Microsoft.ManagedIdentity/userAssignedIdentities/skyward-{location}",
        {"location": location, "tags": dict(tags)},
        api_version=IDENTITY_API,
    )
    principal = str(made.properties["principalId"])
    deadline.check("giving the pool's identity its role on the resource group")
    role = f"/subscriptions/{api.subscription}/providers/Microsoft.Authorization"
    try:
        api.wait(
            api.resource.resources.begin_create_or_update_by_id,
            "giving the pool's managed identity the role Virtual Machine Contributor on its "
            "resource group (for the idle watchdog)",
            deadline,
            f"{_group_id(api, group)}/providers/Microsoft.Authorization/roleAssignments/"
            f"{uuid.uuid4()}",
            {
                "properties": {
                    "roleDefinitionId": f"{role}/roleDefinitions/{VM_CONTRIBUTOR}",
                    "principalId": principal,
                    # A principal made a moment ago may not have reached every replica of
                    # the directory; saying what it is spares ARM the lookup that would fail.
                    "principalType": "ServicePrincipal",
                }
            },
            api_version=ROLE_API,
        )
    except ProvisionError as exc:
        if failure_code(exc) != "AuthorizationFailed":
            raise
        raise ProvisionError(
            f"{exc}. Assigning roles needs Owner, User Access Administrator or Role Based "
            f"Access Control Administrator on the subscription. Without it, pass "
            f"sky.Azure(self_delete=False): the idle watchdog then only powers VMs off, and "
            f"Azure bills a VM stopped that way until `skyward down` deletes it"
        ) from exc
    return Site(
        location=location,
        subnet_id=site.subnet_id,
        subnet_prefix=subnet,
        identity_id=str(made.id),
        identity_client_id=str(made.properties["clientId"]),
    )


def security_rules(ssh_cidrs: Sequence[str], subnet: str) -> list[dict[str, Any]]:
    """SSH from the client's networks only; anything between the pool's nodes; nothing else
    (not even the rest of the virtual network, which Azure's default rules would let in)."""
    return [
        _rule("ssh-from-client", 100, "Tcp", list(ssh_cidrs), "22"),
        _rule("within-the-pool", 110, "*", [subnet], "*"),
        _rule("nothing-else", 4096, "*", ["*"], "*", access="Deny"),
    ]


def _rule(
    name: str,
    priority: int,
    protocol: str,
    sources: list[str],
    ports: str,
    *,
    access: str = "Allow",
) -> dict[str, Any]:
    return {
        "name": name,
        "properties": {
            "priority": priority,
            "direction": "Inbound",
            "access": access,
            "protocol": protocol,
            "sourceAddressPrefixes": sources,
            "sourcePortRange": "*",
            "destinationAddressPrefix": "*",
            "destinationPortRange": ports,
        },
    }


def create_vm(
    api: Api,
    group: str,
    site: Site,
    spec: VmSpec,
    name: str,
    deadline: Deadline,
) -> Any:
    """One node's public IP (if asked), NIC and VM; the VM once its create has finished."""
    location = site.location
    tags = dict(spec.tags)
    config: dict[str, Any] = {"subnet": {"id": site.subnet_id}}
    if spec.public_ip:
        address = api.wait(
            api.network.public_ip_addresses.begin_create_or_update,
            f"creating public IP {name}-ip",
            deadline,
            group,
            f"{name}-ip",
            {
                "location": location,
                "tags": tags,
                "sku": {"name": "Standard"},
                "properties": {
                    "publicIPAllocationMethod": "Static",
                    "deleteOption": "Delete",
                },
            },
        )
        config["publicIPAddress"] = {"id": address.id, "properties": {"deleteOption": "Delete"}}
    nic = api.wait(
        api.network.network_interfaces.begin_create_or_update,
        f"creating network interface {name}-nic",
        deadline,
        group,
        f"{name}-nic",
        {
            "location": location,
            "tags": tags,
            "properties": {
                "enableAcceleratedNetworking": spec.accelerated_networking,
                "ipConfigurations": [{"name": "primary", "properties": config}],
            },
        },
    )
    body = vm_body(spec, site, name, str(nic.id))
    doing = f"creating VM {name} ({spec.size}{', spot' if spec.spot else ''}) in {location}"
    return api.wait(
        api.compute.virtual_machines.begin_create_or_update, doing, deadline, group, name, body
    )


def vm_body(spec: VmSpec, site: Site, name: str, nic_id: str) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "hardwareProfile": {"vmSize": spec.size},
        "storageProfile": {
            "imageReference": spec.image.body(),
            "osDisk": {
                "createOption": "FromImage",
                "deleteOption": "Delete",
                "diskSizeGB": spec.disk_gb,
                "managedDisk": {"storageAccountType": spec.disk_type},
            },
        },
        "osProfile": {
            "computerName": name,
            "adminUsername": spec.username,
            # Azure passes it to cloud-init as it is; the API wants it in base64.
            "customData": base64.b64encode(spec.user_data.encode()).decode(),
            "linuxConfiguration": {
                "disablePasswordAuthentication": True,
                "ssh": {
                    "publicKeys": [
                        {
                            "path": f"/home/{spec.username}/.ssh/authorized_keys",
                            "keyData": spec.public_key,
                        }
                    ]
                },
            },
        },
        "networkProfile": {
            "networkInterfaces": [
                {"id": nic_id, "properties": {"primary": True, "deleteOption": "Delete"}}
            ]
        },
    }
    if spec.spot:
        properties["priority"] = "Spot"
        # Evicted means deleted: nothing of an evicted node stays behind to bill.
        properties["evictionPolicy"] = "Delete"
        properties["billingProfile"] = {
            "maxPrice": -1 if spec.max_price is None else spec.max_price
        }
    body: dict[str, Any] = {
        "location": site.location,
        "tags": dict(spec.tags),
        "properties": properties,
    }
    if site.identity_id is not None:
        body["identity"] = {
            "type": "UserAssigned",
            "userAssignedIdentities": {site.identity_id: {}},
        }
    return body


def addresses(api: Api, group: str, name: str) -> tuple[str, str | None]:
    """(private, public) address of VM ``name``'s network interface."""
    nic = api.call(
        api.network.network_interfaces.get,
        f"reading the address of {name}",
        group,
        f"{name}-nic",
    )
    config = nic.ip_configurations[0]
    public = None
    if config.public_ip_address is not None:
        address = api.call(
            api.network.public_ip_addresses.get,
            f"reading the public address of {name}",
            group,
            f"{name}-ip",
        )
        public = address.ip_address
    return str(config.private_ip_address), public


def delete_vms(api: Api, group: str, names: Sequence[str], deadline: Deadline) -> None:
    """Delete VMs and then their NICs and public IPs (a VM that failed to create, or was
    never made, may have left them)."""

    def one(name: str) -> None:
        for operation, resource in (
            (api.compute.virtual_machines.begin_delete, name),
            (api.network.network_interfaces.begin_delete, f"{name}-nic"),
            (api.network.public_ip_addresses.begin_delete, f"{name}-ip"),
        ):
            try:
                api.wait(operation, f"deleting {resource}", deadline, group, resource)
            except ProvisionError as exc:
                if failure_code(exc) not in ("ResourceNotFound", "NotFound"):
                    raise

    parallel(one, list(names), deadline, f"deleting {len(names)} failed VM(s)")


def delete_group(api: Api, name: str, *, timeout: float) -> str | None:
    """Delete the resource group and everything in it, and wait; ``None`` once it is gone,
    else why it is not. VMs are force-deleted (faster, and nothing on them is kept)."""
    doing = f"deleting resource group {name}"
    try:
        api.wait(
            api.resource.resource_groups.begin_delete,
            doing,
            None,
            name,
            force_deletion_types="Microsoft.Compute/virtualMachines",
            timeout=timeout,
        )
    except ProvisionError as exc:
        if failure_code(exc) in ("ResourceGroupNotFound", "ResourceNotFound"):
            return None
        return str(exc)
    except TimeoutError as exc:
        return str(exc)
    return None


def _group_id(api: Api, group: str) -> str:
    return f"/subscriptions/{api.subscription}/resourceGroups/{group}"


def _first_subnet(address_space: str) -> str:
    network = ipaddress.ip_network(address_space, strict=False)
    if network.prefixlen >= SUBNET_BITS:
        return str(network)
    return str(next(network.subnets(new_prefix=SUBNET_BITS)))
