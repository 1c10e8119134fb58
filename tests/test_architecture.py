"""The shape of the package: packages by side of the wire, no import circles, SDKs at the
edges, and what a real worker process loads for a call.

Every import counts, those inside functions too: a circle closed by a function-level import
is still a circle a reader has to hold in their head, and a worker module that imports the
pool inside a function still loads the client's side on the node.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "skyward"

# The client's side of the wire: none of it may be loaded on a worker. ``skyward.client``
# holds the client's leaves (futures, Ctrl-C's hold, the operators, ...).
CLIENT_SIDE = (
    "skyward.pool",
    "skyward.console",
    "skyward.providers",
    "skyward.cli",
    "skyward.client",
)
# The node's side (what it loads of skyward.link is checked with it).
NODE_SIDE = ("skyward.worker",)
# The leaves at the top that both sides load: they may reach neither side's packages.
SHARED_LEAVES = ("skyward._errors", "skyward._info", "skyward._plugin", "skyward._image")
# Modules at the top that users name by their path: the public surface, not a side.
PUBLIC_MODULES = ("skyward.accelerators", "skyward.api", "skyward.metrics")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent / dotted.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports(path: Path) -> set[str]:
    """Skyward modules ``path`` imports anywhere: module level, ``if TYPE_CHECKING:`` blocks
    (a circle through annotations is still a circle) and inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("skyward"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("skyward"):
            assert node.module is not None
            for alias in node.names:  # `from skyward.link import protocol` names a module
                child = f"{node.module}.{alias.name}"
                found.add(child if _is_module(child) else node.module)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in _imports(path) if m in modules} for name, path in modules.items()}
    # The package's __init__ imports its public names lazily; its TYPE_CHECKING block is for
    # type checkers only and names every module, so it is left out of the graph. The same
    # holds for the plugins' package.
    graph["skyward"] = set()
    graph["skyward.plugins"] = set()
    for name in graph:
        graph[name].discard(name)
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


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(graph[name])
        # Importing a.b.c runs a/__init__ and a/b/__init__ first.
        parent = name.rpartition(".")[0]
        if parent and parent in graph:
            todo.append(parent)
    return seen


def _on_side(name: str, side: tuple[str, ...]) -> bool:
    return any(name == s or name.startswith(s + ".") for s in side)


def test_no_module_imports_itself_through_a_circle() -> None:
    assert _cycles(_graph()) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_circle_check_counts_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from skyward.pool import ComputePool\n")
    assert _imports(module) == {"skyward.pool"}


def test_the_worker_side_loads_nothing_of_the_clients_side() -> None:
    graph = _graph()
    for name in graph:
        if _on_side(name, NODE_SIDE):
            client = {m for m in _reachable(graph, name) if _on_side(m, CLIENT_SIDE)}
            assert client == set(), f"{name} loads the client's {sorted(client)}"


def test_the_shared_leaves_load_neither_sides_packages() -> None:
    graph = _graph()
    for name in SHARED_LEAVES:
        sided = {m for m in _reachable(graph, name) if _on_side(m, CLIENT_SIDE + NODE_SIDE)}
        assert sided == set(), f"{name}, which both sides load, loads {sorted(sided)}"


def test_the_worker_side_never_imports_the_clients_leaves() -> None:
    # Named one by one, so that moving one of them out of skyward.client (back to the top,
    # say) is caught too, and not only an import of the package.
    leaves = {_module_name(p) for p in (PACKAGE / "client").glob("*.py")} - {"skyward.client"}
    assert {"skyward.client.futures", "skyward.client.interrupts"} <= leaves
    graph = _graph()
    for name in graph:
        if _on_side(name, NODE_SIDE):
            found = leaves & _reachable(graph, name)
            assert found == set(), f"{name} loads the client's leaves {sorted(found)}"


def test_modules_live_in_packages_by_side_of_the_wire() -> None:
    # Only the leaves both sides share, and the public modules users name by path, stay at
    # the top: the rest is in a package whose path says which process runs it.
    top = {f"skyward.{p.stem}" for p in PACKAGE.glob("*.py")} - {"skyward.__init__"}
    assert top == {*SHARED_LEAVES, *PUBLIC_MODULES}, sorted(top)


def test_providers_do_not_import_the_pool_or_the_display() -> None:
    graph = _graph()
    for name, imported in graph.items():
        if name.startswith("skyward.providers"):
            assert not {m for m in imported if _on_side(m, ("skyward.pool", "skyward.console"))}, (
                name
            )


def test_importing_skyward_and_its_providers_imports_no_sdk() -> None:
    code = (
        "import sys, skyward, skyward.providers.ssh, skyward.providers.local, "
        "skyward.providers.base, skyward.providers.aws, skyward.pool\n"
        "print(sorted(m for m in ('paramiko', 'boto3', 'jax', 'google.cloud', 'azure') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# What a real worker process has loaded when it runs a call: a user's script (its functions
# travel by value), one Local pool, the worker's sys.modules read from inside each call.
_WORKER_PROBE = """
import json, sys
import skyward as sky

@sky.compute
def plain():
    import sys
    return sorted(sys.modules)

@sky.compute
@sky.stdout(only="head")
def muted():
    import sys
    return sorted(sys.modules)

with sky.ComputePool(nodes=1) as pool:
    loaded = {"plain": plain() >> pool}
with sky.ComputePool(nodes=1) as pool:  # a fresh worker: what the muted call alone loads
    loaded["muted"] = muted() >> pool
print(json.dumps(loaded))
"""


def _loaded_on_a_worker(tmp_path: Path) -> dict[str, list[str]]:
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(_WORKER_PROBE))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    )
    loaded: dict[str, list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_a_worker_loads_nothing_of_the_clients_side_nor_pydantic_for_a_call(
    tmp_path: Path,
) -> None:
    loaded = _loaded_on_a_worker(tmp_path)
    assert set(loaded) == {"plain", "muted"}
    for call, modules in loaded.items():
        assert "skyward.worker" in modules, call  # it did run on a worker
        client = [m for m in modules if _on_side(m, CLIENT_SIDE)]
        assert client == [], f"a {call} call loaded {client}"
        # The user's code imports no pydantic, so neither does the worker: InstanceInfo
        # is a dataclass, and a pool without plugins loads no Plugin.
        assert [m for m in modules if _on_side(m, ("pydantic", "pydantic_core"))] == [], call
    assert "skyward.worker.output" in loaded["muted"]
