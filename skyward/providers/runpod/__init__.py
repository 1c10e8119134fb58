"""``RunPod(...)``: nodes are RunPod GPU pods that the pool rents and always terminates.

A cloud of three modules around the start every cloud shares (``cloud/start.py``)::

    options.py     sky.RunPod: API key, endpoint, cloud type, data center, image, disks;
                   checked when the pool is built (the key asked of RunPod)
    api.py         RunPod's GraphQL and REST (v1) APIs over plain HTTP, its refusals in our
                   words; the key stays on this machine
    machines.py    the contract's calls: offers (GPU types in stock, priced), prepare (the
                   pods' input, the boot payload in their start command), launch, describe
                   (port 22's public mapping), delete

plus ``inventory.py``, ``scope.py`` and ``credentials.py`` (``skyward ls`` / ``down``,
``skyward doctor``). Nothing but the standard library and paramiko.
"""

from skyward.providers.runpod.options import RunPod

__all__ = ["RunPod"]
