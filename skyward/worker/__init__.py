"""The node's side: ``python -m skyward.worker --node N``, one long-lived process per node.

``__main__`` reads calls and runs them; ``link`` is its end of the wire; ``calls`` runs one
call; ``processes`` the child processes of ``executor="process"``; ``relay`` forwards a
broadcast's payload to the next node; ``hooks`` what plugins can reach on a worker. What
user code runs on a node lives here too: ``output`` (``@sky.stdout``, ``sky.is_head``),
``multihost`` (``sky.shard``, ``jax_gather``) and ``chunks`` (a map's chunk).

It imports only ``skyward.link``'s shared modules, the leaves every side shares
(``skyward._errors``, ``_info``, ``_plugin``, ``_image``), the collections' proxies, and the
standard library; never ``skyward.client`` nor the client's packages;
``tests/test_architecture.py`` enforces that.
"""
