"""What the clouds share, with no cloud SDK: everything a cloud provider does alike, so that
each cloud's package holds only its SDK's calls and the mapping to them.

::

    options.py     CloudOptions: the options every cloud has (spot, ssh_cidr, connect, the
                   bounds), the strategy, the catalog's machines, the price check, the pool's
                   keys and boot config; sky.AWS, sky.GCP and sky.Azure build on it
    allocation.py  CloudAllocation: what a pool made, recorded as it is made; release once,
                   replace a lost machine, reach the machines while watching them end;
                   "create, then open, or destroy" (open_or_destroy)
    instances.py   InstanceAllocation: machines made one create each, under names chosen
                   first (GCP, Azure); the cloud gives its calls on one machine
    inventory.py   CloudInventory: leftovers by tag, deleted by place and kind
    api.py         the shared half of every SDK boundary: one call translated, one wait
                   loop, the refusal codes' table and its words
    boot.py        the #cloud-config user data: the host key the client made, the login key,
                   the idle watchdog; the frame of the script that deletes a machine
    capacity.py    offers (type, zone, market, price) in the strategy's order; the failover
    catalog.py     accelerators -> machine types per cloud, with their facts and prices
    prices.py      the dated on-demand price table, per cloud, type and region
    keys.py        pool keys left on this machine (``skyward ls`` / ``down``)
"""
