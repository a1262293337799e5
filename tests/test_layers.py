"""The package's layers and their one-way data flow, read from the source (ast: nothing is imported or run).

    cpp_build, files, settings, stand_ins  <-  device  <-  compiler, distributed  <-  nki  <-  kernels  <-  models  <-  profile, finetune, check  <-  apps  <-  cli

A module may import from its own layer and the layers below it, never above; and no module imports itself back
through others (no import cycle), counting imports inside functions too: a lazy import only hides a cycle.
What another layer needs is public there: no module uses another layer's underscore names (its `_private`
modules included: each layer keeps its own private PyTorch calls).
"""

from __future__ import annotations

import ast
import pathlib
import re

import nativelab

ROOT = pathlib.Path(nativelab.__file__).parent
LAYERS = [
    {"cpp_build", "files", "private_dir", "settings", "stand_ins"},  # utilities any layer may use: C++ extensions,
    # atomic files, cache directories only this user can write, the environment's settings, stand-ins
    {"device"},
    {"compiler", "distributed"},
    {"nki"},
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


def _from_target(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names."""
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(mod: str, path: pathlib.Path, is_pkg: bool, mods) -> set[str]:
    """The nativelab modules `mod` imports, anywhere in its file (`from x import y` counts as x.y when y is a
    module, as x otherwise)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "nativelab"}
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(mod, is_pkg, node)
            if target.split(".")[0] == "nativelab":
                out |= {f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names}
    return out


def _underscore_uses(mod: str, source: str, is_pkg: bool, mods) -> list[str]:
    """Another layer's underscore names that `mod` imports (`from x import _y`) or reads (`x._y`, x a module
    of another layer imported under some name)."""
    tree = ast.parse(source)
    here, found, modules = _layer(mod), [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(mod, is_pkg, node)
            if target.split(".")[0] != "nativelab":
                continue
            for a in node.names:
                full = f"{target}.{a.name}"
                if _layer(full if full in mods else target) == here:
                    continue
                if a.name.startswith("_"):
                    found.append(f"{mod}: from {target} import {a.name}")
                if full in mods:
                    modules[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            modules.update({a.asname: a.name for a in node.names
                            if a.asname and a.name.split(".")[0] == "nativelab" and _layer(a.name) != here})
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{mod}: {modules[node.value.id]}.{node.attr}")
    return found


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
            if src is None:  # the root package registers the device, its process-group backend and the route of
                # torch.compile's default backend to the device's (compiler/default_backend.py), no more
                if dst not in (None, "device", "distributed", "compiler"):
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


def test_no_layer_uses_another_layers_underscore_names():
    mods = _modules()
    found = [u for m, (path, is_pkg) in mods.items() for u in _underscore_uses(m, path.read_text(), is_pkg, mods)]
    assert not found, "make these public in their own layer:\n" + "\n".join(sorted(found))


def _private_torch_uses(source: str) -> list[str]:
    """`torch._*` names a module imports or reads."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch._"):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.startswith("torch._")]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch"
              and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"torch.{node.attr}")
    return found


def test_private_pytorch_apis_stay_behind_each_layers_fence():
    """In every layer, the device included, only a layer's `_private.py` touches `torch._*`; each of those
    has canaries in tests/test_private_apis.py."""
    found = [f"{m}: {u}" for m, (path, _) in _modules().items()
             if _layer(m) is not None and not m.endswith("._private")
             for u in _private_torch_uses(path.read_text())]
    assert not found, "move these into the layer's _private.py (with a canary):\n" + "\n".join(sorted(found))


def _torch_private_names() -> frozenset[str]:
    """The private (single-underscore) attribute names of the torch objects nativelab handles, classes and
    instances alike (an OpOverload's `_schema`, a Module's `_parameters`, a tensor's `_version`, a process
    group's `_get_backend_name`)."""
    import torch
    import torch.distributed as dist
    import torch.fx

    graph = torch.fx.Graph()
    module = torch.nn.Linear(1, 1)
    things = [
        torch, torch.Tensor, torch.ones(1), torch.ones(1).untyped_storage(), torch.nn.Parameter(torch.ones(1)),
        torch.nn.Module, module, torch.fx.GraphModule(module, graph), graph, graph.placeholder("x"),
        torch.ops.aten.add, torch.ops.aten.add.Tensor, torch.Generator(), torch.device("cpu"), torch.float32,
        torch.optim.SGD(module.parameters(), lr=0.1), torch.autograd.Function, dist.ProcessGroup, dist.Backend,
    ]
    return frozenset(n for t in things for n in dir(t) if n.startswith("_") and not n.startswith("__"))


def _own_private_names(sources) -> frozenset[str]:
    """Private names nativelab defines itself (methods, class and instance attributes, `__slots__`), outside
    subclasses of torch classes: `obj._name` of one of them is nativelab's own."""
    own = set()
    for source in sources:
        tree = ast.parse(source)
        torch_names = _torch_imports(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not _subclasses_torch(node, torch_names):
                for b in node.body:
                    if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        own.add(b.name)
                    elif isinstance(b, ast.Assign):
                        own |= {t.id for t in b.targets if isinstance(t, ast.Name)}
                        if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in b.targets):
                            own |= {c.value for c in ast.walk(b.value) if isinstance(c, ast.Constant)}
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id == "self"):
                own.add(node.attr)
    return frozenset(n for n in own if isinstance(n, str) and n.startswith("_"))


def _torch_imports(tree) -> set[str]:
    """Names a module binds to torch modules and objects (`torch`, `dist`, `OpOverload`, ...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch" and not node.level:
            names |= {a.asname or a.name for a in node.names}
    return names


def _subclasses_torch(cls: ast.ClassDef, torch_names: set[str]) -> bool:
    def root(e):
        while isinstance(e, ast.Attribute):
            e = e.value
        return e.id if isinstance(e, ast.Name) else None

    return any(root(b) in torch_names for b in cls.bases)


def _private_torch_members(source: str, private: frozenset[str]) -> list[str]:
    """Private members of torch objects a module reads, calls or defines: `x._name` and `getattr(x, "_name")`
    with `_name` one of torch's (`private`), and private-named methods of a subclass of a torch class (which
    PyTorch calls by that name). ATen op names (`aten._to_copy`) are operators, not members."""
    tree = ast.parse(source)
    torch_names = _torch_imports(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private:
            v = node.value
            if isinstance(v, ast.Name) and v.id in ("self", "cls", "aten"):
                continue
            if ast.unparse(v).startswith("torch.ops") or (isinstance(v, ast.Name) and v.id == "torch"):
                continue  # an operator; `torch._x` is the import check's
            found.append(f"{ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in private):
            found.append(ast.unparse(node))
        elif isinstance(node, ast.ClassDef) and _subclasses_torch(node, torch_names):
            for b in node.body:
                names = [b.name] if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
                    [t.id for t in b.targets if isinstance(t, ast.Name)] if isinstance(b, ast.Assign) else []
                found += [f"class {node.name}: {n}" for n in names if n in private]
    return found


def test_private_members_of_torch_objects_stay_behind_each_layers_fence():
    """Private methods and attributes of torch objects (`op._schema`, `t._version`, a process group's
    `_get_backend_name`) only in a layer's `_private.py`, anywhere under src/, the device included."""
    mods = _modules()
    sources = {m: path.read_text() for m, (path, _) in mods.items()}
    private = _torch_private_names() - _own_private_names(sources.values())
    found = [f"{m}: {u}" for m, src in sources.items() if not m.endswith("._private")
             for u in _private_torch_members(src, private)]
    assert not found, "move these into the layer's _private.py (with a canary):\n" + "\n".join(sorted(found))


def test_the_walker_sees_imports_and_cycles():
    """The checks above can fail: the walker finds known edges, and a planted cycle."""
    graph = _graph()
    assert "nativelab.device.memory" in graph["nativelab.compiler.runtime"]
    assert "nativelab.kernels.ops" in graph["nativelab.models.llama.generate"]
    assert "nativelab.apps.run" in graph["nativelab.cli"]  # an import inside a function counts
    planted = {**graph, "nativelab.device.memory": graph["nativelab.device.memory"] | {"nativelab.compiler.runtime"}}
    assert any("nativelab.device.memory" in c for c in _cycles(planted))
    mods = _modules()
    assert _private_torch_uses("import torch._dynamo\nfrom torch._ops import OpOverload\nx = torch._C\ny = torch.ops\n") == [
        "import torch._dynamo", "from torch._ops import ...", "torch._C"]
    planted_source = "from ..device.dispatch import _to_host\nfrom ..device import dispatch as o\nx = o._scalars\ny = o.DEVICE\n"
    private = _torch_private_names()
    assert {"_schema", "_version", "_parameters", "_get_backend_name", "_allgather_base", "_neg_view"} <= private
    planted_members = (
        "import torch.distributed as dist\n"
        "n = op._schema.name\nv = t._version\ns = getattr(node.target, '_schema', None)\nc = aten._to_copy\n"
        "class G(dist.ProcessGroup):\n    def _get_backend_name(self):\n        return self._gloo\n"
        "class Own:\n    def _get_backend_name(self):\n        return 1\n"
    )
    assert sorted(_private_torch_members(planted_members, private)) == [
        "class G: _get_backend_name", "getattr(node.target, '_schema', None)", "op._schema", "t._version"]
    assert _underscore_uses("nativelab.compiler.example", planted_source, False, mods) == [
        "nativelab.compiler.example: from nativelab.device.dispatch import _to_host",
        "nativelab.compiler.example: nativelab.device.dispatch._scalars",
    ]


# -- the environment: read in one module, never written ----------------------------------------------------------

SETTINGS = "nativelab.settings"  # the one module that reads nativelab's environment variables
_ENV_WRITES = {"setdefault", "pop", "popitem", "update", "clear", "__setitem__", "__delitem__"}


def _environment_uses(source: str, declared: set[str]) -> tuple[list[str], list[str]]:
    """(reads, writes) of the environment in a module's source. Reads: a declared setting's name written out
    (whoever holds the name can read it), and any read of `os.environ` / `os.getenv` by a key that is not
    written out (a name passed in: it may be a setting's). Writes: any assignment or deletion of an
    environment item, a mutating `os.environ` method, `os.putenv` / `os.unsetenv`."""
    tree = ast.parse(source)
    aliases = {"environ": set(), "getenv": set(), "putenv": set(), "unsetenv": set()}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            for a in node.names:
                if a.name in ("environ", "environb"):
                    aliases["environ"].add(a.asname or a.name)
                elif a.name in aliases:
                    aliases[a.name].add(a.asname or a.name)

    def is_os(node, what: str) -> bool:
        names = ("environ", "environb") if what == "environ" else (what,)
        return ((isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name)
                 and node.value.id == "os") or (isinstance(node, ast.Name) and node.id in aliases[what]))

    def passed_in(node) -> bool:  # a key written out is checked as a constant (below)
        return not (isinstance(node, ast.Constant) and isinstance(node.value, str))

    reads, writes = [], []
    for node in ast.walk(tree):
        line = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value in declared or re.fullmatch(r"NATIVELAB_[A-Z0-9_]+", node.value)):
            reads.append(f"{line}: {node.value!r}")
        elif isinstance(node, ast.Call) and node.args and (
                is_os(node.func, "getenv") or (isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                                               and is_os(node.func.value, "environ"))):
            if passed_in(node.args[0]):
                reads.append(f"{line}: {ast.unparse(node)} (a key passed in)")
        elif isinstance(node, ast.Subscript) and is_os(node.value, "environ"):
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                writes.append(f"{line}: {ast.unparse(node)}")
            elif passed_in(node.slice):
                reads.append(f"{line}: {ast.unparse(node)} (a key passed in)")
        elif isinstance(node, ast.Compare) and any(is_os(c, "environ") for c in node.comparators):
            if passed_in(node.left):
                reads.append(f"{line}: {ast.unparse(node)} (a key passed in)")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            writes += [f"{line}: {ast.unparse(t)} = ..." for t in targets if is_os(t, "environ")]
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in _ENV_WRITES and is_os(f.value, "environ"):
                writes.append(f"{line}: {ast.unparse(node)}")
            elif is_os(f, "putenv") or is_os(f, "unsetenv"):
                writes.append(f"{line}: {ast.unparse(node)}")
    by_line = lambda text: int(text.split(":")[0].split()[1])  # noqa: E731
    return sorted(reads, key=by_line), sorted(writes, key=by_line)


