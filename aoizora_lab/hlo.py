"""Read the collectives of a compiled program from its HLO text: a :class:`CommProgram`.

:func:`parse_hlo` is a pure function of ``compiled.as_text()``. It finds every collective
(``all-gather``, ``all-reduce``, ``reduce-scatter``, ``all-to-all``, ``collective-permute``; sync,
or the ``*-start`` half of an async pair; also inside fusions and async collective fusions),
its replica groups, its result bytes on one device, and how many times it runs per step:

- **groups** in all three syntaxes the compiler prints: explicit ``{{0,1},{2,3}}``; iota
  ``[G,S]<=[dims]T(perm)`` meaning ``arange(prod(dims)).reshape(dims).transpose(perm)
  .reshape(G, S)``; mesh axes ``mesh['a'=2,'b'=4] {'b'}`` (optionally with
  ``device_ids=(...)``), i.e. groups along the named axes of that id mesh. ``{}`` is one group
  of all devices. Ids are logical partition ids, as :class:`~aoizora_lab.Collective` wants;
  ``collective-permute`` gives its ``source_target_pairs``;
- **bytes**: the result shape's size (for ``all-gather-start`` and ``collective-permute-start``,
  whose result is an (operand, result, ...) tuple, the second element; for a combined
  all-reduce of several arrays, their sum);
- **count**: computations are weighted by how often they run: a ``while`` body by its trip
  count (``known_trip_count`` in the backend config, else the constant its condition compares
  the counter with), fusion and async computations by their caller's count. A loop whose trip
  count cannot be found counts once, with a note.

Example: ``%ag = bf16[1,1536,1536] all-gather(%p), replica_groups=mesh['x'=1,'y'=8] {'y'}``
inside a loop body that runs 30 times gives ``Collective("all-gather", [[0, ..., 7]],
bytes=4718592, count=30)``.

**Schedule.** The TPU compiler prints a scheduled module (``is_scheduled=true``): the
instructions of each computation in the order they run. Each collective's
:class:`CollectiveSite` records where it starts and where it is waited for, and whether it is
asynchronous, read from the HLO (never guessed from where it sits):

- a ``*-start`` op (``all-gather-start``, ``collective-permute-start``, ``all-reduce-start``)
  runs until the ``*-done`` that takes it as operand;
- an ``async-start`` wrapper around a collective runs until its ``async-done``, and a
  ``call-start`` (TPU7x runs collectives on its SparseCores this way: ``call-start(...),
  async_execution_thread="sparsecore", to_apply=%called_computation``) until its
  ``call-done``; a plain ``call`` runs where it stands;
- an **async collective fusion** is a chain of fusions that each hold a copy of the same
  collective (same ``channel_id``): the one whose root is the ``AsyncCollectiveStart`` custom
  call starts it, fusions in between compute while it runs (their copy is the same transfer,
  not another one: counted once), the one whose root is ``AsyncCollectiveDone`` waits for it;
- everything else is synchronous, including a ``kCustom`` fusion around a collective such as
  the ``all-reduce-scatter`` fusion: the schedule waits for it where it stands.

The compute ops (:class:`ComputeOp`) carry their place in the schedule too, so
:mod:`aoizora_lab.cost` can tell which compute lies between a collective's start and done.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from aoizora_lab.comm_model import Collective
from aoizora_lab.errors import AoizoraError
from aoizora_lab.flops import ATTENTION_KERNEL, attention_flops

if TYPE_CHECKING:
    import pandas as pd

_KINDS = {
    "all-gather": "all-gather", "all-gather-start": "all-gather",
    "all-reduce": "all-reduce", "all-reduce-start": "all-reduce",
    "reduce-scatter": "reduce-scatter", "all-to-all": "all-to-all",
    "collective-permute": "collective-permute",
    "collective-permute-start": "collective-permute",
    "all-to-all-start": "all-to-all",
}
_SECOND_OF_TUPLE = {"all-gather-start", "collective-permute-start", "all-to-all-start"}
"""Start ops whose result tuple is (operands, results, ...): the bytes are the second
element's (``all-to-all-start``, with ``--xla_tpu_enable_async_all_to_all``, returns
``((operand), result, u32[], u32[])``)."""
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
          "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5}
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_ASSIGN = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")


@dataclass(frozen=True)
class CollectiveSite:
    """Where a collective sits in the HLO: its enclosing loops and the compiler's algorithm."""

    loops: tuple[int, ...]
    """Trip counts of the ``while`` loops around it, outermost first (empty: runs once)."""
    strategy: str
    """The compiler's ``collective_algorithm_config`` strategy (or emitter) label, if any."""
    asynchronous: bool = False
    """Scheduled asynchronously (a start/done pair, an ``async-start`` wrapper or an async
    collective fusion), so it may overlap the compute scheduled between its start and done."""
    computation: str = ""
    """The computation whose schedule holds the collective's start and done."""
    start: int = 0
    """Position of its start (of the op itself when synchronous) in that schedule."""
    done: int = 0
    """Position of the op that waits for it: ``start`` when synchronous; before ``start`` when
    the wait comes in the next iteration of the loop the computation is the body of."""


