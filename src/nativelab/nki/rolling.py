"""A loop kept a loop in the compiled graph (issue 47): the recording pass (make_fx) traces the first three
iterations of a large nl.affine_range / nl.sequential_range loop (four, where iteration 0 differs), and, where
their graphs are one template whose integer constants move by a fixed step per iteration, records the
remaining iterations as one `rolled_loop` op over that template instead of tracing them: the template traced
once more as a graph of its own, its counter an input, which Inductor compiles once and the op calls once per
iteration on the launch's own tensors. What is compiled then does not grow with that loop's trip count (loops
inside its body are traced as written, in the template).

Nothing is guessed. The checking pass (pass 1, on meta tensors) ran every iteration; the rolled ones must have
issued the template's instructions at offsets that move by the same step (names, lines, engines, sizes, regions,
immediates); the first iteration that does not is traced as written, and so are all after it. After the
recording pass, the instructions it issued must be exactly pass 1's without the rolled iterations (so Python
state the kernel carried across iterations, an offset summed in a Python int, is caught), and nothing after a
rolled loop may use a value made inside its traced iterations. Any miss retraces the kernel with that loop
unrolled, as before this module.

A value carried from one iteration to the next is either a tensor the body writes in place (a kernel argument or
output, or a tile allocated before the loop: the graph's in-place ops on it) or a tile the body rebinds (pass 2
keeps a tile's value as an SSA value where it is written whole: nki/tensor.py), which the next iteration reads.
The body writes the first in place, its writes into them made as_strided views so that Inductor writes only
their regions (not a copy of the whole output per iteration, as torch's while_loop, which carries values
functionally, did: a warm launch of AWS's tensor_addition at 2048x4096 bf16 was 1.16x its unrolled one on one
thread of an AMD EPYC, and is 0.23x); the second it takes and returns (the op hands the last iteration's out);
everything else the body reads is an input it only reads."""

from __future__ import annotations

import collections
import hashlib
import operator

import torch

from . import trace
from ._private import (check_range, fx_graph, is_higher_order, is_view_op, proxy_node, trace_subgraph,
                       tracked_tensors, untracked)
from ._private import written_argument as _writes_arg

MIN_TRIP = 8  # a loop of fewer iterations is traced as written: four are traced anyway
MIN_ROLLED = 3  # ... and so is one that would roll fewer iterations than this
# a loop that issues fewer instructions than this (all its iterations) stays unrolled: its compile is short
# enough, its matmul chains stay fused across iterations (nki/fusion.py), and its launches pay no
# per-iteration dispatch (these figures measured with the loop a while_loop, before the rolled_loop op). The
# library's top-p kernel (its 32-step bisection, 576 instructions) rolled: first call 13 s vs 33 s, but a
# launch 918 vs 626 us (2-core AMD EPYC Zen 4): the loop's ~10 us an iteration against ~20 us of work
MIN_INSTRUCTIONS = 1024


class Unroll(Exception):
    """A rolled loop was found wrong after the fact: retrace with `loop` unrolled."""

    def __init__(self, loop: int, why: str):
        super().__init__(f"loop {loop}: {why}")
        self.loop, self.why = loop, why


class _Mismatch(Exception):
    pass