def _declared() -> set[str]:
    from nativelab import settings

    return {v.name for v in settings.VARIABLES}


def test_settings_are_read_only_in_the_settings_module():
    """Every variable nativelab reads is named, parsed and validated in `settings.py` (device/config.py builds
    the device's Config from it); no other module reads one, or holds a name it could read one by."""
    declared = _declared()
    found = [f"{m}: {r}" for m, (path, _) in _modules().items() if m != SETTINGS
             for r in _environment_uses(path.read_text(), declared)[0]]
    assert not found, "read these through nativelab.settings (declare new ones there):\n" + "\n".join(sorted(found))


def test_nothing_under_src_writes_the_environment():
    """A mode is an override in settings (`Variable.set`), never a write to os.environ: a write would leak
    into every child process started after it."""
    found = [f"{m}: {w}" for m, (path, _) in _modules().items() for w in _environment_uses(path.read_text(), set())[1]]
    assert not found, "no writes to os.environ (use a settings override):\n" + "\n".join(sorted(found))


def test_cpp_reads_no_environment():
    """The C++ runtime and kernels take their settings from Python (at install or bind time)."""
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in sorted(ROOT.rglob("*")) if p.suffix in (".cpp", ".cc", ".h", ".hpp")
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\b(secure_)?getenv\b", line)]
    assert not found, "pass these settings from Python instead:\n" + "\n".join(found)


