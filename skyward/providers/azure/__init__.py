"""``Azure(...)``: nodes are Azure VMs in a resource group the pool creates and always deletes.

A cloud of three modules around the start every cloud shares (``cloud/start.py``)::

    options.py     sky.Azure: subscription, locations (in order: the failover's "zones"),
                   VM size, image, spot and its cap, the self-deleting watchdog
    api.py         the azure-mgmt clients, their long-running operations, their errors in
                   our words; the pool's resource group and what is in it (ARM bodies)
    machines.py    the contract's calls: offers (the SKU list per location), prepare (the
                   pool's resource group), launch (network per location, then the VMs),
                   describe, delete (the group)

plus ``watchdog.py`` (the self-delete a VM runs), and ``inventory.py``, ``scope.py`` and
``credentials.py`` (``skyward ls`` / ``down``, ``skyward doctor``). The SDKs are imported
only when a pool uses Azure.
"""

from skyward.providers.azure.options import Azure

__all__ = ["Azure"]
