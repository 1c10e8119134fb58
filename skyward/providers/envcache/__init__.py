"""The environment cache: a node's built environment kept in an object store
(``Image(cache=...)``), so that later bootstraps download it instead of installing.

``store.py`` speaks to the stores and runs on the nodes (the bootstrap carries it);
``turns.py`` lets one node of a pool build a missing entry while the others wait for it.
"""