def test_every_variable_the_code_names_is_declared():
    """A NATIVELAB_ variable named in a message, a docstring or a comment (Python or C++) is one settings.py
    declares: a renamed or dropped variable leaves no stale advice behind."""
    declared = _declared()
    named = {}
    for p in sorted(ROOT.rglob("*")):
        if p.suffix in (".py", ".cpp", ".cc", ".h", ".hpp"):
            for name in re.findall(r"\bNATIVELAB_[A-Z0-9_]+", p.read_text()):
                named.setdefault(name, str(p.relative_to(ROOT)))
    stale = {n: where for n, where in named.items() if n not in declared}
    assert not stale, f"not a setting (declare it in settings.py, or fix the text): {stale}"


def test_the_environment_checks_can_fail():
    declared = {"NATIVELAB_SYNC", "NEURON_RT_NUM_CORES"}
    planted = (
        "import os\nfrom os import environ as env, putenv\n"
        "a = os.environ.get('NATIVELAB_SYNC')\n"  # a setting read here
        "b = os.getenv(name)\n"  # a key passed in
        "c = env['NEURON_RT_NUM_CORES']\n"
        "d = 'LOCAL_RANK' in os.environ\n"  # another tool's variable: fine
        "e = os.environ.get('WORLD_SIZE', '1')\n"  # fine
        "ENV = 'NATIVELAB_CACHE_DIR'\n"  # a name held
        "msg = f'NATIVELAB_SYNC=1 makes {x} synchronous'\n"  # a message naming one: fine
        "os.environ['X'] = '1'\n"
        "del env['X']\n"
        "os.environ.setdefault('X', '1')\n"
        "os.environ.update(X='1')\n"
        "putenv('X', '1')\n"
        "os.unsetenv('X')\n"
        "child = dict(os.environ, X='1')\n"  # a child's own environment: fine
    )
    reads, writes = _environment_uses(planted, declared)
    assert [r.split(":")[0] for r in reads] == ["line 3", "line 4", "line 5", "line 8"], reads
    assert [w.split(":")[0] for w in writes] == ["line 10", "line 11", "line 12", "line 13", "line 14", "line 15"], \
        writes



