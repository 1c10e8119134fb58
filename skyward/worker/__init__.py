"""The node's side: ``python -m skyward.worker --node N``, one long-lived process per node.

``__main__`` reads calls and runs them; ``link`` is its end of the wire; ``calls`` runs one
call; ``processes`` the child processes of ``executor="process"``; ``relay`` forwards a
broadcast's payload to the next node; ``hooks`` what plugins can reach on a worker.

It imports only ``skyward.link``, the leaves every side shares (``skyward._errors``,
``_info``, ``_plugin``...), the collections' proxies, and the standard library;
``tests/test_architecture.py`` enforces that.
"""
