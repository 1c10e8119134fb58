"""``Lambda(...)``: nodes are Lambda Cloud GPU instances that the pool rents and always
terminates.

A cloud of three modules around the start every cloud shares (``cloud/start.py``)::

    options.py     sky.Lambda: API key, region, instance type, file system; checked when
                   the pool is built
    api.py         Lambda's REST API over the standard library (no SDK), its refusals in our
                   words
    machines.py    the contract's calls: offers (types with capacity now, by region),
                   prepare (the pool's SSH key, the user data), launch (a firewall ruleset
                   per region, one launch for every node), describe, delete

plus ``inventory.py``, ``scope.py`` and ``credentials.py`` (``skyward ls`` / ``down``,
``skyward doctor``).
"""

from skyward.providers.lambdacloud.options import Lambda

__all__ = ["Lambda"]