# -- the device's state: one object ------------------------------------------------------------------------------

DEVICE_STATE = "nativelab.device.state"  # the Device object: the runtime handle and every setting
RUNTIME_LOADER = "nativelab.device.runtime"  # builds and loads the runtime (its load-once cache)


def _state_names() -> set[str]:
    from nativelab.device.state import Device

    return {n for n in Device.__slots__ if not n.startswith("_")} | {"_rt", "sync_mode"}


def _state_copies(source: str, names: set[str]) -> list[str]:
    """Where a module keeps device state of its own: a module-level name (assigned at the top level or through
    `global`) that is named as a setting or the runtime handle, or whose value is read from the runtime
    (`....rt`, `rt`, `runtime.load()`); and any other way to the runtime than the Device object
    (`runtime.load()` / `runtime.loaded()`)."""
    tree = ast.parse(source)

    def from_runtime(value) -> bool:
        for n in ast.walk(value):
            if (isinstance(n, ast.Attribute) and n.attr == "rt") or (isinstance(n, ast.Name) and n.id in ("rt", "_rt")):
                return True
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("load", "loaded")
                    and isinstance(n.func.value, ast.Name) and n.func.value.id == "runtime"):
                return True
        return False

    def assigned(stmt):
        """(target names, value) of an assignment statement."""
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            targets = [stmt.target]
        else:
            return [], None
        out = []
        for t in targets:
            out += [n.id for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        return out, stmt.value

    found = []
    for stmt in tree.body:  # the module's own names
        targets, value = assigned(stmt)
        for name in targets:
            if name in names or (value is not None and from_runtime(value)):
                found.append(f"line {stmt.lineno}: {name} (module level)")
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        declared = {n for g in ast.walk(fn) if isinstance(g, ast.Global) for n in g.names}
        for stmt in ast.walk(fn):
            targets, value = assigned(stmt)
            for name in set(targets) & declared:
                if name in names or (value is not None and from_runtime(value)):
                    found.append(f"line {stmt.lineno}: {name} (global in {fn.name})")
    for n in ast.walk(tree):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("load", "loaded")
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "runtime"):
            found.append(f"line {n.lineno}: {ast.unparse(n)} (the handle is state.device.rt)")
    return sorted(set(found), key=lambda f: int(f.split()[1].rstrip(":")))


