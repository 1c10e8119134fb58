"""Vast.ai: the REST API v0 fake (``fake``); stand-in hosts booted from the rented start
command, and the pool helpers (``standins``)."""
