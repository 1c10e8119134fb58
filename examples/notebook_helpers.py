"""A helper module next to the notebook: workers on other machines cannot import it, so
Skyward ships it to them by value (see docs/notebooks.md)."""


def greeting(node: int) -> str:
    return f"hello from node {node}"