def test_no_device_module_keeps_its_own_copy_of_the_runtime_or_a_setting():
    """The runtime handle and every setting of the device live in one object (device/state.py's Device, built
    by register() from Config); the other modules of device/ read it there."""
    names = _state_names()
    found = [f"{m}: {c}" for m, (path, _) in _modules().items()
             if m.startswith("nativelab.device.") and m not in (DEVICE_STATE, RUNTIME_LOADER)
             for c in _state_copies(path.read_text(), names)]
    assert not found, "read these from nativelab.device.state.device:\n" + "\n".join(sorted(found))


def test_the_state_copy_check_can_fail():
    names = {"sync", "num_cores", "_rt", "sync_mode"}
    planted = (
        "from . import runtime, state\n"
        "num_cores = 4\n"  # a setting's copy
        "_adopt = None\n"  # fine until a function stores the runtime's entry in it
        "_cache: dict = {}\n"  # fine
        "def init(rt):\n"
        "    global _rt, _adopt, _seen\n"
        "    _rt = rt\n"
        "    _adopt = state.device.rt.mem_adopt\n"
        "    _seen = True\n"  # a module's own state, not the device's: fine
        "def f():\n"
        "    sync = state.device.sync\n"  # a local: fine
        "    return runtime.load()\n"
    )
    assert [c.split(":")[0] for c in _state_copies(planted, names)] == ["line 2", "line 7", "line 8", "line 12"], \
        _state_copies(planted, names)
