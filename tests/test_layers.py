"""The package's layers and their one-way data flow, read from the source (ast: nothing is imported or run).

    cpp_build  <-  device  <-  compiler, distributed  <-  kernels  <-  models  <-  profile, finetune, check  <-  apps  <-  cli

A module may import from its own layer and the layers below it, never above; and no module imports itself back
through others (no import cycle), counting imports inside functions too: a lazy import only hides a cycle.
"""

from __future__ import annotations

import ast
import pathlib

import nativelab

ROOT = pathlib.Path(nativelab.__file__).parent
LAYERS = [
    {"cpp_build"},  # building C++ extensions: a utility any layer may use (issue 15)
    {"device"},
    {"compiler", "distributed"},
    {"kernels"},
    {"models"},
    {"profile", "finetune", "check"},
    {"apps"},
    {"cli"},
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def _imports(mod: str, path: pathlib.Path, is_pkg: bool, mods) -> set[str]:
    """The nativelab modules `mod` imports, anywhere in its file (`from x import y` counts as x.y when y is a
    module, as x otherwise)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "nativelab"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "nativelab":
                out |= {f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names}
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, path, is_pkg, mods) for m, (path, is_pkg) in mods.items()}


def _layer(mod: str) -> str | None:
    """The layer a module belongs to; None for the root package (its __init__ registers the device)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_subpackage_has_a_layer():
    unplaced = {_layer(m) for m in _graph()} - set(RANK) - {None}
    assert not unplaced, f"place these in LAYERS (and in CONTRIBUTING.md): {sorted(unplaced)}"


def test_no_import_from_a_higher_layer():
    wrong = []
    for mod, targets in _graph().items():
        src = _layer(mod)
        for t in targets:
            dst = _layer(t)
            if src is None:  # the root package registers the device and its process-group backend, no more
                if dst not in (None, "device", "distributed"):
                    wrong.append(f"{mod} -> {t}")
            elif dst is not None and RANK[dst] > RANK[src]:
                wrong.append(f"{mod} ({src}) -> {t} ({dst})")
    assert not wrong, "imports from a higher layer:\n" + "\n".join(sorted(wrong))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert not _cycles(_graph())


def test_the_walker_sees_imports_and_cycles():
    """The checks above can fail: the walker finds known edges, and a planted cycle."""
    graph = _graph()
    assert "nativelab.device.memory" in graph["nativelab.compiler.runtime"]
    assert "nativelab.kernels.ops" in graph["nativelab.models.llama.model"]
    assert "nativelab.apps.run" in graph["nativelab.cli"]  # an import inside a function counts
    planted = {**graph, "nativelab.device.memory": graph["nativelab.device.memory"] | {"nativelab.compiler.runtime"}}
    assert any("nativelab.device.memory" in c for c in _cycles(planted))
