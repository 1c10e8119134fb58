"""The client's leaves: small pieces the pool, the providers, the channel and the operators
share on the client, and no worker loads.

``compute`` (``@sky.compute`` and the operators) and ``current`` (the pool ``f(x) >> sky``
goes to); ``futures`` (settling and waiting), ``interrupts`` (Ctrl-C held back while the
books change) and ``shield`` (a clean-up a Ctrl-C does not cut in half); ``options``
(keyword options spelled once), ``extras`` (optional imports that name their extra),
``phases`` (what a starting node is doing, as the console is told) and ``volume``
(``sky.Volume``).

A package of its own, not a part of ``pool/``: ``providers/`` use these too, and the pool
imports the providers, so they could not live in either without a circle.
``tests/test_architecture.py`` checks that nothing the worker loads reaches them.
"""
