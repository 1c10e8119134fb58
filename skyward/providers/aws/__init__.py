"""``AWS(...)``: nodes are EC2 instances that the pool creates and always destroys.

A cloud of three modules around the start every cloud shares (``cloud/start.py``)::

    options.py     sky.AWS: region, instance type, image, network, spot, EFA, the instance
                   profile; checked when the pool is built
    api.py         boto3's clients, EC2's errors in our words, spot prices, EFA cards; the
                   pool's resources: key pair, security group, run_instances, deletion
    machines.py    the contract's calls: offers (zones with a subnet offering each type),
                   prepare (image, key pair, security group), launch (one run_instances),
                   describe, delete (with a sweep by tag)

plus ``inventory.py``, ``scope.py`` and ``credentials.py`` (``skyward ls`` / ``down`` in
every enabled region, ``skyward doctor``). boto3 is imported only when a pool uses AWS.
"""

from skyward.providers.aws.options import AWS

__all__ = ["AWS"]
