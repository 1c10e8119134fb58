"""The shape of the package: no import circles, small modules, SDKs at the edges."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "skyward"
MAX_LINES = 450  # "about 400": the closing notes name a module that needs more, and why


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Skyward modules imported at module level, ``if TYPE_CHECKING:`` blocks included
    (a circle through annotations is still a circle); imports inside functions are not."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("skyward"))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("skyward"):
                assert node.module is not None
                for alias in node.names:  # `from skyward import _protocol` names a module
                    child = f"{node.module}.{alias.name}"
                    found.add(
                        child
                        if (PACKAGE.parent / child.replace(".", "/")).with_suffix(".py").exists()
                        else node.module
                    )
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(tree.body)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in _imports(path) if m in modules} for name, path in modules.items()}
    # The package's __init__ imports its public names lazily; its TYPE_CHECKING block is for
    # type checkers only and names every module, so it is left out of the graph.
    graph["skyward"] = set()
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    return cycles


def test_no_module_imports_itself_through_a_circle() -> None:
    assert _cycles(_graph()) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_is_much_over_400_lines() -> None:
    sizes = {
        p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines())
        for p in PACKAGE.rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_providers_do_not_import_the_pool_or_the_display() -> None:
    graph = _graph()
    for name, imported in graph.items():
        if name.startswith("skyward.providers"):
            assert not imported & {"skyward._pool", "skyward._console", "skyward._progress"}, name


def test_importing_skyward_and_its_providers_imports_no_sdk() -> None:
    code = (
        "import sys, skyward, skyward.providers.ssh, skyward.providers.local, "
        "skyward.providers.base, skyward._pool\n"
        "print(sorted(m for m in ('paramiko', 'boto3', 'jax', 'google.cloud', 'azure') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
