"""The program instances of a launch, run inside one trace. An LNC-2 launch (kernel[2]: two programs, one per
physical core, nl.program_id(0) the rank) may make its programs wait for each other (nisa.sendrecv,
nisa.core_barrier), so its programs run as cooperative coroutines (greenlets) in this one thread, switching
only at those rendezvous: make_fx's tracing state (the dispatch-mode stack, thread-local) stays valid in the
recording pass, which threads would not keep. A program that never waits runs from start to end before the
next starts, as every other grid's programs do, so such a kernel traces as it did before.

In an LNC-2 launch each program has its own core's state (trace.PROGRAM_STATE: SBUF/PSUM account,
engine registers and PRNG), swapped at every switch, and its instructions are tagged with its core
for the cost model. A rendezvous one program never reaches is an error, never a hang."""

from __future__ import annotations

import collections
import itertools

import greenlet

from . import limits, trace

_BLOCKED = object()  # what a program hands the scheduler when it waits for its partner


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


class _Wait:
    """A program waiting at a rendezvous: which (kind and key, the n-th of its kind), where."""

    def __init__(self, key, n: int, what: str, line: str):
        self.key, self.n, self.what, self.line = key, n, what, line

    def describe(self, rank: int) -> str:
        return f"rank {rank} waits at its {_ordinal(self.n)} {self.what} ({self.line})"


class Launch:
    """Schedules the program instances of one launch inside trace `tr` (see the module docstring)."""

    def __init__(self, tr: trace.Trace):
        self.tr = tr
        self.grid = tr.grid
        self.pids = [tuple(p) for p in itertools.product(*(range(g) for g in tr.grid))] if tr.grid else [()]
        self.lnc2 = len(self.pids) == 2  # two programs: the two physical cores of an LNC-2 logical core
        self.rank = 0  # the running program
        self._states: dict = {}
        self._counts: collections.Counter = collections.Counter()  # (rank, key) -> rendezvous reached
        self._posted: dict = {}  # (key, n) -> {rank: payload}
        self._waiting: dict = {}  # rank -> _Wait
        self._resume: dict = {}  # rank -> the partner's payload it resumes with
        self._mark = 0  # instructions before this index are tagged with their core

    @property
    def programs(self) -> int:
        return len(self.pids)

    def run(self, body):
        """body(pid) for every program instance; returns the first program's result that is not None."""
        main = greenlet.getcurrent()
        self._main = main
        gs = []
        for rank, pid in enumerate(self.pids):
            g = greenlet.greenlet(lambda pid=pid: body(pid), parent=main)
            g.gr_context = main.gr_context  # one thread's context, as if the programs ran in it
            gs.append(g)
        results: dict = {}
        order = self.tr.order
        ready = collections.deque(order.programs(len(gs)) if order is not None else range(len(gs)))
        self._ready = ready
        try:
            while True:
                while ready:
                    rank = ready.popleft()
                    self._enter(rank)
                    try:
                        out = gs[rank].switch(*((self._resume.pop(rank),) if rank in self._resume else ()))
                    finally:
                        self._leave(rank)
                    if gs[rank].dead:
                        results[rank] = out
                if not self._waiting:
                    break
                rank = min(self._waiting)
                error = limits.NkiError(self._unmatched(rank, results))
                self._enter(rank)
                try:
                    gs[rank].throw(error)  # raised where the kernel waits: its traceback shows the kernel's line
                finally:
                    self._leave(rank)
                raise error  # the kernel caught it: still an error
        finally:
            for rank, g in enumerate(gs):  # after an error: unwind the others
                if g and not g.dead:
                    self._enter(rank)
                    try:
                        g.throw(greenlet.GreenletExit)
                    finally:
                        self._leave(rank)
        return next((results[r] for r in sorted(results) if results[r] is not None), None)

    def _enter(self, rank: int) -> None:
        self.rank = rank
        tr = self.tr
        if self.lnc2:
            state = self._states.pop(rank, None)
            if state is None:
                state = tr.fresh_program_state(self.pids[rank])
                state["loop_key"] = ((trace.GRID_LOOP, rank),)
            tr.load_program_state(state)
        elif rank not in self._states:  # one core runs the programs one after another
            self._states[rank] = True
            tr.program, tr.hbm_allocs_this_program = self.pids[rank], 0
            # the programs as the iterations of one parallel loop (nki/hazards.py): none waits for another
            tr.loop_key = ((trace.GRID_LOOP, rank),) if len(self.pids) > 1 else ()

    def _leave(self, rank: int) -> None:
        """Before another program runs: the fuser's deferred matmuls and stores land (they are this
        program's), its instructions are tagged with its core, its core's state is put aside."""
        tr = self.tr
        if tr.fuser is not None:
            tr.fuser.flush()
            tr.fuser.flush_stores()
        if self.lnc2:
            for ins in tr.instructions[self._mark:]:
                ins.core = rank
            self._states[rank] = tr.program_state()
        self._mark = len(tr.instructions)

    def rendezvous(self, kind: str, key, payload, what: str):
        """Wait (in the running program) until the partner reaches its matching rendezvous: the n-th of
        `key` on one rank pairs with the n-th of `key` on the other. Returns the partner's payload and
        the sync key both ranks' instructions carry."""
        rank = self.rank
        full = (kind, key)
        self._counts[(rank, full)] += 1
        n = self._counts[(rank, full)]
        slot = self._posted.setdefault((full, n), {})
        slot[rank] = payload
        peer = 1 - rank
        sync = (kind, key, n)
        if peer in slot:  # the partner waits here: both go on (this one first)
            del self._posted[(full, n)]
            self._waiting.pop(peer, None)
            self._resume[peer] = payload
            self._ready.append(peer)
            self.tr.epoch += 1  # what either core did before this rendezvous is ordered before what follows it
            return slot[peer], sync
        self._waiting[rank] = _Wait(full, n, what, limits.kernel_line())
        got = self._main.switch(_BLOCKED)
        self.tr.epoch += 1
        return got, sync

    def _unmatched(self, rank: int, finished: dict) -> str:
        w = self._waiting[rank]
        peer = 1 - rank
        if peer in self._waiting:
            return (f"nki: {w.what} at {w.line}: the two programs' collectives do not pair up: "
                    f"{w.describe(rank)} while {self._waiting[peer].describe(peer)}; the n-th sendrecv of a "
                    f"pipe (or the n-th core_barrier) on one rank pairs with the n-th on the other")
        return (f"nki: {w.what} at {w.line}: rank {rank}'s {_ordinal(w.n)} {w.what} has no partner: rank {peer} "
                f"finished after {self._counts[(peer, w.key)]} of them; both ranks must issue the same "
                f"sequence of sendrecv / core_barrier")


def current() -> Launch | None:
    tr = trace.active()
    return tr.launch if tr is not None else None
