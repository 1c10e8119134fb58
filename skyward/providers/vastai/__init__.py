"""``VastAI(...)``: nodes are Vast.ai instances (containers on marketplace hosts) that the pool
rents and always destroys.

A cloud of three modules around the start every cloud shares (``cloud/start.py``)::

    options.py     sky.VastAI: API key, endpoint, offer filters, image, disk; checked when
                   the pool is built
    api.py         Vast's REST API over plain HTTP (no SDK), its errors in our words
    machines.py    the contract's calls: offers (the marketplace's search), prepare (the
                   start command), launch (rent), describe, delete

plus ``inventory.py``, ``scope.py`` and ``credentials.py`` (``skyward ls`` / ``down``,
``skyward doctor``).
"""

from skyward.providers.vastai.options import VastAI

__all__ = ["VastAI"]
