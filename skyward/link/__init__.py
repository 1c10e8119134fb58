"""The wire between the client and a worker, both ends: frames and every message
(``protocol``), the client's end of one link (``channel``), who reads a link next
(``turns``, used by both ends), and how functions are pickled for it (``pickling``).

Nothing here imports the pool, the console or a provider: the worker imports this package.
"""