class Roller:
    """Pass 2's loop roller. `first`: pass 1's trace (its instructions, loops and iteration starts)."""

    @classmethod
    def for_trace(cls, first, roll, disabled) -> "Roller | None":
        """A roller for the recording pass of `first`, or None where it would roll nothing. `roll`: nki.jit's
        option (False: none; True: the default threshold; an int: MIN_INSTRUCTIONS instead)."""
        if roll is False or not first.loop_ends:
            return None
        roller = cls(first, disabled, MIN_INSTRUCTIONS if roll is True else roll)
        return roller if roller.candidates - roller.disabled else None

    def __init__(self, first, disabled=frozenset(), min_instructions: int = MIN_INSTRUCTIONS):
        self.first = first
        self.disabled = set(disabled)
        issued = collections.Counter(lid for ins in first.instructions for lid, _ in ins.loops)
        trips = collections.Counter(loop for loop, _ in first.loop_starts)
        # the loops it may roll (pass 1's ids): with none, the recording pass runs without it, as before
        self.candidates = {lid for lid, n in issued.items() if n >= min_instructions and trips[lid] >= MIN_TRIP}
        self.capturing = False
        self.rolled: list = []  # (loop id, {rolled iteration values}, span nodes, the last node the roll added)
        self.storages: list = []  # weakrefs to pass 2's storages (a tile rebound in the body is rebound after)

    # --- the loop

    def iterations(self, tr, loop: int, values):
        """The loop's iteration values for the kernel's `for`: the first three (four, where iteration 0 differs)
        traced as written, the regular ones after them rolled, the rest traced as written."""
        values = list(values)
        n = len(values)
        graph = fx_graph()
        if (loop not in self.candidates or loop in self.disabled or self.capturing or graph is None
                or tr.launch.programs > 1):
            yield from values
            return
        spans, template = [], None
        for k in range(4):
            self._flush(tr)
            mark = _last(graph)
            self.capturing = True
            try:
                yield values[k]
            finally:
                self.capturing = False
            self._flush(tr)
            spans.append(_after(graph, mark))
            if k >= 2:
                try:
                    template = _template(spans, k - 1)
                    break
                except _Mismatch:
                    continue
        traced = len(spans)
        if template is None:
            yield from values[traced:]
            return
        stop = self._regular_until(loop, values, traced - 3)
        if stop - traced < MIN_ROLLED:
            yield from values[traced:]
            return
        try:
            last = self._emit(tr, template, spans, traced, stop)
        except Exception as e:  # noqa: BLE001 - a body that does not trace alone: trace this loop as written
            raise Unroll(loop, f"the body did not trace as a graph of its own ({type(e).__name__}: {e})") from e
        self.rolled.append((loop, set(values[traced:stop]), {x for sp in spans for x in sp}, last))
        starts = self.first.loop_starts
        target = starts[(loop, stop)] if stop < n else self.first.loop_ends[loop]
        while len(tr.loops) < target:  # the rolled iterations' inner loops: ids as pass 1 numbered them
            tr.loops.append(("rolled", ""))
        yield from values[stop:]

    def _flush(self, tr) -> None:
        """Deferred fusion work lands before an iteration's span starts and after it ends (spans stand alone)."""
        if tr.fuser is not None:
            tr.fuser.flush()
            tr.fuser.flush_stores()

    def _regular_until(self, loop: int, values, a: int) -> int:
        """The first iteration (index) after the traced ones whose pass-1 instructions are not iteration a's
        moved by (a + 1's - a's) per iteration (a, a + 1, a + 2: the template's points): the rest are traced."""
        index = {v: k for k, v in enumerate(values)}
        by_iteration: dict = {}
        for ins in self.first.instructions:
            for lid, v in ins.loops:
                if lid == loop:
                    by_iteration.setdefault(index[v], []).append(_flat(ins))
                    break
        ref = [by_iteration.get(k, []) for k in (a, a + 1)]
        if len(ref[0]) != len(ref[1]):
            return 0
        for k in range(a + 2, len(values)):
            got = by_iteration.get(k, [])
            if len(got) != len(ref[0]) or not all(_affine(x, y, g, k - a) for x, y, g in zip(ref[0], ref[1], got)):
                return k
        return len(values)

    # --- the rolled loop

    def _emit(self, tr, template, spans, first: int, stop: int):
        """Record iterations first..stop-1 as one rolled_loop op over the template (one traced iteration's
        nodes, traced again as a graph of its own with the counter an input); bind the tiles it carries out to
        the tiles that held them. Returns the last node it added."""
        nodes, consts, prev_slots, externals, at = template  # the template is iteration `at`'s span
        mutated = _mutated_externals(nodes, externals)
        if _alias_among(externals, mutated):
            raise RuntimeError("two values the body reads share memory, and the body writes one")
        # the body's inputs: the externals it writes in place, the tiles it rebinds (the last traced iteration's
        # values), the externals it only reads
        tensors = {}  # node (an in-place op's: the tensor it wrote) -> the Python tensor make_fx tracks for it
        for t, node in tracked_tensors():
            tensors.setdefault(_canon(node), t)
            tensors.setdefault(node, t)
        prev = sorted(prev_slots)
        readonly = [e for e in externals if e not in mutated]
        missing = [n for n in [*mutated, *readonly, *(spans[-1][p] for p in prev)] if n not in tensors]
        if missing:
            raise RuntimeError(f"no tensor holds {missing[0].name}, which the body reads")
        m_values = [tensors[e] for e in mutated]
        init_prev = [tensors[spans[-1][p]] for p in prev]
        ro_values = [tensors[e] for e in readonly]
        n_m, n_p = len(mutated), len(prev)
        local = set(nodes)
        strided = {}  # template position -> (its written argument's position, the tensor that views)
        for j, node in enumerate(nodes):
            w = _writes_arg(node.target)
            if w is not None and w < len(node.args):
                base = _canon(_base(node.args[w], within=local))
                if base in mutated:
                    strided[j] = (w, base)

        def body(k, *rest):
            s = k.item()
            check_range(s, first, stop)
            env = dict(zip(mutated, rest[:n_m]))  # written in place: the launch's own tensors
            env.update(zip(readonly, rest[n_m + n_p:]))
            prev_env = dict(zip(prev, rest[n_m:n_m + n_p]))

            def arg(a):
                if isinstance(a, _Ref):
                    if a.kind == "local":
                        return env[nodes[a.pos]]
                    if a.kind == "prev":
                        return prev_env[a.pos]
                    return env[a.node]
                if isinstance(a, _Affine):
                    return a.c2 + a.step * (s - at)
                if isinstance(a, (list, tuple)):
                    return type(a)(arg(x) for x in a)
                if isinstance(a, dict):
                    return {key: arg(x) for key, x in a.items()}
                return a

            for j, node in enumerate(nodes):
                a, kw = consts[j]
                args = arg(a)
                if j in strided:  # a write into a tensor the launch holds: into its region only (below)
                    w, base = strided[j]
                    args = list(args)
                    args[w] = _as_strided(env[base], args[w])
                env[node] = node.target(*args, **arg(kw))
            return tuple(env[nodes[p]] for p in prev)

        with untracked():  # the body's own inputs: what it writes must not be the outer graph's tensors
            inputs = [torch.zeros((), dtype=torch.int64), *(t.clone() for t in m_values + init_prev), *ro_values]
        gm = trace_subgraph(body, *inputs)
        reads = _drop_unread(gm, 1 + n_m + n_p)  # a view of a tensor the body made and never used, say
        key = _register_body(gm, inputs[:1 + n_m + n_p] + [inputs[1 + n_m + n_p + j] for j in reads])
        outs = [t.clone() for t in init_prev]  # the tiles the loop carries out (it writes them)
        if m_values or outs:  # else the iterations have no effect (nothing after the loop reads them: verify)
            torch.ops.nativelab_nki.rolled_loop(key, first, stop, [ro_values[j] for j in reads], m_values + outs,
                                                n_m)
        by_node = {}
        for ref in self.storages:
            st = ref()
            if st is not None and st.tensor is not None:
                by_node.setdefault(proxy_node(st.tensor), []).append(st)
        for p, v in zip(prev, outs):
            for st in by_node.get(spans[-1][p], []):
                st.tensor = v
                st.float_value = st.rounded = st.gemm = st.origin = None
                st.owned, st.lender = True, None
        return _last(fx_graph())

    # --- after the recording pass

    def verify(self, tr, graph) -> None:
        """The recording pass issued pass 1's instructions less the rolled iterations, and nothing after a
        rolled loop reads a value made inside its traced iterations: else Unroll."""
        if not self.rolled:
            return
        rolled = {(loop, v) for loop, vs, _, _ in self.rolled for v in vs}
        want = [_flat(i, self.first.storages) for i in self.first.instructions
                if not any(key in rolled for key in i.loops)]
        got = [_flat(i, tr.storages) for i in tr.instructions]
        if want != got:
            j = next((j for j, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
            raise Unroll(self.rolled[0][0], f"the recording pass issued other instructions than the checking pass "
                                            f"(first at instruction {j}): Python state carried across iterations")
        for loop, _, inside, last in self.rolled:
            after = False
            for node in graph.nodes:
                if after and node.op != "output" and any(a in inside for a in node.all_input_nodes):
                    raise Unroll(loop, f"{node.name} after the loop reads a value made in a traced iteration")
                after = after or node is last


# --- the rolled loop at run time: its body compiled once, called per iteration


_BODIES: dict = {}  # a body's key -> [its graph, example inputs, its compiled artifact or None]


def _register_body(gm: torch.fx.GraphModule, inputs) -> str:
    """Keep a traced body under a key made of its code and its inputs' layouts (the same body traced again,
    in this process or a later one, gets the same key: the graph that calls it is cached on disk by its code)."""
    h = hashlib.sha256(gm.code.encode())
    h.update(repr([(tuple(t.shape), tuple(t.stride()), t.dtype) for t in inputs]).encode())
    for node in gm.graph.nodes:  # the values the trace baked in (an nl.shared_constant's) are not in the code
        if node.op == "get_attr" and isinstance(getattr(gm, node.target, None), torch.Tensor):
            h.update(getattr(gm, node.target).detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    key = h.hexdigest()
    if key not in _BODIES:
        examples = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype) for t in inputs]
        _BODIES[key] = [gm, examples, None]
    return key


def _as_strided(base: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """`view` (a view of `base`) as one as_strided view of it. Inductor compiles an in-place write through
    slices of a graph input as a masked pass over the whole input (a functional slice_scatter it keeps for
    fusion), each iteration of a rolled body would read and write the whole output; through as_strided it
    writes the region in place."""
    return base.as_strided(view.size(), view.stride(), view.storage_offset())


def _drop_unread(gm: torch.fx.GraphModule, fixed: int) -> list:
    """Drop the placeholders after the first `fixed` that nothing in `gm` uses, once its dead nodes are gone
    (in-place ops stay); the positions, counted from `fixed`, of the ones kept."""
    gm.graph.eliminate_dead_code()
    kept = []
    for j, node in enumerate([n for n in gm.graph.nodes if n.op == "placeholder"][fixed:]):
        if node.users:
            kept.append(j)
        else:
            gm.graph.erase_node(node)
    gm.recompile()
    return kept


def loop_bodies(gm: torch.fx.GraphModule) -> list:
    """The body graphs of the loops `gm` keeps as loops (its rolled_loop ops'), in order."""
    return [_BODIES[n.args[0]][0] for n in gm.graph.nodes if n.target is torch.ops.nativelab_nki.rolled_loop.default]


def _compiled(key: str):
    entry = _BODIES[key]
    if entry[2] is None:
        from ..compiler.lowering import COMPILER_VERSION, compile_cached
        graph = torch.fx.Graph()
        graph.output(graph.graph_copy(entry[0].graph, {}))
        for node in graph.nodes:  # the recording's unbacked integers: a compile of its own makes them afresh
            node.meta = {}
        gm = torch.fx.GraphModule(entry[0], graph)
        # a body that holds tensors (an nl.shared_constant's) is not cached on disk: a loaded artifact would
        # take them as inputs (nki/jit.py's _lift_constants), the freshly compiled one holds them
        constants = any(n.op == "get_attr" for n in graph.nodes)
        disk_key = None if constants else hashlib.sha256(
            " ".join(["nki rolled loop", COMPILER_VERSION, torch.__version__, key]).encode()).hexdigest()
        entry[2], _ = compile_cached(gm, entry[1], disk_key)
    return entry[2]


@torch.library.custom_op("nativelab_nki::rolled_loop", mutates_args=("state",))
def _rolled_loop(body: str, first: int, stop: int, read: list[torch.Tensor], state: list[torch.Tensor],
                 written: int) -> None:
    """Iterations first..stop-1 of a rolled loop: its compiled body called once per iteration on the counter,
    `state` (the tensors it writes in place, its first `written`, then the tiles it rebinds: they hold the
    first iteration's values and are given the last one's) and the tensors it only reads."""
    fn = _compiled(body)
    values = state[written:]
    for k in range(first, stop):
        values = fn(torch.tensor(k), *state[:written], *values, *read)
    for t, v in zip(state[written:], values):
        t.copy_(v)


@_rolled_loop.register_fake
def _(body, first, stop, read, state, written):
    return None


# --- templates


class _Ref:
    """A node argument in the template: a node of the same iteration (its position), of the previous
    iteration (a carried slot: its position there), or a node before the loop (external)."""
    __slots__ = ("kind", "pos", "node")

    def __init__(self, kind, pos=None, node=None):
        self.kind, self.pos, self.node = kind, pos, node


class _Affine:
    """An integer constant that moves by `step` per iteration: c2 in the template's iteration."""
    __slots__ = ("c2", "step")

    def __init__(self, c2, step):
        self.c2, self.step = c2, step


def _template(spans, at: int):
    """Iteration `at`'s nodes with their arguments as _Ref / _Affine / constants, checked against iterations
    at - 1 and at + 1 (and at - 1's references to at - 2's): (nodes, per-node (args, kwargs), carried slot
    positions, externals, at)."""
    s0 = spans[at - 2] if at >= 2 else None
    s1, s2, s3 = spans[at - 1:at + 2]
    if not (len(s1) == len(s2) == len(s3)) or not s2:
        raise _Mismatch("iterations of different lengths")
    pos = {i: {n: j for j, n in enumerate(spans[i])} for i in range(len(spans))}
    consts, prev_slots, externals = [], set(), []
    seen_ext = set()

    def match(x, y, z):  # one argument of the three iterations' node: a _Ref, an _Affine or the constant
        if isinstance(y, torch.fx.Node):
            if not (isinstance(x, torch.fx.Node) and isinstance(z, torch.fx.Node)):
                raise _Mismatch("node vs constant")
            refs = [_classify(n, i, pos) for n, i in ((x, at - 1), (y, at), (z, at + 1))]
            kinds = {r[0] for r in refs}
            if len(kinds) != 1:
                raise _Mismatch("a reference that changes kind")
            kind = refs[1][0]
            if kind == "ext":
                if not (refs[0][1] is refs[1][1] is refs[2][1]):
                    raise _Mismatch("iterations read different values from before the loop")
                if refs[1][1] not in seen_ext:
                    seen_ext.add(refs[1][1])
                    externals.append(refs[1][1])
                return _Ref("ext", node=refs[1][1])
            if not (refs[0][1] == refs[1][1] == refs[2][1]):
                raise _Mismatch("references to different positions")
            if kind == "prev":
                prev_slots.add(refs[1][1])
                if s0 is not None and len(s0) != len(s1):
                    raise _Mismatch("the iteration before the template's differs and the next reads it")
            return _Ref(kind, pos=refs[1][1])
        if isinstance(y, (list, tuple)):
            if not (type(x) is type(y) is type(z) and len(x) == len(y) == len(z)):
                raise _Mismatch("lists differ")
            return (list if isinstance(y, list) else tuple)(match(p, q, r) for p, q, r in zip(x, y, z))
        if isinstance(y, dict):
            if not (x.keys() == y.keys() == z.keys()):
                raise _Mismatch("keywords differ")
            return {key: match(x[key], y[key], z[key]) for key in y}
        if type(y) is int and type(x) is int and type(z) is int:
            if x == y == z:
                return y
            if z - y != y - x:
                raise _Mismatch("an integer that does not move by a fixed step")
            return _Affine(y, y - x)
        if type(x) is not type(y) or type(y) is not type(z) or not (x == y == z):
            raise _Mismatch(f"constants differ: {x!r} {y!r} {z!r}")
        return y

    for j, (a, b, c) in enumerate(zip(s1, s2, s3)):
        if not (a.op == b.op == c.op == "call_function") or not (a.target is b.target is c.target):
            raise _Mismatch(f"node {j}: {b.op} {b.target}")
        if is_higher_order(b.target) or b.target is operator.setitem:
            raise _Mismatch(f"node {j}: {b.target}")
        consts.append((match(a.args, b.args, c.args), match(a.kwargs, b.kwargs, c.kwargs)))
    return s2, consts, prev_slots, externals, at


def _classify(node, i: int, pos):
    """What a node argument of iteration i's span is: ("local", position), ("prev", position in iteration
    i - 1), or ("ext", the node before the loop it stands for)."""
    node = _canon(node)
    if node in pos[i]:
        return "local", pos[i][node]
    if i - 1 in pos and node in pos[i - 1]:
        return "prev", pos[i - 1][node]
    if any(node in p for p in pos.values()):
        raise _Mismatch("a reference across more than one iteration")
    return "ext", node


def _aliased(node, views: bool):
    """The node whose memory `node`'s result is: an in-place op's written argument, and with `views` a view op's
    source; None for any other node (a new tensor, a placeholder, a node outside the graph's ops)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    j = _writes_arg(node.target)
    if j is not None:
        return node.args[j]
    return node.args[0] if views and is_view_op(node.target) else None


def _canon(node):
    """An in-place op's result stands for the tensor it wrote (make_fx hands later readers its node)."""
    while _aliased(node, views=False) is not None:
        node = _aliased(node, views=False)
    return node


def _base(node, within=None):
    """The tensor whose memory `node` is, through views and in-place ops (those in `within` only, if given)."""
    while (within is None or node in within) and _aliased(node, views=True) is not None:
        node = _aliased(node, views=True)
    return node


def _mutated_externals(nodes, externals) -> list:
    """The externals the template writes in place, directly or through views made in the template."""
    local = set(nodes)
    found = []
    for node in nodes:
        j = _writes_arg(node.target)
        if j is None:
            continue
        x = _canon(_base(node.args[j], within=local))
        if x in local:
            continue
        if x not in externals:
            raise RuntimeError(f"the body writes {x.name}, which it does not read")
        if x not in found:
            found.append(x)
    return found


def _alias_among(externals, mutated) -> bool:
    bases = {}
    for e in externals:
        bases.setdefault(_base(e), []).append(e)
    return any(len(es) > 1 and any(e in mutated for e in es) for es in bases.values())


def _last(graph):
    return next(reversed(graph.nodes))


def _after(graph, mark) -> list:
    out, seen = [], False
    for node in graph.nodes:
        if seen:
            out.append(node)
        seen = seen or node is mark
    return out


# --- pass 1's instructions, flattened for comparison


def _flat(ins, storages=None) -> tuple:
    """An instruction as a flat tuple. With `storages` (trace.Trace.storages), a storage is named by where it
    was allocated (two passes number storages differently); without, by its number (affine across iterations)."""
    def region(r):
        sid, lo, hi, view = r
        if storages is None:
            who = sid
        else:  # a tile by its line; an HBM tensor by its name (arguments are made outside the kernel)
            desc, memory, site, _, shape, _ = storages[sid]
            who = (memory, site if memory in ("sbuf", "psum") else desc, shape)
        return (who, lo, hi, view)
    return (ins.name, ins.engine, ins.elements, ins.partitions, ins.flops, ins.line, str(ins.dtype), ins.inputs,
            ins.loops, ins.core, ins.sync, ins.accumulates, ins.pairs, ins.immediates,
            tuple(region(r) for r in ins.reads), tuple(region(r) for r in ins.writes))


def _affine(a, b, got, k: int) -> bool:
    """got == a + (b - a) * k, element by element (strings, None and floats equal)."""
    if isinstance(b, (tuple, list)):
        return (isinstance(a, (tuple, list)) and isinstance(got, (tuple, list)) and len(a) == len(b) == len(got)
                and all(_affine(x, y, z, k) for x, y, z in zip(a, b, got)))
    if type(b) is int and type(a) is int and type(got) is int:
        return got == a + (b - a) * k
    return a == b == got
