"""What the clouds share, with no cloud SDK: the contract a cloud writes, and everything done
alike around it, so that each cloud's folder holds only its options, its SDK's calls and
the contract's calls (``<cloud>/options.py``, ``api.py``, ``machines.py``).

::

    contract.py    the calls a cloud writes (offers, prepare, launch, describe, discard,
                   delete) and what they answer with (Offers, Described, Reach), documented
    start.py       the one start: offers -> keys and boot payload -> prepare -> failover ->
                   launch -> wait running -> reach, open or destroy; CloudPool, the
                   allocation (replace a lost machine, say why one ended, release once)
    record.py      what a pool made, as it is made: one lock, the only writer
    options.py     CloudOptions: the options every cloud has (spot, ssh_cidr, connect, the
                   bounds), the strategy, the catalog's machines, the price check
    boot.py        the boot payload (Boot): the host key the client made, the login key,
                   the idle watchdog and its last act; as cloud-init user data or as a
                   start script; the frame of the script that deletes a machine
    api.py         the shared half of every SDK boundary: one call translated, one wait
                   loop, the refusal codes' table and its words
    inventory.py   CloudInventory: leftovers by tag, deleted by place and kind
    capacity.py    offers (type, zone, market, price) in the strategy's order; the failover
    catalog.py     accelerators -> machine types per cloud, with their facts and prices
    keys.py        pool keys left on this machine (``skyward ls`` / ``down``)
"""
