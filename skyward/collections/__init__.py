"""Distributed collections (``sky.dict``, ``sky.counter``, ...): the proxies users hold on the
client and on workers (``proxies``), and their state, kept in the client's pool (``state``)."""
