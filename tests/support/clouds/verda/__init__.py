"""Verda: the REST API fake (``fake``); stand-ins and the pool helpers (``standins``)."""