@dataclass(frozen=True)
class ComputeOp:
    """One top-level compute op of a compiled program on one device."""

    flops: float
    """Matmul, convolution and attention-kernel FLOPs (its fused computations included)."""
    hbm_bytes: float
    """Bytes of its operands and result: what it reads from and writes to HBM at least."""
    runs: int
    """Runs per step (its computation's runs)."""
    outer_trips: int
    """Trips of the outermost loop around it (0: none), for layer folding."""
    op_class: str
    """``"attention"`` (a Pallas attention kernel), ``"matmul"`` (holds a dot or convolution)
    or ``"memory"`` (elementwise, copies, reductions): each class has its own efficiency."""
    estimated_cycles: float = 0.0
    """The TPU compiler's own estimate (``estimated_cycles`` in its backend config); 0 when the
    compiler gave none (Pallas kernels, CPU programs)."""
    anchors: tuple[tuple[str, int], ...] = ()
    """(computation, position) of the op and of every loop op around it, innermost last: where
    it runs in each enclosing schedule."""


@dataclass(frozen=True)
class CommProgram:
    """The collectives of one compiled program and how often each runs per step."""

    collectives: tuple[Collective, ...]
    """Every collective, ``count`` = runs per step."""
    num_devices: int
    """Logical devices (partitions) of the program."""
    notes: tuple[str, ...] = ()
    """What the parser could not be sure of (e.g. a loop without a known trip count)."""
    sites: tuple[CollectiveSite, ...] = ()
    """One per collective, in the same order."""
    ops: tuple[ComputeOp, ...] = ()
    """Every top-level compute op (fusion, convolution, dot, custom call, copy, reduce...) on
    one device, in schedule order per computation."""

    @property
    def flops(self) -> float:
        """FLOPs per device per step: dots and convolutions from shapes, attention kernels
        (splash) from their operand shapes."""
        return sum(op.flops * op.runs for op in self.ops)

    def to_frame(self) -> pd.DataFrame:
        """One row per HLO collective: kind, bytes, count, group_size, num_groups, name,
        loop_depth, strategy, asynchronous."""
        import pandas as pd

        sites = self.sites or (CollectiveSite((), ""),) * len(self.collectives)
        return pd.DataFrame([
            {"kind": c.kind, "bytes": c.bytes, "count": c.count,
             "group_size": len(c.groups[0]), "num_groups": len(c.groups), "name": c.name,
             "loop_depth": len(site.loops), "strategy": site.strategy,
             "asynchronous": site.asynchronous}
            for c, site in zip(self.collectives, sites, strict=True)],
            columns=["kind", "bytes", "count", "group_size", "num_groups", "name", "loop_depth",
                     "strategy", "asynchronous"])

    def fold_loop(self, compiled_trips: int, full_trips: int) -> CommProgram:
        """Scale collectives of the outermost loop of ``compiled_trips`` to ``full_trips``.

        For a model compiled with fewer layers than it has (the layer ``scan``): collectives
        and compute ops in that loop run ``full_trips / compiled_trips`` times as often; the
        rest do not change.
        """
        if not any(site.loops[:1] == (compiled_trips,) for site in self.sites):
            raise AoizoraError(
                f"No loop of {compiled_trips} trips holds a collective; this program cannot be "
                "folded (compile the full depth, or at least 2 layers so the loop survives)."
            )
        collectives = tuple(
            dataclasses.replace(c, count=c.count * full_trips // compiled_trips)
            if site.loops[:1] == (compiled_trips,) else c
            for c, site in zip(self.collectives, self.sites, strict=True))
        sites = tuple(dataclasses.replace(s, loops=(full_trips, *s.loops[1:]))
                      if s.loops[:1] == (compiled_trips,) else s for s in self.sites)
        ops = tuple(dataclasses.replace(op, runs=op.runs * full_trips // compiled_trips,
                                        outer_trips=full_trips)
                    if op.outer_trips == compiled_trips else op for op in self.ops)
        return dataclasses.replace(self, collectives=collectives, sites=sites, ops=ops)

    def signature(self) -> list[tuple[str, float, int, int, int]]:
        """(kind, bytes, count, group size, number of groups) of every collective, sorted: two
        programs with the same signature run the same collectives, whatever their order or
        names (e.g. a realised plan's compile against the program it was scored with)."""
        return sorted((c.kind, float(c.bytes), int(c.count), len(c.groups[0]), len(c.groups))
                      for c in self.collectives)

    @property
    def total_bytes(self) -> float:
        """Result bytes on one device of every collective, times its runs."""
        return sum(c.bytes * c.count for c in self.collectives)

    def bytes_by_kind(self) -> dict[str, float]:
        """``total_bytes`` split by collective kind."""
        totals: dict[str, float] = {}
        for c in self.collectives:
            totals[c.kind] = totals.get(c.kind, 0.0) + c.bytes * c.count
        return totals


@dataclass
class _Instruction:
    name: str
    type: str
    op: str
    rest: str

    def operands(self) -> list[str]:
        """Names of the operands (the text up to the closing parenthesis of the call)."""
        return re.findall(r"%([\w.\-]+)", self.rest[:_type_end("(" + self.rest) - 1])


def parse_hlo(text: str, num_devices: int | None = None) -> CommProgram:
    """The :class:`CommProgram` of compiled HLO ``text`` (see the module docstring).

    ``num_devices`` is needed only to expand ``replica_groups={}`` (all devices); by default
    it is read from the module's ``num_partitions`` when present.
    """
    computations, entry = _computations(text)
    if entry is None:
        raise AoizoraError("The HLO text has no ENTRY computation; pass compiled.as_text().")
    if num_devices is None:
        match = re.search(r"num_partitions=(\d+)", text)
        num_devices = int(match.group(1)) if match else None
    notes: list[str] = []
    runs, loops = _runs(computations, entry, notes)
    scheduled = {name: _collective_schedule(computations, name)
                 for name in _scheduled(computations, runs)}
    collectives, sites = [], []
    for comp_name, found in scheduled.items():
        for ins, start, done in found:
            kind = _KINDS[ins.op]
            groups = (_pairs(ins.rest) if kind == "collective-permute"
                      else _groups(ins.rest, num_devices, ins.name))
            collectives.append(Collective(kind, groups, _result_bytes(ins), count=runs[comp_name],
                                          name=ins.name))
            strategy = re.search(r'"collective_algorithm_config":\{[^}]*?"strategy":"([^"]+)"',
                                 ins.rest) or re.search(
                r'"collective_algorithm_config":\{[^}]*?"emitter":"([^"]+)"', ins.rest)
            sites.append(CollectiveSite(loops[comp_name], strategy.group(1) if strategy else "",
                                        done != start, comp_name, start, done))
    devices = num_devices or 1 + max((c.max_device_id for c in collectives), default=0)
    return CommProgram(tuple(collectives), devices, tuple(dict.fromkeys(notes)), tuple(sites),
                       _compute_ops(computations, runs, loops, entry, scheduled))


def program_at_depth(hlo_text: str, num_devices: int, num_layers: int | None,
                     model_layers: int) -> CommProgram:
    """The :class:`CommProgram` of a compile ``num_layers`` deep (``None``: the model's depth),
    its layer loop scaled to the model's ``model_layers`` when it was compiled shallower."""
    program = parse_hlo(hlo_text, num_devices=num_devices)
    if num_layers is not None and num_layers < model_layers:
        program = program.fold_loop(num_layers, model_layers)
    return program


# ----------------------------------------------------------------------------- structure


def _computations(text: str) -> tuple[dict[str, list[_Instruction]], str | None]:
    computations: dict[str, list[_Instruction]] = {}
    entry = current = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and not _ASSIGN.match(line):
            current = header.group(2)
            computations[current] = [
                _Instruction(name, kind, "parameter", "")
                for name, kind in re.findall(r"([\w.\-]+):\s*([a-z0-9]+\[[\d,]*\])", line)]
            if header.group(1):
                entry = current
            continue
        if current is None:
            continue
        if line.strip() == "}":
            current = None
            continue
        assign = _ASSIGN.match(line)
        if assign:
            rest = line[assign.end():]
            type_end = _type_end(rest)
            op_match = re.match(r"\s*([\w\-]+)\(", rest[type_end:])
            if op_match:
                computations[current].append(_Instruction(
                    assign.group(1), rest[:type_end], op_match.group(1),
                    rest[type_end + op_match.end():]))
    return computations, entry


def _type_end(rest: str) -> int:
    """End of the result type at the start of ``rest`` (a tuple may nest brackets)."""
    if not rest.startswith("("):
        return rest.find(" ") if " " in rest else len(rest)
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0:
            return i + 1
    return len(rest)


_CALLS = ("call", "call-start")
"""Ops whose ``to_apply`` computation runs once per op (elsewhere ``to_apply`` is a reducer)."""


def _callees(ins: _Instruction) -> list[tuple[str, str]]:
    """(role, computation) pairs this instruction runs; reducers (to_apply) are not runs."""
    roles = "calls|body|condition|to_apply" if ins.op in _CALLS else "calls|body|condition"
    out = [("calls" if role == "to_apply" else role, name) for role, name in
           re.findall(rf"\b({roles})=%?([\w.\-]+)", ins.rest)]
    for group in re.findall(r"branch_computations=\{([^}]*)\}", ins.rest):
        out += [("branch", n.strip().lstrip("%")) for n in group.split(",") if n.strip()]
    return out


def _runs(computations: dict[str, list[_Instruction]], entry: str,
          notes: list[str]) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """Runs per step of every computation, and the trip counts of the loops around it."""
    runs: dict[str, int] = {}
    loops: dict[str, tuple[int, ...]] = {}

    def visit(name: str, times: int, around: tuple[int, ...]) -> None:
        runs[name] = runs.get(name, 0) + times
        loops.setdefault(name, around)
        for ins in computations.get(name, []):
            callees = _callees(ins)
            trips = 1
            if ins.op == "while":
                trips = _trip_count(ins, dict(callees).get("condition"),
                                    dict(callees).get("body"), computations, notes)
            for role, callee in callees:
                looped = role in ("body", "condition")
                visit(callee, times * (trips if looped else 1),
                      (*around, trips) if looped else around)

    visit(entry, 1, ())
    return runs, loops


def _trip_count(ins: _Instruction, condition: str | None, body: str | None,
                computations: dict[str, list[_Instruction]], notes: list[str]) -> int:
    known = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', ins.rest)
    if known:
        return int(known.group(1))
    seen: list[_Instruction] = []
    pending = [condition] if condition else []
    while pending:  # the condition and the fusions it calls
        comp = pending.pop()
        for i in computations.get(comp, []):
            seen.append(i)
            pending += [c for role, c in _callees(i) if role == "calls"]
    constants = _scalar_constants(seen)
    by_name = {i.name: i for i in seen}
    for i in seen:
        if i.op != "compare":
            continue
        operands = re.findall(r"%([\w.\-]+)", i.rest.split(")")[0])
        direction = re.search(r"direction=(\w+)", i.rest)
        bound = [constants[o] for o in operands if o in constants]
        counter = [re.search(r"index=(\d+)", by_name[o].rest) for o in operands
                   if o in by_name and by_name[o].op == "get-tuple-element"]
        step = _loop_step(computations.get(body or "", []), counter[0].group(1)
                          if counter and counter[0] else None)
        if bound and direction and direction.group(1) in ("LT", "GT", "NE"):
            return max(-(-bound[0] // step), 1)
        if bound and direction and direction.group(1) in ("LE", "GE"):
            return bound[0] // step + 1
    notes.append(f"loop {ins.name}: trip count not found, counted once")
    return 1


def _scalar_constants(instructions: list[_Instruction]) -> dict[str, int]:
    """Integer scalar constants among ``instructions``, by name."""
    constants = {}
    for i in instructions:
        value = re.match(r"\s*(-?\d+)\)", i.rest) if i.op == "constant" else None
        if value and re.match(r"[su](32|64)\[\]", i.type):
            constants[i.name] = int(value.group(1))
    return constants


def _loop_step(body: list[_Instruction], index: str | None) -> int:
    """How much the loop body adds to the counter at tuple ``index`` per iteration: the
    ``add`` of a constant that the root tuple carries to the next iteration (1 when there is
    none; windowed einsums step by 2)."""
    if index is None or not body or body[-1].op != "tuple":
        return 1
    carried = body[-1].operands()
    by_name = {i.name: i for i in body}
    update = by_name.get(carried[int(index)]) if int(index) < len(carried) else None
    if update is None or update.op != "add":
        return 1
    steps = [value for name, value in _scalar_constants(body).items()
             if name in update.operands()]
    return steps[0] if steps and steps[0] > 0 else 1


# ----------------------------------------------------------------------------- schedule


def _inner(computations: dict[str, list[_Instruction]]) -> set[str]:
    """Computations that run inside one op of their caller (fusions, async wrappers, calls), so
    their instructions have no place of their own in a schedule."""
    return {callee for instructions in computations.values() for ins in instructions
            if ins.op in ("fusion", "async-start", *_CALLS)
            for role, callee in _callees(ins) if role == "calls"}


def _scheduled(computations: dict[str, list[_Instruction]], runs: dict[str, int]) -> list[str]:
    """Computations with a schedule of their own that run (entry, loop bodies, branches)."""
    inner = _inner(computations)
    return [name for name in computations if name not in inner and runs.get(name, 0)]


def _held(computations: dict[str, list[_Instruction]], name: str) -> list[_Instruction]:
    """Collective ops inside computation ``name`` and the computations it calls."""
    found = []
    for ins in computations.get(name, []):
        if ins.op in _KINDS:
            found.append(ins)
        found += [c for role, callee in _callees(ins) if role == "calls"
                  for c in _held(computations, callee)]
    return found


def _held_by(computations: dict[str, list[_Instruction]], ins: _Instruction
             ) -> list[_Instruction]:
    """Collective ops inside the computations ``ins`` calls (a fusion, an async wrapper)."""
    return [c for role, callee in _callees(ins) if role == "calls"
            for c in _held(computations, callee)]


def _root_target(computations: dict[str, list[_Instruction]], ins: _Instruction) -> str:
    """``custom_call_target`` of the root of the computation a fusion calls ('' if none)."""
    for role, callee in _callees(ins):
        body = computations.get(callee) if role == "calls" else None
        if body:
            target = re.search(r'custom_call_target="([^"]+)"', body[-1].rest)
            return target.group(1) if target else ""
    return ""


def _channel(ins: _Instruction) -> str:
    match = re.search(r"channel_id=(\d+)", ins.rest)
    return match.group(1) if match else ins.name


def _waiter(instructions: list[_Instruction], start: int, waits: Any) -> int:
    """Position of the first op after ``start`` (wrapping to the top: the next iteration of a
    loop body) for which ``waits(op)`` holds; ``start`` itself when none does."""
    n = len(instructions)
    for step in range(1, n):
        if waits(instructions[(start + step) % n]):
            return (start + step) % n
    return start


def _collective_schedule(computations: dict[str, list[_Instruction]], name: str
                         ) -> list[tuple[_Instruction, int, int]]:
    """(collective op, start position, done position) of every collective scheduled in
    computation ``name`` (see the module docstring); ``done == start``: synchronous."""
    instructions = computations[name]
    chains = {_channel(c) for ins in instructions if ins.op == "fusion"
              and _root_target(computations, ins) == "AsyncCollectiveStart"
              for c in _held_by(computations, ins)}
    found = []
    for i, ins in enumerate(instructions):
        if ins.op in _KINDS:
            done = i
            if ins.op.endswith("-start"):
                done = _waiter(instructions, i, lambda j, ins=ins: j.op.endswith("-done")
                               and ins.name in j.operands())
            found.append((ins, i, done))
        elif ins.op == "async-start":
            waited = {ins.name}

            def waits(j: _Instruction, waited: set[str] = waited) -> bool:
                if j.op in ("async-update", "async-done") and waited & set(j.operands()):
                    waited.add(j.name)
                    return j.op == "async-done"
                return False

            done = _waiter(instructions, i, waits)
            found += [(c, i, done) for c in _held_by(computations, ins)]
        elif ins.op in _CALLS:
            done = i if ins.op == "call" else _waiter(
                instructions, i,
                lambda j, ins=ins: j.op == "call-done" and ins.name in j.operands())
            found += [(c, i, done) for c in _held_by(computations, ins)]
        elif ins.op == "fusion":
            target = _root_target(computations, ins)
            for c in _held_by(computations, ins):
                if target == "AsyncCollectiveStart":
                    done = _waiter(instructions, i, lambda j, c=c: j.op == "fusion"
                                   and _root_target(computations, j) == "AsyncCollectiveDone"
                                   and any(_channel(h) == _channel(c)
                                           for h in _held_by(computations, j)))
                    found.append((c, i, done))
                elif target != "AsyncCollectiveDone" and _channel(c) not in chains:
                    found.append((c, i, i))  # e.g. the all-reduce-scatter fusion: waited for
    return found


# ----------------------------------------------------------------------------- attributes


def _result_bytes(ins: _Instruction) -> float:
    text = ins.type
    if ins.op in _SECOND_OF_TUPLE:
        parts = _tuple_parts(text)
        text = parts[1] if len(parts) >= 2 else text
    arrays = [(dtype, dims) for dtype, dims in _ARRAY.findall(text) if dtype in _BYTES]
    return float(sum(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
                     for dtype, dims in arrays))


def _tuple_parts(text: str) -> list[str]:
    """The top-level elements of a tuple type ``(a, (b, c), d)`` (``[text]`` if not one)."""
    text = text.strip()
    if not text.startswith("("):
        return [text]
    parts, depth, start = [], 0, 1
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                parts.append(text[start:i])
                break
        elif char == "," and depth == 1:
            parts.append(text[start:i])
            start = i + 1
    return [p.strip() for p in parts]


def _pairs(rest: str) -> list[tuple[int, int]]:
    match = re.search(r"source_target_pairs=\{(.*?)\}\}", rest)
    if not match:
        return []
    return [tuple(int(v) for v in pair.split(","))
            for pair in re.findall(r"\{(\d+,\d+)", match.group(1) + "}")]


def _groups(rest: str, num_devices: int | None, name: str) -> list[list[int]]:
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]", rest)
    if mesh:
        axes = [(a, int(n)) for a, n in re.findall(r"'([^']+)'=(\d+)", mesh.group(1))]
        tail = rest[mesh.end():]
        ids = np.arange(math.prod(n for _, n in axes))
        listed = re.match(r",\s*device_ids=\(", tail)
        if listed:
            inner = tail[listed.end():listed.end() + _type_end("(" + tail[listed.end():]) - 2]
            ids = _id_list(inner, name)
            tail = tail[listed.end() + len(inner) + 1:]
        chosen = re.findall(r"'([^']+)'", re.match(r"\s*\{([^}]*)\}", tail).group(1))
        names = [a for a, _ in axes]
        ids = ids.reshape([n for _, n in axes])
        keep = [names.index(a) for a in chosen]
        others = [i for i in range(len(names)) if i not in keep]
        size = math.prod(axes[i][1] for i in keep)
        return ids.transpose(others + keep).reshape(-1, size).tolist()
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=(\[[\d,]+\](?:T\([\d,]+\))?)", rest)
    if iota:
        count, size = int(iota.group(1)), int(iota.group(2))
        return _id_list(iota.group(3), name).reshape(count, size).tolist()
    explicit = re.search(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}", rest)
    if explicit and explicit.group(1).strip():
        return [[int(v) for v in g.split(",") if v.strip()]
                for g in re.findall(r"\{([\d,\s]*)\}", explicit.group(1))]
    if "replica_groups=" in rest and not re.search(r"replica_groups=\{\s*\}", rest):
        raise AoizoraError(
            f"Collective {name}: replica groups in a syntax this parser does not know: "
            f"{rest[rest.index('replica_groups='):][:120]!r}"
        )
    if num_devices is None:
        raise AoizoraError(
            f"Collective {name} runs over all devices (replica_groups={{}}); pass num_devices."
        )
    return [list(range(num_devices))]


def _id_list(text: str, name: str) -> np.ndarray:
    """Device ids written as ``7,6,5,...`` or as an iota ``[dims]T(perm)``."""
    iota = re.fullmatch(r"\s*\[([\d,]+)\](?:T\(([\d,]+)\))?\s*", text)
    if iota:
        dims = [int(d) for d in iota.group(1).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota.group(2):
            ids = ids.transpose([int(p) for p in iota.group(2).split(",")])
        return ids.ravel()
    try:
        return np.array([int(v) for v in text.split(",") if v.strip()])
    except ValueError as err:
        raise AoizoraError(f"Collective {name}: cannot read device ids {text!r}.") from err


# ----------------------------------------------------------------------------- compute

_COMPUTE_OPS = ("fusion", "convolution", "dot")
"""Ops that compute wherever they run; any other op counts when the compiler estimated its
cycles (a top-level ``copy``, ``reduce`` or ``transpose`` on TPU) or when it is an attention
kernel."""


def _array_bytes(type_text: str) -> float:
    return float(sum(_BYTES[d] * math.prod(int(n) for n in dims.split(",") if n)
                     for d, dims in _ARRAY.findall(type_text) if d in _BYTES))


def _dims(type_text: str) -> list[int]:
    match = _ARRAY.search(type_text)
    return [int(n) for n in match.group(2).split(",") if n] if match else []


def _own_flops(ins: _Instruction, types: dict[str, str]) -> float:
    """FLOPs of one dot, convolution or attention custom call (0 for anything else)."""
    out = math.prod(_dims(ins.type))
    operands = ins.operands()
    if ins.op == "dot" and operands:
        lhs = _dims(types.get(operands[0], ""))
        contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.rest)
        k = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d) \
            if contracting and lhs else 1
        return 2.0 * out * k
    if ins.op == "convolution" and len(operands) >= 2:
        kernel = _dims(types.get(operands[1], ""))
        labels = re.search(r"dim_labels=[^_]*_([^-]*)->", ins.rest)
        if kernel and labels and "o" in labels.group(1):
            return 2.0 * out * math.prod(kernel) / kernel[labels.group(1).index("o")]
        return 0.0
    if ins.op == "custom-call" and ATTENTION_KERNEL.search(ins.name + ins.rest[:200]):
        start = ins.rest.find("operand_layout_constraints=")
        block = ""
        if start >= 0:
            block = ins.rest[start + len("operand_layout_constraints="):]
            block = block[:_type_end(block.replace("{", "(", 1))]
        floats = [[int(n) for n in dims.split(",") if n] for d, dims in _ARRAY.findall(block)
                  if d in ("bf16", "f16", "f32") and dims.count(",") >= 2]
        if len(floats) >= 2:
            return attention_flops(floats[0], floats[1])
    return 0.0


def _compute_ops(computations: dict[str, list[_Instruction]], runs: dict[str, int],
                 loops: dict[str, tuple[int, ...]], entry: str,
                 scheduled: dict[str, list[tuple[_Instruction, int, int]]]
                 ) -> tuple[ComputeOp, ...]:
    """Every compute op of the ``scheduled`` computations (each with its collectives, as
    :func:`_collective_schedule` found them: those and their fusions are the ICI model's),
    with its FLOPs, bytes, class, the compiler's cycles and its anchors."""
    types = {name: {i.name: i.type for i in instructions}
             for name, instructions in computations.items()}

    def flops_of(name: str) -> float:
        total = 0.0
        for ins in computations.get(name, []):
            total += _own_flops(ins, types[name])
            if ins.op == "fusion":
                total += sum(flops_of(c) for role, c in _callees(ins) if role == "calls")
        return total

    anchors: dict[str, tuple[tuple[str, int], ...]] = {entry: ()}
    pending = [entry]
    while pending:  # where each scheduled computation runs in its caller's schedule
        name = pending.pop()
        for position, ins in enumerate(computations.get(name, [])):
            for role, callee in _callees(ins):
                if role != "calls" and callee not in anchors:
                    anchors[callee] = (*anchors[name], (name, position))
                    pending.append(callee)
    collective_ops = {id(ins) for found in scheduled.values() for ins, _, _ in found}
    ops = []
    for name in scheduled:
        for position, ins in enumerate(computations[name]):
            cycles = re.search(r'"estimated_cycles":"(\d+)"', ins.rest)
            attention = ins.op == "custom-call" and bool(
                ATTENTION_KERNEL.search(ins.name + ins.rest[:200]))
            if not (ins.op in _COMPUTE_OPS or cycles or attention) or ins.op in _KINDS:
                continue
            callees = [c for role, c in _callees(ins) if role == "calls"]
            held = _held_by(computations, ins)
            if any(id(c) in collective_ops for c in held) or (
                    held and _root_target(computations, ins) in ("AsyncCollectiveStart",
                                                                  "AsyncCollectiveDone")):
                continue  # the collective itself (a start, a done, a synchronous fusion)
            flops = _own_flops(ins, types[name]) + sum(flops_of(c) for c in callees)
            moved = _array_bytes(ins.type) + sum(_operand_reads(ins, computations, types[name]))
            op_class = "attention" if attention else "matmul" if flops else "memory"
            ops.append(ComputeOp(flops, moved, runs[name], (loops.get(name) or (0,))[0],
                                 op_class, float(cycles.group(1)) if cycles else 0.0,
                                 (*anchors.get(name, ()), (name, position))))
    return tuple(ops)


def _operand_reads(ins: _Instruction, computations: dict[str, list[_Instruction]],
                   types: dict[str, str]) -> list[float]:
    """Bytes ``ins`` reads of each operand: all of it, except an operand only sliced
    (``dynamic-slice``, directly or inside the fusion): then the slices. A layer loop reads
    one layer of its stacked weights per trip, whatever the depth of the stack."""
    callee = next((c for role, c in _callees(ins) if role == "calls"), None)
    body = computations.get(callee or "", [])
    params = {int(m.group(1)): i.name for i in body if i.op == "parameter"
              for m in [re.match(r"\s*(\d+)\)", i.rest)] if m}
    reads = []
    for position, operand in enumerate(ins.operands()):
        if ins.op == "dynamic-slice" and position == 0:
            reads.append(_array_bytes(ins.type))
            continue
        name = params.get(position)
        users = [i for i in body if name and name in i.operands()]
        if users and all(u.op == "dynamic-slice" and u.operands()[0] == name for u in users):
            reads.append(sum(_array_bytes(u.type) for u in users))
        else:
            reads.append(_array_bytes(types.get(operand, "")))
    return reads
