"""Providers create and destroy nodes; see ``base.py`` for the contract."""
