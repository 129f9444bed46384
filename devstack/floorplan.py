"""The floor plan of `shared/`, drawn from its imports: `make floorplan`.

Prints the figures the remodel is judged by — modules loose at the top of `shared/`, the
largest file, functions over 60 lines, import circles between modules, and arrows that run
from a lower wing up to a higher one — then the wing-to-wing arrows themselves. Imports
inside functions count: a lazy import that only hides a circle from the interpreter is still
a circle in the design. `tests/test_floorplan.py` holds the circles and arrows at zero.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LONG_FUNCTION_LINES = 60

# The wings from the ground up. A wing may import any wing listed before it (and itself);
# an import of a wing listed after it is an arrow running back up.
WINGS: tuple[str, ...] = (
    "core",
    "workflows",
    "normalize",
    "port",
    "accounts",
    "providers",
    "ingest",
    # Gates sit above blocks: a block declares its gates on its spec (`BlockSpec.gates`,
    # `target`, `price`, `landed_query` in blocks/base.py) and never calls one; the gates read
    # those declarations and refuse with the block contract's `BlockFailure`. Below triggers,
    # admission and steps, which use them (a poll's connection slot, the breaker, the executor).
    "blocks",
    "gates",
    "triggers",
    # steps below admission: admission decides an event and then drives the step engine (it
    # offers the event to parked waits through shared/steps/parks.py, whose guarded resume
    # is a step move and stays with the other step moves); steps never ask admission anything
    # (the echo markers both read live in ingest).
    "steps",
    "admission",
    "publishing",
    "sweep",
    "ops",
)


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. shared.core.db
    path: Path

    @property
    def wing(self) -> str:
        parts = self.name.split(".")
        return parts[1] if len(parts) > 2 or self.path.name == "__init__.py" else "(top level)"


def modules(root: Path = ROOT) -> list[Module]:
    found = []
    for path in sorted((root / "shared").rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append(Module(".".join(parts), path))
    return found


def imports_of(module: Module, known: set[str]) -> Iterator[str]:
    """Every module of `shared` this one imports, wherever in the file the import stands."""
    tree = ast.parse(module.path.read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _resolve(alias.name, known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield from _resolve(full if full in known else node.module, known)


def _resolve(name: str, known: set[str]) -> Iterator[str]:
    while name and name not in known:
        name = name.rpartition(".")[0]
    if name.startswith("shared."):
        yield name


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = modules(root)
    known = {m.name for m in mods}
    graph: dict[str, set[str]] = {}
    for m in mods:
        graph[m.name] = {
            t for t in imports_of(m, known) if t != m.name and not m.name.startswith(t + ".")
        }
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start, targets in graph.items():
        if start in index:
            continue
        work = [(start, iter(sorted(targets)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def wing_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else name


def upward_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a wing to a wing above it (or to a wing not in the plan at all)."""
    rank = {w: i for i, w in enumerate(WINGS)}
    arrows = []
    for source, targets in graph.items():
        for target in targets:
            a, b = wing_of(source), wing_of(target)
            if a == b or (a not in rank and source.count(".") == 1):
                continue
            if a not in rank or b not in rank or rank[b] > rank[a]:
                arrows.append((source, target))
    return sorted(arrows)


def long_functions(root: Path = ROOT) -> list[tuple[str, int]]:
    found = []
    for m in modules(root):
        for node in ast.walk(ast.parse(m.path.read_text("utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONG_FUNCTION_LINES:
                    found.append((f"{m.path.relative_to(root)}:{node.name}", length))
    return sorted(found, key=lambda item: -item[1])


def main(root: Path = ROOT) -> int:
    mods = modules(root)
    graph = import_graph(root)
    loose = [m for m in mods if m.path.parent == root / "shared" and m.path.name != "__init__.py"]
    largest = max(mods, key=lambda m: len(m.path.read_text("utf-8").splitlines()))
    long = long_functions(root)
    found_circles = circles(graph)
    arrows = upward_arrows(graph)
    print(f"modules under shared/            {len(mods)}")
    print(f"loose at shared/ top level       {len(loose)}")
    size = len(largest.path.read_text("utf-8").splitlines())
    print(f"largest file                     {largest.path.relative_to(root)} ({size} lines)")
    print(f"functions over {LONG_FUNCTION_LINES} lines           {len(long)}")
    print(f"import circles                   {len(found_circles)}")
    for c in found_circles:
        print("  circle: " + " ↔ ".join(c))
    print(f"arrows running back up           {len(arrows)}")
    for source, target in arrows:
        print(f"  up: {source} → {target}")
    wings: dict[str, set[str]] = defaultdict(set)
    for source, targets in graph.items():
        for target in targets:
            if wing_of(source) != wing_of(target):
                wings[wing_of(source)].add(wing_of(target))
    print("wing → wings it imports")
    for wing in sorted(wings, key=lambda w: WINGS.index(w) if w in WINGS else -1):
        print(f"  {wing:<12} → {', '.join(sorted(wings[wing]))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT))
