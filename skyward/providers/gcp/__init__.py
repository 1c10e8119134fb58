"""``GCP(...)``: nodes are Compute Engine instances that the pool creates and always destroys.

A cloud of three modules around the start every cloud shares (``cloud/start.py``)::

    options.py     sky.GCP: project, zone or region, machine type, image, network, service
                   account; checked when the pool is built
    api.py         google-cloud-compute's clients, its waits, its errors in our words; the
                   pool's resources: firewall rules, an instance's body, deletion, why one
                   ended
    machines.py    the contract's calls: offers (zones offering each type), prepare (image,
                   firewall rules, the instances' body), launch, describe, delete

plus ``inventory.py``, ``scope.py`` and ``credentials.py`` (``skyward ls`` / ``down``,
``skyward doctor``). google-cloud-compute is imported only when a
pool uses GCP.
"""

from skyward.providers.gcp.options import GCP

__all__ = ["GCP"]
