"""``Verda(...)``: nodes are Verda (formerly DataCrunch) GPU VMs the pool rents and always
deletes.

A cloud of three modules around the start every cloud shares (``cloud/start.py``)::

    options.py     sky.Verda: credentials, location, instance type, image, OS volume;
                   checked (a token fetched) when the pool is built
    api.py         Verda's REST API over plain HTTP: the OAuth token, its errors in our
                   words, deleting instances, keys and scripts
    machines.py    the contract's calls: offers (types, prices, availability now), prepare
                   (SSH key, startup script), launch, describe, delete

plus ``inventory.py``, ``scope.py`` and ``credentials.py`` (``skyward ls`` / ``down``,
``skyward doctor``).
"""

from skyward.providers.verda.options import Verda

__all__ = ["Verda"]
