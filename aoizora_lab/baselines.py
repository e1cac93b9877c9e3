"""The systems people run today, built as their own code and docs build them, and a user's own
setup: each scored by the same compiler and cost model as the plan.

A :class:`Setup` is one configuration someone runs, in our terms (a :class:`Candidate`, a
device order, compiler flags) and in the system's own words (``recipe``: its config keys or
command-line flags). The existing systems (:data:`SYSTEMS`):

- ``maxdiffusion-default``: what ``base_wan_14b.yml`` / ``base_wan_1_3b.yml`` ship (HEAD
  7cfb880): mesh axes ``(data, fsdp, context, tensor) = (1, 1, -1, 1)`` (every chip on
  ``context``), built by ``mesh_utils.create_device_mesh`` with ``allow_split_physical_axes:
  False``; ``attention: flash`` (queries sharded over ``context``, K/V gathered); weights
  sharded over ``context`` and ``fsdp`` (logical rule ``embed -> [context, fsdp]``; ``data``
  never shards weights); both CFG passes batched on every device; the README's Wan
  ``LIBTPU_INIT_ARGS``.
- ``maxdiffusion-best``: the best of its attention kernels (``flash``, ``ulysses``,
  ``tokamax_ring``, ``ulysses_ring`` with every ``ulysses_shards``) x its recipes (context over
  every chip; ``ici_data_parallelism=2`` x context over the rest; each also with
  ``ici_tensor_parallelism=2``) on the slice, each with the README's flags for that kernel;
  where one flag breaks a compile, the same recipe less that flag (:func:`with_fallbacks`).
- ``xdit-usp``: the official Wan 2.1 code on xDiT's USP (``generate.py --ulysses_size U
  --ring_size R [--dit_fsdp]``): no CFG parallelism, ``U x R`` = every device, heads divisible by
  ``U``, the token axis padded to a multiple of ``U x R``, ranks in launch order with Ulysses
  the inner (fast) index (yunchang's ``use_ulysses_low``), libtpu's default flags; the best
  split.

Where a system has several setups, every one it builds is compiled with its recipe's flags and
the fastest predicted step wins (:func:`score_baselines`): not only the best IR estimates, since
the IR estimate has no schedule and cannot see what the recipe's flags hide (with
MaxDiffusion's asynchronous all-to-all, Ulysses setups the estimate ranks last can win).
What the system's own code would refuse (a head count Ulysses cannot split, a mesh
``create_device_mesh`` refuses) is recorded with the reason; where a user would change one
setting to get past a refusal (``allow_split_physical_axes=True``), the setup is built that way
and its ``note`` says so. That setting changes nothing elsewhere: ``create_device_mesh``
splits a physical axis only where no unsplit assignment exists, so it is no setup of its own.

Heads are never padded: MaxDiffusion's Ulysses "fails fast instead of padding synthetic heads",
the official Wan code asserts ``num_heads % ulysses_size == 0`` (xDiT checks the same), and the
planner follows them (a head split that does not divide is an invalid candidate). Tokens are
padded by all three (MaxDiffusion to a multiple of the context shards, Wan to a multiple of
``U x R``, the planner to a multiple of the sequence degree).

Where a rebuild differs from the real system, and which way each difference goes where it is
known, is listed in the README ("Differences from the real systems"): among them both CFG
passes as one batch, tensor-parallel recipes with split attention heads, Tokamax and custom
kernels priced as our splash kernel, and the options not rebuilt (:data:`MAXDIFFUSION_UNBUILT`,
each a trial row with why).

Ablations of the plan (the plan's program in another device order, the best candidate in plain
order) are not baselines: they are the *placement gain* and *strategy gain* of a
:class:`Headline`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from aoizora_lab.candidates import Candidate, default_attention, explain_candidates
from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.compile import (
    CompiledCandidate,
    CompilerFlags,
    CompileStatus,
    NotRun,
    NotRunReason,
    Outcome,
    compiler_flags,
)
from aoizora_lab.cost import breakdown, predict
from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.models.parallel import ulysses_head_chunks
from aoizora_lab.placement import (
    LibraryRefuses,
    Placement,
    create_device_mesh_order,
    make_mesh_order,
    plain_order,
)
from aoizora_lab.prune import Pruning, pruned_as
from aoizora_lab.realize import Plan
from aoizora_lab.records import Records
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

SYSTEMS = ("maxdiffusion-default", "maxdiffusion-best", "xdit-usp")
"""The existing systems, in report order."""
USER = "yours"
"""The name of a user's own setup (``PlanOptions(compare=...)``)."""

MAXDIFFUSION_KERNELS: dict[str, str] = {
    "flash": "context", "ulysses": "ulysses", "tokamax_ring": "ring",
    "ulysses_ring": "ulysses x ring"}
"""MaxDiffusion's ``attention`` values and the role that splits the sequence (``flash``:
queries sharded, K/V gathered; ``tokamax_ring``: its ring kernel, plain ``ring`` is not
registered; ``ulysses_ring``: Ulysses inside, ring across, ``ulysses_shards`` Ulysses deep).
``tokamax_flash`` shards as ``flash`` does (another kernel, the same program here)."""
MAXDIFFUSION_KEYS = ("ici_data_parallelism", "ici_fsdp_parallelism", "ici_context_parallelism",
                     "ici_tensor_parallelism", "attention", "ulysses_shards",
                     "allow_split_physical_axes", "ulysses_attention_chunks", "flags")
"""The config keys :func:`maxdiffusion_setup` reads (``flags``: its ``LIBTPU_INIT_ARGS``)."""
XDIT_KEYS = ("ulysses_size", "ring_size", "dit_fsdp", "flags")
"""The ``generate.py`` flags :func:`xdit_setup` reads."""


class SystemRefuses(AoizoraError):
    """A system's own rules (its asserts, its config checks) or the library it builds its
    mesh with refuse a recipe on this slice. Building a setup raises only this for a refusal;
    anything else is a bug and propagates."""


@dataclass(frozen=True)
class Setup:
    """One configuration a system (or a user) runs."""

    system: str
    """``maxdiffusion``, ``xdit-usp`` or ``user``."""
    recipe: str
    """In the system's own words: ``ici_data_parallelism=2 ici_context_parallelism=4
    attention=flash``, ``--ulysses_size 2 --ring_size 4 --dit_fsdp``."""
    candidate: Candidate
    """Its logical sharding in our terms."""
    placement: Placement
    """Its device order (what the system's mesh construction gives)."""
    flags: CompilerFlags
    """The compiler flags it compiles with: its recipe's, less any in ``dropped``."""
    note: str = ""
    """What was changed to build it, or how it differs from the real system."""
    dropped: tuple[DroppedFlag, ...] = ()
    """The flags of its recipe's set left out because the compile with them failed here
    (:func:`with_fallbacks`); empty: compiled as its recipe sets them."""

    @property
    def flagless(self) -> bool:
        """A recipe's try with every one of its flags left out (:func:`with_fallbacks`' test
        of whether the flags are to blame)."""
        return bool(self.dropped) and not self.flags.args


@dataclass(frozen=True)
class DroppedFlag:
    """A flag of a recipe's set that broke its compile here, left out (the rest kept)."""

    flag: str
    """The ``--name=value`` word left out."""
    status: CompileStatus
    """How the compile with the recipe's whole set ended (``crash`` or ``error``)."""
    message: str
    """The first line of the compiler's message (or of the crash's)."""


# ----------------------------------------------------------------------------- MaxDiffusion


def maxdiffusion_setup(workload: Workload, topology: Topology, *,
                       ici_data_parallelism: int = 1, ici_fsdp_parallelism: int = 1,
                       ici_context_parallelism: int = -1, ici_tensor_parallelism: int = 1,
                       attention: str = "flash", ulysses_shards: int = -1,
                       allow_split_physical_axes: bool = False,
                       ulysses_attention_chunks: int = 1,
                       flags: str | CompilerFlags | None = None) -> Setup:
    """What MaxDiffusion runs for these config keys (defaults: what its Wan configs ship).

    Follows ``max_utils.create_device_mesh``: one ``-1`` is filled with the devices left; the
    ICI list ``[data, fsdp, context, tensor]`` goes to ``mesh_utils.create_device_mesh``. The
    batch of two CFG passes is sharded over ``data x fsdp``; weights over ``context`` and
    ``fsdp`` (and ``tensor`` for heads / MLP). ``flags`` default to the README's for the
    kernel. ``ulysses_attention_chunks`` splits a Ulysses kernel's heads into chunks, at most
    one per group of Ulysses-many heads (MaxDiffusion caps it there); other kernels ignore it.
    Raises :class:`SystemRefuses` where MaxDiffusion would refuse, quoting its rule.

    Example: ``ici_data_parallelism=2`` on ``v5e:2x4`` gives the mesh (2, 1, 4, 1) and the
    candidate ``cfg2-ctx4-fsdpseq`` (weights sharded 4 ways, over context only).
    """
    ici = _ici_axes({"data": ici_data_parallelism, "fsdp": ici_fsdp_parallelism,
                     "context": ici_context_parallelism, "tensor": ici_tensor_parallelism},
                    topology)
    if attention not in MAXDIFFUSION_KERNELS:
        raise SystemRefuses(f"MaxDiffusion attention={attention!r}: one of "
                            f"{sorted(MAXDIFFUSION_KERNELS)} (tokamax_flash shards as flash).")
    batch = ici["data"] * ici["fsdp"]
    if batch > workload.batch:
        raise SystemRefuses(f"MaxDiffusion data x fsdp = {batch} shards a batch of "
                            f"{workload.batch} (the CFG passes); use at most {workload.batch}.")
    heads = workload.config().num_heads
    context = ici["context"]
    if attention == "ulysses_ring":
        if not is_whole(ulysses_shards, 1) or context % ulysses_shards:
            raise SystemRefuses(
                f"MaxDiffusion ulysses_ring: ulysses_shards={ulysses_shards!r} must be a "
                f"positive divisor of the context axis {context}.")
        uly, ring = ulysses_shards, context // ulysses_shards
    else:
        uly = context if attention == "ulysses" else 1
        ring = context if attention == "tokamax_ring" else 1
    if heads % (uly * ici["tensor"]):
        raise SystemRefuses(
            f"MaxDiffusion {attention}: {heads} heads do not divide by the Ulysses shards "
            f"{uly} x tensor {ici['tensor']} (it fails fast instead of padding heads).")
    if not is_whole(ulysses_attention_chunks):
        raise SystemRefuses(f"MaxDiffusion ulysses_attention_chunks="
                            f"{ulysses_attention_chunks!r}: a whole number >= 1.")
    chunks = len(ulysses_head_chunks(heads // ici["tensor"], uly, ulysses_attention_chunks)
                 ) if uly > 1 else 1  # capped at a chunk per head group, as MaxDiffusion caps
    degrees = {"cfg": batch, "ulysses": uly, "ring": ring, "tp": ici["tensor"],
               "context": context if attention == "flash" else 1}
    candidate = Candidate.from_degrees(degrees, fsdp=context * ici["fsdp"] > 1,
                                       attention=default_attention(topology),
                                       fsdp_over_cfg=ici["fsdp"] > 1, ulysses_chunks=chunks)
    shape = (ici["data"], ici["fsdp"], context, ici["tensor"])
    mesh, note = _maxdiffusion_mesh(shape, topology, allow_split_physical_axes)
    if ici["tensor"] > 1:
        note = "; ".join(filter(None, [note, (
            "its attention ignores the tensor axis (repeated on each of the "
            f"{ici['tensor']} tensor shards); rebuilt with heads split over it")]))
    # Mesh (data, fsdp, context, tensor) -> our axes (cfg, ulysses, ring, context, tp); the
    # context axis of ulysses_ring is (ring, ulysses) with Ulysses innermost (row-major).
    grid = np.asarray(mesh.order).reshape(batch, ring, uly, context // (ring * uly),
                                          ici["tensor"])
    order = grid.transpose(0, 2, 1, 3, 4).ravel()
    recipe = " ".join([*(f"ici_{k}_parallelism={v}" for k, v in ici.items()
                         if v != 1 or k == "context"), f"attention={attention}",
                       *([f"ulysses_shards={uly}"] if attention == "ulysses_ring" else []),
                       *([f"ulysses_attention_chunks={chunks}"] if chunks > 1 else []),
                       *(["allow_split_physical_axes=True"] if allow_split_physical_axes
                         else [])])
    chosen = compiler_flags(flags if flags is not None else
                            "maxdiffusion-ulysses" if uly > 1 else "maxdiffusion-wan")
    return Setup("maxdiffusion", recipe, candidate, Placement(order, mesh.description),
                 chosen, note)


def _ici_axes(ici: dict[str, int], topology: Topology) -> dict[str, int]:
    """MaxDiffusion's ICI degrees with its one ``-1`` filled (``fill_unspecified_mesh_axes``),
    checked as it checks them."""
    n = topology.num_devices
    bad = {f"ici_{k}_parallelism": v for k, v in ici.items()
           if not (v == -1 or is_whole(v, 1))}
    if bad:
        raise SystemRefuses(f"MaxDiffusion config {bad}: each ici_*_parallelism is a whole "
                            "number >= 1, or -1 for 'the devices left' (at most one -1).")
    unknown = [k for k, v in ici.items() if v == -1]
    if len(unknown) > 1:
        raise SystemRefuses(f"MaxDiffusion fills at most one -1 (fill_unspecified_mesh_axes); "
                            f"ici {ici} has {len(unknown)}: set all but one.")
    known = math.prod(v for v in ici.values() if v != -1)
    if unknown:
        if n % known:
            raise SystemRefuses(f"MaxDiffusion ici {ici}: {n} devices do not divide by "
                                f"{known}.")
        ici = {**ici, unknown[0]: n // known}
    if math.prod(ici.values()) != n:
        raise SystemRefuses(f"MaxDiffusion ici {ici} multiplies to {math.prod(ici.values())}, "
                            f"not the {n} devices of {topology.name}.")
    return ici


def _maxdiffusion_mesh(shape: tuple[int, ...], topology: Topology, allow_split: bool
                       ) -> tuple[Placement, str]:
    """Where ``mesh_utils.create_device_mesh`` puts MaxDiffusion's mesh, and a note: where it
    refuses the shape unsplit, a MaxDiffusion user sets ``allow_split_physical_axes=True``."""
    try:
        return create_device_mesh_order(shape, topology, allow_split=allow_split), ""
    except LibraryRefuses as err:
        if allow_split:
            raise SystemRefuses(f"MaxDiffusion's mesh: {err}") from err
        note = (f"create_device_mesh{shape} refuses with allow_split_physical_axes=False "
                f"({str(err)[:90]}...); built with allow_split_physical_axes=True, as a "
                "MaxDiffusion user would set")
    try:
        return create_device_mesh_order(shape, topology, allow_split=True), note
    except LibraryRefuses as again:
        raise SystemRefuses(f"MaxDiffusion's mesh: {again}") from again


def maxdiffusion_recipes(workload: Workload, topology: Topology
                         ) -> list[dict[str, Any]]:
    """The config keys of every MaxDiffusion recipe x kernel on ``topology``: context over
    every chip (the shipped default) and, with guidance, ``ici_data_parallelism=2`` (its
    published Wan recipes), each also with ``ici_tensor_parallelism=2``
    (:data:`MAXDIFFUSION_TENSOR`); ``flash``, ``ulysses``, ``tokamax_ring`` and
    ``ulysses_ring`` with each ``ulysses_shards`` between 2 and context / 2; without tensor
    parallelism, ``ulysses`` in 2 chunks too (``ulysses_attention_chunks=2``)."""
    n = topology.num_devices
    heads = workload.config().num_heads
    recipes = []
    for data in (1, 2) if workload.batch >= 2 and n % 2 == 0 else (1,):
        for tensor in MAXDIFFUSION_TENSOR:
            if n % (data * tensor) or heads % tensor:
                continue
            context = n // (data * tensor)
            base = {"ici_data_parallelism": data,
                    **({"ici_tensor_parallelism": tensor} if tensor > 1 else {})}
            for attention in ("flash", "ulysses", "tokamax_ring"):
                recipes.append({**base, "attention": attention})
            if tensor == 1:  # the README's example value (it shows 2 and 5)
                recipes.append({**base, "attention": "ulysses", "ulysses_attention_chunks": 2})
            for shards in range(2, context // 2 + 1):
                if context % shards == 0:
                    recipes.append({**base, "attention": "ulysses_ring",
                                    "ulysses_shards": shards})
    return recipes


MAXDIFFUSION_TENSOR = (1, 2)
"""``ici_tensor_parallelism`` values of :func:`maxdiffusion_recipes`. Its Wan configs and
README ship 1; 2 is the degree the planner's tensor-parallel plans use. MaxDiffusion's attention
ignores the tensor axis (for Wan, ``attention_sharding_uniform`` maps the attention heads to
no mesh axis), so its real program repeats attention on each tensor shard; the rebuild splits
heads over it, ``tensor`` times fewer attention FLOPs per chip than the real program."""

MAXDIFFUSION_UNBUILT: tuple[tuple[str, str], ...] = (
    ("attention=ulysses_ring_custom", "rebuilt as attention=ulysses_ring: the same all-to-alls "
     "inside and ring hops across (R - 1 ppermutes, the last rotation skipped, as here); its "
     "custom splash kernel differs in tiles, which the model prices at one attention "
     "efficiency"),
    ("attention=ulysses_ring_custom_fixed_m", "not rebuilt: ulysses_ring_custom with a fixed "
     "softmax bound (a pmax and an all-gather of norms more, a faster kernel); the model "
     "prices kernels by FLOPs, so it would price the kernel change as nothing and the extra "
     "collectives as a loss"),
    ("attention=ulysses_ring_custom_bidir", "not rebuilt: a ring without wraparound run as two "
     "one-hop streams with about twice the attention work; not modelled"),
    ("attention=ulysses_ring ulysses_attention_chunks=N", "not tried: chunks are tried with "
     "attention=ulysses (2 chunks, the README's example), where every all-to-all is one; each "
     "ulysses_ring recipe in chunks would be one more compile per recipe"),
)
"""MaxDiffusion options a user may set that are no separate setup here, each with why."""


# ----------------------------------------------------------------------------- xDiT / Wan


def xdit_setup(workload: Workload, topology: Topology, *, ulysses_size: int = 1,
               ring_size: int = 1, dit_fsdp: bool = False,
               flags: str | CompilerFlags | None = None) -> Setup:
    """What the official Wan 2.1 ``generate.py --ulysses_size U --ring_size R [--dit_fsdp]``
    runs (on xDiT's USP): raises :class:`SystemRefuses` where its asserts would fail.

    Ranks are the devices in plain order; yunchang (``use_ulysses_low``) makes Ulysses groups
    of consecutive ranks (``{0, 1}, {2, 3}, ...`` for U = 2) and ring groups strided by U. The
    token axis is padded to a multiple of U x R (``text2video.py``: ``seq_len = ceil(seq_len /
    sp_size) * sp_size``).
    """
    n = topology.num_devices
    for name, value in (("ulysses_size", ulysses_size), ("ring_size", ring_size)):
        if not is_whole(value, 1):
            raise SystemRefuses(f"Wan generate.py --{name}={value!r}: a whole number >= 1.")
    if ulysses_size * ring_size != n:
        raise SystemRefuses(
            f"Wan generate.py asserts ulysses_size x ring_size == world size: {ulysses_size} x "
            f"{ring_size} != {n} devices of {topology.name}.")
    heads = workload.config().num_heads
    if heads % ulysses_size:
        raise SystemRefuses(f"Wan generate.py asserts num_heads % ulysses_size == 0: {heads} "
                            f"heads, --ulysses_size {ulysses_size}.")
    candidate = Candidate.from_degrees({"ulysses": ulysses_size, "ring": ring_size},
                                       fsdp=bool(dit_fsdp) and n > 1,
                                       attention=default_attention(topology))
    # rank = r * U + u; our axes are (ulysses, ring).
    order = np.arange(n).reshape(ring_size, ulysses_size).T.ravel()
    recipe = (f"--ulysses_size {ulysses_size} --ring_size {ring_size}"
              + (" --dit_fsdp" if dit_fsdp else ""))
    pad = -workload.tokens % n
    note = (f"{workload.tokens:,} tokens padded by {pad} to {workload.tokens + pad:,}"
            if pad else "")
    return Setup("xdit-usp", recipe, candidate,
                 Placement(tuple(int(i) for i in order), "launch (rank) order, Ulysses inner"),
                 compiler_flags(flags), note)


def xdit_recipes(workload: Workload, topology: Topology) -> list[dict[str, Any]]:
    """Every ``--ulysses_size`` x ``--ring_size`` split of the devices, with and without
    ``--dit_fsdp`` (the official 14B commands set it)."""
    n = topology.num_devices
    return [{"ulysses_size": u, "ring_size": n // u, "dit_fsdp": fsdp}
            for u in range(1, n + 1) if n % u == 0 for fsdp in (False, True)]


# ----------------------------------------------------------------------------- a user's setup


def user_setup(spec: Any, workload: Workload, topology: Topology) -> Setup:
    """A user's own configuration as a :class:`Setup`. ``spec`` is one of:

    - MaxDiffusion config keys, as a mapping or ``"ici_data_parallelism=2
      ici_context_parallelism=4 attention=ulysses"`` (:data:`MAXDIFFUSION_KEYS`);
    - Wan / xDiT flags, ``"--ulysses_size 2 --ring_size 4 --dit_fsdp"`` or a mapping of
      :data:`XDIT_KEYS`;
    - a mesh with roles and a device order: ``{"candidate": "cfg2-uly4-fsdp", "order": [0, 1,
      ...]}`` (order: physical device of each logical device; default plain order;
      ``flags`` optional);
    - a :class:`Setup`.
    """
    if isinstance(spec, Setup):
        return spec
    keys = setup_keys(spec)
    if "candidate" in keys:
        extra = set(keys) - {"candidate", "order", "flags"}
        if extra:
            raise AoizoraError(f"Setup {spec!r}: unknown key(s) {sorted(extra)}; a mesh setup "
                               "has 'candidate', 'order' and 'flags'.")
        candidate = Candidate.from_name(str(keys["candidate"]),
                                        attention=default_attention(topology))
        order = keys.get("order")
        placement = (plain_order(topology) if order is None else
                     Placement(tuple(_ints(order)), "your device order"))
        if len(placement) != topology.num_devices:
            raise AoizoraError(f"Setup order has {len(placement)} devices; {topology.name} has "
                               f"{topology.num_devices}.")
        return Setup("user", f"{candidate.name} in {placement.description}", candidate,
                     placement, compiler_flags(keys.get("flags")))
    if set(keys) <= set(XDIT_KEYS) and {"ulysses_size", "ring_size"} & set(keys):
        return _as_user(xdit_setup(workload, topology, **keys))
    if set(keys) <= set(MAXDIFFUSION_KEYS):
        return _as_user(maxdiffusion_setup(workload, topology, **keys))
    raise AoizoraError(
        f"Setup {spec!r}: keys {sorted(keys)} are neither MaxDiffusion config keys "
        f"{list(MAXDIFFUSION_KEYS)} nor Wan generate.py flags {list(XDIT_KEYS)} nor a mesh "
        "{'candidate': 'cfg2-uly4-fsdp', 'order': [...]}; e.g. "
        "'ici_data_parallelism=2 ici_context_parallelism=4 attention=flash' or "
        "'--ulysses_size 2 --ring_size 4'.")


def _as_user(setup: Setup) -> Setup:
    return Setup("user", f"{setup.system}: {setup.recipe}", setup.candidate, setup.placement,
                 setup.flags, setup.note)


def _ints(values: Any) -> list[int]:
    if isinstance(values, str):
        values = values.replace(",", " ").split()
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        raise AoizoraError(f"Setup order {values!r} must list device indices, e.g. "
                           "[0, 1, 4, 5, 2, 3, 6, 7].") from None


def setup_keys(spec: Any) -> dict[str, Any]:
    """A setup's keys from a mapping or a string of ``key=value`` / ``--flag value`` /
    ``--flag`` words: ``"ici_data_parallelism=2 attention=flash"`` -> ``{"ici_data_parallelism":
    2, "attention": "flash"}`` (numbers and true / false read as such)."""
    if isinstance(spec, Mapping):
        return {str(k).lstrip("-"): v for k, v in spec.items()}
    if not isinstance(spec, str) or not spec.strip():
        raise AoizoraError(f"Setup {spec!r}: give config keys, Wan flags or a mesh (see "
                           "baselines.user_setup).")
    words, keys = spec.split(), {}
    i = 0
    while i < len(words):
        word = words[i]
        if "=" in word and not word.startswith("--"):
            key, value = word.split("=", 1)
            keys[key] = _value(value)
        elif word.startswith("--") and "=" in word:
            key, value = word[2:].split("=", 1)
            keys[key] = _value(value)
        elif word.startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--"):
            keys[word[2:]] = _value(words[i + 1])
            i += 1
        elif word.startswith("--"):
            keys[word[2:]] = True
        else:
            raise AoizoraError(f"Setup {spec!r}: cannot read {word!r}; write key=value or "
                               "--flag value.")
        i += 1
    return keys


def _value(text: str) -> Any:
    lowered = text.strip().strip("'\"")
    if lowered.lower() in ("true", "false"):
        return lowered.lower() == "true"
    try:
        return int(lowered)
    except ValueError:
        return lowered


# ----------------------------------------------------------------------------- outcomes


class Status(enum.Enum):
    """How far a baseline got."""

    OK = "ok"
    """Built, compiled and priced: it has a plan."""
    NOT_BUILT = "not built"
    """The system refuses every setup of it (reason says why)."""
    NOT_COMPILED = "not compiled"
    """Built, but no setup's compile produced a program (reason has the compile status)."""


@dataclass(frozen=True)
class Trial:
    """One setup a system was tried with, and how it fared."""

    system: str
    """The outcome it belongs to (one of :data:`SYSTEMS` or :data:`USER`)."""
    recipe: str
    """The setup in the system's words."""
    setup: Setup | None
    """The setup (``None``: refused)."""
    estimate_s: float = math.nan
    """Pruning's IR estimate of its candidate (NaN: none)."""
    total_s: float = math.nan
    """Its predicted step where compiled (NaN: not compiled)."""
    reason: str = ""
    """Why it was refused, not compiled or not ranked high enough to compile."""
    compile_status: CompileStatus | None = None
    """How its compile ended (``None``: refused, or not run)."""
    not_run: NotRunReason | None = None
    """Why the plan did not run its compile (``None``: it ran, or it was refused)."""


@dataclass(frozen=True)
class BaselineOutcome:
    """One existing system (or the user's setup): its best setup and priced plan."""

    name: str
    """One of :data:`SYSTEMS` or :data:`USER`."""
    status: Status
    """How far it got."""
    setup: Setup | None = None
    """The chosen setup (``None`` when not built)."""
    plan: Plan | None = None
    """The priced plan (``ok`` only)."""
    reason: str = ""
    """Why it is not ``ok``."""
    trials: tuple[Trial, ...] = ()
    """Every setup tried for it."""

    @property
    def candidate(self) -> Candidate | None:
        """The chosen setup's candidate."""
        return self.setup.candidate if self.setup else None

    @property
    def placement(self) -> Placement | None:
        """The chosen setup's device order."""
        return self.setup.placement if self.setup else None

    @property
    def unstarted(self) -> tuple[str, ...]:
        """Recipes of its setups a time limit left uncompiled: ``plan`` then priced this
        system on the others, so its step may be slower than its best."""
        return tuple(t.recipe for t in self.trials if t.not_run is not None)


class Baselines(Records[BaselineOutcome]):
    """Every existing system's outcome (and the user's setup), in :data:`SYSTEMS` order.
    ``plan_s`` (the plan's predicted step) gives :meth:`to_frame` ``speedup_of_plan``."""

    COLUMNS = ("baseline", "recipe", "candidate", "placement", "flags", "dropped_flags",
               "status", "compute_s", "comm_s", "total_s", "speedup_of_plan", "note", "reason")

    def __init__(self, items: Iterable[BaselineOutcome] = (), *,
                 plan_s: float | None = None) -> None:
        super().__init__(items)
        self.plan_s = plan_s

    def __contains__(self, name: object) -> bool:
        return any(o.name == name for o in self)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str):
            for outcome in self:
                if outcome.name == index:
                    return outcome
            raise KeyError(f"No baseline {index!r}; baselines: {[o.name for o in self]}.")
        return super().__getitem__(index)

    @property
    def plans(self) -> dict[str, Plan]:
        """The priced outcomes as plans, by name."""
        return {o.name: o.plan for o in self if o.plan is not None}

    def trials(self) -> Any:
        """Every setup tried, one row each: ``baseline``, ``recipe``, ``candidate``,
        ``flags``, ``dropped_flags`` (its recipe's flags left out, and the failure that left
        them out), ``estimate_s``,
        ``total_s``, ``chosen``, ``reason``."""
        import pandas as pd

        rows = [{"baseline": o.name, "recipe": t.recipe,
                 "candidate": t.setup.candidate.name if t.setup else "-",
                 "flags": t.setup.flags.label if t.setup else "-",
                 "dropped_flags": _dropped(t.setup),
                 "estimate_s": t.estimate_s, "total_s": t.total_s,
                 "chosen": o.setup is not None and t.setup == o.setup, "reason": t.reason}
                for o in self for t in o.trials]
        return pd.DataFrame(rows, columns=["baseline", "recipe", "candidate", "flags",
                                           "dropped_flags", "estimate_s", "total_s", "chosen",
                                           "reason"])

    def row(self, item: BaselineOutcome) -> dict[str, Any]:
        predicted = item.plan.predicted if item.plan else None
        setup = item.setup
        return {"baseline": item.name, "recipe": setup.recipe if setup else "-",
                "candidate": setup.candidate.name if setup else "-",
                "placement": setup.placement.description if setup else "-",
                "flags": setup.flags.label if setup else "-",
                "dropped_flags": _dropped(setup), "status": item.status.value,
                "compute_s": predicted.compute_s if predicted else math.nan,
                "comm_s": predicted.comm_s if predicted else math.nan,
                "total_s": predicted.total_s if predicted else math.nan,
                "speedup_of_plan": (predicted.total_s / self.plan_s
                                    if predicted and self.plan_s else math.nan),
                "note": setup.note if setup else "", "reason": item.reason}


def _dropped(setup: Setup | None) -> str:
    """The flags ``setup`` leaves out and why (one compile broke for all of them)."""
    if setup is None or not setup.dropped:
        return ""
    why = setup.dropped[0]
    return " ".join(d.flag for d in setup.dropped) + f" ({why.status}: {why.message})"


def system_setups(name: str, workload: Workload, topology: Topology
                  ) -> list[Setup | tuple[str, str]]:
    """Every setup of system ``name`` (one of :data:`SYSTEMS`): a :class:`Setup`, or
    ``(recipe, reason)`` where the system refuses it."""
    def config_words(keys: dict[str, Any]) -> str:
        return " ".join(f"{k}={v}" for k, v in keys.items()) or "the shipped config"

    def flag_words(keys: dict[str, Any]) -> str:
        return " ".join(f"--{k}" if v is True else f"--{k} {v}" for k, v in keys.items()
                        if v is not False)

    if name == "maxdiffusion-default":
        return _built([{}], lambda keys: maxdiffusion_setup(workload, topology, **keys),
                      config_words)
    if name == "maxdiffusion-best":  # a recipe the chunk cap makes another's is dropped
        return [*dict.fromkeys(_built(maxdiffusion_recipes(workload, topology),
                                      lambda keys: maxdiffusion_setup(workload, topology,
                                                                      **keys),
                                      config_words)), *MAXDIFFUSION_UNBUILT]
    if name == "xdit-usp":
        return _built(xdit_recipes(workload, topology),
                      lambda keys: xdit_setup(workload, topology, **keys), flag_words)
    raise AoizoraError(f"No system {name!r}; systems are {list(SYSTEMS)}.")


def _built(recipes: list[dict[str, Any]], build: Callable[..., Setup],
           words: Callable[[dict[str, Any]], str]) -> list[Setup | tuple[str, str]]:
    out: list[Setup | tuple[str, str]] = []
    for keys in recipes:
        try:
            out.append(build(keys))
        except SystemRefuses as err:
            out.append((words(keys), str(err)))
    return out


@dataclass(frozen=True)
class SystemSetups:
    """What one existing system (or the user) would run here, before anything compiles."""

    name: str
    """One of :data:`SYSTEMS` or :data:`USER`."""
    trials: tuple[Trial, ...]
    """Setups refused before compiling (the system refuses the recipe, the candidate is not
    valid here, its IR trace failed)."""
    setups: tuple[Setup, ...]
    """The setups to compile, best IR estimate first (the estimate orders, it never
    chooses: every one is compiled in a full plan)."""


def baseline_setups(workload: Workload, topology: Topology, pruning: Pruning, *,
                    compare: Any = None, systems: bool = True) -> list[SystemSetups]:
    """Every system's setups (none with ``systems=False``) and ``compare``'s (see
    :func:`user_setup`), in :data:`SYSTEMS` order, each system's best IR estimate first."""
    valid = {c.name for c in explain_candidates(workload, topology).valid}
    groups = [(name, system_setups(name, workload, topology))
              for name in (SYSTEMS if systems else ())]
    if compare is not None:
        groups.append((USER, [user_setup(compare, workload, topology)]))
    out = []
    for name, setups in groups:
        trials, ranked = [], []
        for s in setups:
            if not isinstance(s, Setup):
                trials.append(Trial(name, s[0], None, reason=s[1]))
                continue
            estimate = estimate_of(pruning, s.candidate, s.flags)
            traced = pruned_as(s.candidate).name  # a chunked setup: its unchunked twin
            if name != USER and (traced not in valid or math.isnan(estimate)):
                trials.append(Trial(name, s.recipe, s, estimate, reason=(
                    "not a valid candidate here (over HBM or unsplittable)"
                    if traced not in valid else "its IR trace failed")))
                continue
            ranked.append((estimate, s))
        out.append(SystemSetups(name, tuple(trials), tuple(
            s for _, s in sorted(ranked, key=lambda pair: pair[0]))))
    return out


def with_fallbacks(setups: Sequence[SystemSetups], outcomes: Mapping[tuple[str, str], Outcome]
                   ) -> list[SystemSetups]:
    """``setups``, with what a system's user tries when a recipe's flags fail to compile
    (``crash`` or ``error``: libtpu refuses asynchronous all-to-all on "limited ICI", e.g.
    ``v5e:8x8``, and aborts some compiles at 64 chips): the recipe's flags less the last (the
    README's Ulysses section adds the all-to-all flag last); then, if that fails too, with no
    flags, which says whether the flags are to blame (a program that fails without them gets
    no further try: failures are not cached, so every try is paid again on each plan); then
    less each other flag in turn, up to the first that compiles, which then stands for the
    recipe instead of the flagless try (:func:`score_baselines`; the system still takes its
    fastest setup). Each try is one more setup
    whose :attr:`Setup.dropped` says which flags it leaves out and why.

    Call it again as outcomes arrive: each call adds the next try of every recipe whose
    tries so far failed, and stops a recipe at a try not run (a time limit). Example: a
    ``maxdiffusion-ulysses`` recipe that fails once yields the same recipe with
    ``maxdiffusion-wan`` (less ``--xla_tpu_enable_async_all_to_all``); if that compiles, no
    other try follows.
    """
    out = []
    for group in setups:
        tried = list(group.setups)
        for s in group.setups:
            if not s.dropped:
                tried.extend(_flag_tries(s, outcomes))
        out.append(replace(group, setups=tuple(dict.fromkeys(tried))))
    return out


def _flag_tries(setup: Setup, outcomes: Mapping[tuple[str, str], Outcome]) -> list[Setup]:
    """The tries of ``setup`` with fewer flags so far, the next one last: its last flag left
    out; then no flags, which says whether the flags break it at all (if that fails too, no
    try follows); then each other flag left out in turn, up to the first that compiles (which
    then runs instead of the flagless try: :func:`_scored`)."""
    failed = _failure(outcomes.get((setup.candidate.name, setup.flags.label)))
    if failed is None or not setup.flags.args:
        return []
    words = setup.flags.words
    status, message = failed
    tries = [_less(setup, words[-1:], status, message)]
    if len(words) > 1:
        tries += [_less(setup, words, status, message),
                  *(_less(setup, (word,), status, message) for word in reversed(words[:-1]))]
    out = []
    for i, attempt in enumerate(tries):
        out.append(attempt)
        outcome = outcomes.get((attempt.candidate.name, attempt.flags.label))
        if i == 1:  # no flags: go on only where that compiled (the flags are to blame)
            if not (isinstance(outcome, CompiledCandidate)
                    and outcome.status is CompileStatus.OK):
                break
        elif _failure(outcome) is None:
            break  # compiled, or not run (yet): no further try
    return out


def _failure(outcome: Outcome | None) -> tuple[CompileStatus, str] | None:
    """A compile's failure that fewer flags might mend (``None``: anything else)."""
    if (isinstance(outcome, CompiledCandidate)
            and outcome.status in (CompileStatus.CRASH, CompileStatus.ERROR)):
        return outcome.status, outcome.message.split("\n")[0][:160]
    return None


def _less(setup: Setup, words: tuple[str, ...], status: CompileStatus, message: str) -> Setup:
    flags = setup.flags
    for word in words:
        flags = flags.without(word)
    every = len(words) == len(setup.flags.words)
    left_out = "its LIBTPU_INIT_ARGS" if every else f"LIBTPU_INIT_ARGS less {words[0]}"
    return replace(
        setup, recipe=f"{setup.recipe} ({'without ' if every else ''}{left_out})",
        flags=flags, dropped=tuple(DroppedFlag(w, status, message) for w in words),
        note="; ".join(filter(None, [setup.note, (
            f"its {setup.flags.label} flags failed to compile here ({status}: {message}); "
            + ("tried without any, to see whether the flags are to blame" if every else
               f"tried less {words[0]}, as a user would"))])))


def score_baselines(workload: Workload, topology: Topology, pruning: Pruning,
                    setups: Sequence[SystemSetups],
                    outcomes: Mapping[tuple[str, str], Outcome], *,
                    options: ModelOptions | None = None) -> Baselines:
    """Price every system's ``setups`` (:func:`baseline_setups`, :func:`with_fallbacks`) from
    the ``outcomes`` of their compiles, by key (every setup's compile is there, run or not).

    A system takes the fastest predicted step of its setups that compiled, a recipe's try
    without any of its flags only where no try keeping some of them compiled (a user runs
    the recipe with every flag that works); the IR estimate is reported, never used to
    choose. A setup refused before compiling, one whose compile
    failed and one the plan did not run (a time-limited plan's) are trials with that reason:
    the system is then priced on the setups compiled (:attr:`BaselineOutcome.unstarted` names
    those not run). ``options``: the ICI model they are priced under (the plan's).
    """
    return Baselines(_scored(group, workload, topology, pruning, outcomes, options)
                     for group in setups)


def _scored(group: SystemSetups, workload: Workload, topology: Topology, pruning: Pruning,
            outcomes: Mapping[tuple[str, str], Outcome],
            options: ModelOptions | None) -> BaselineOutcome:
    name, trials, priced = group.name, list(group.trials), []
    for s in group.setups:
        outcome = outcomes[s.candidate.name, s.flags.label]
        estimate = estimate_of(pruning, s.candidate, s.flags)
        if isinstance(outcome, NotRun):
            trials.append(Trial(name, s.recipe, s, estimate, reason=outcome.message,
                                not_run=outcome.reason))
        elif outcome.status is not CompileStatus.OK:
            trials.append(Trial(name, s.recipe, s, estimate,
                                reason=f"{outcome.status}: {outcome.message[:160]}",
                                compile_status=outcome.status))
        else:
            plan = Plan(workload, topology, s.candidate, s.placement,
                        predict(outcome.program, topology, s.placement, options=options),
                        outcome.program,
                        breakdown(outcome.program, topology, s.placement, options=options),
                        flags=s.flags)
            trials.append(Trial(name, s.recipe, s, estimate, plan.predicted.total_s,
                                compile_status=outcome.status))
            priced.append((s, plan))
    # A recipe's try without any flags is what its user runs only where no try keeping some
    # of them compiled (else the test of whether the flags are to blame).
    def recipe(s: Setup) -> tuple[str, tuple[int, ...]]:  # its tries share both
        return s.candidate.name, s.placement.order

    kept = {recipe(s) for s, _ in priced if s.dropped and not s.flagless}
    runs = [(s, p) for s, p in priced if not (s.flagless and recipe(s) in kept)]
    if runs:
        setup, plan = min(runs, key=lambda pair: pair[1].predicted.total_s)
        return BaselineOutcome(name, Status.OK, setup, plan, trials=tuple(trials))
    if group.setups:
        return BaselineOutcome(name, Status.NOT_COMPILED, group.setups[0], reason="; ".join(
            t.reason for t in trials if t.setup is not None)[:400], trials=tuple(trials))
    return BaselineOutcome(name, Status.NOT_BUILT, reason="; ".join(
        f"{t.recipe}: {t.reason}" for t in trials)[:600], trials=tuple(trials))


def estimate_of(pruning: Pruning, candidate: Candidate,
                flags: CompilerFlags | None = None) -> float:
    """``candidate``'s IR estimate in ``pruning`` (seconds; NaN where it has none; a chunked
    Ulysses candidate's is its unchunked twin's, :func:`~aoizora_lab.prune.pruned_as`): under
    ``flags`` (what they make asynchronous, ``IREstimate.estimate_under``), or its best over
    the searched flag sets (``None``)."""
    try:
        decision = pruning.decision_of(candidate)
    except (KeyError, AoizoraError):
        return math.nan
    if decision.estimate is None:
        return math.nan
    if flags is None:
        return decision.estimate.estimate_seconds
    return decision.estimate.estimate_under(flags.async_kinds)


# ----------------------------------------------------------------------------- the headline


@dataclass(frozen=True)
class Headline:
    """What the search gains, split by where it comes from (all predicted steps, seconds).

    The headline (:attr:`vs_existing`) is the search's own best, the best placement of a
    survivor of pruning, against each system's best: it falls below 1 where a system's
    setup beats everything the search found itself. The recommended plan (:attr:`plan_s`)
    may then be that setup, placed by the search or in its own order."""

    plan_s: float
    """The recommended plan's step: the search's own best, or a system's setup where one is
    faster."""
    searched_s: float = math.nan
    """The search's own best step (NaN: taken as :attr:`plan_s`)."""
    systems: dict[str, float] = field(default_factory=dict)
    """Each existing system's best step (NaN: not built or not compiled)."""
    best_system: str = ""
    """The fastest existing system ("" when none was priced)."""
    plain_s: float = math.nan
    """The plan's compiled program in plain device order."""
    make_mesh_s: float = math.nan
    """... where ``jax.make_mesh`` puts it (NaN: it refuses the mesh)."""
    create_device_mesh_s: float = math.nan
    """... where ``mesh_utils.create_device_mesh`` puts it (NaN: it refuses)."""
    strategy_candidate: str = ""
    """The best compiled candidate (with its flags) in plain device order."""
    strategy_s: float = math.nan
    """Its step in plain order: the sharding choice without placement search (against the
    best system in its own library order, so that order's cost counts here too)."""
    partial: tuple[str, ...] = ()
    """Systems priced on only some of their setups (a time limit left the others
    uncompiled): their steps may be slower than their best, and the ratios flatter the plan."""
    unchecked: tuple[str, ...] = ()
    """Of those, the systems whose uncompiled setups could still win (pruning's lower bound
    does not rule them out): the headline is not known within the limit (NaN)."""

    @property
    def best_system_s(self) -> float:
        """The fastest existing system's step."""
        return self.systems.get(self.best_system, math.nan)

    @property
    def own_s(self) -> float:
        """The search's own best step (:attr:`searched_s`, or :attr:`plan_s` where not given)."""
        return self.plan_s if math.isnan(self.searched_s) else self.searched_s

    @property
    def vs_existing(self) -> float:
        """Best existing system / the search's own best: the headline (below 1 where a
        system wins; NaN where a time limit left a setup that could win uncompiled)."""
        return math.nan if self.unchecked else self.best_system_s / self.own_s

    @property
    def placement_gain(self) -> dict[str, float]:
        """The plan's program in plain / make_mesh / create_device_mesh order over its best
        placement."""
        return {"plain": self.plain_s / self.plan_s, "make_mesh": self.make_mesh_s / self.plan_s,
                "create_device_mesh": self.create_device_mesh_s / self.plan_s}

    @property
    def strategy_gain(self) -> float:
        """Best existing system / the best survivor in plain order."""
        return self.best_system_s / self.strategy_s

    def to_frame(self) -> Any:
        """One row per comparison: ``measures``, ``against``, ``seconds``, ``ratio``."""
        import pandas as pd

        def label(name: str) -> str:
            return f"{name} (partial: time limit)" if name in self.partial else name

        rows = [("vs existing systems", label(name), s, s / self.own_s)
                for name, s in self.systems.items()]
        best = (f"not known within the time limit ({', '.join(self.unchecked)}: setups that "
                "could win not compiled)" if self.unchecked
                else label(self.best_system or "none"))
        rows.append(("vs existing systems", f"best: {best}", self.best_system_s,
                     self.vs_existing))
        if self.plan_s < self.own_s:
            rows.append(("recommended plan", "a system's setup, faster than the search's own "
                         "best", self.plan_s, self.best_system_s / self.plan_s))
        rows += [("placement gain", f"plan's program in {how} order", self.plan_s * gain, gain)
                 for how, gain in self.placement_gain.items()]
        rows.append(("strategy gain", f"best existing / {self.strategy_candidate} in plain "
                     "order", self.strategy_s, self.strategy_gain))
        return pd.DataFrame(rows, columns=["measures", "against", "seconds", "ratio"])


def headline(best: Plan, searched: Plan, baselines: Baselines,
             compiled: Iterable[CompiledCandidate],
             could_win: Callable[[Candidate], bool] = lambda candidate: True, *,
             options: ModelOptions | None = None) -> Headline:
    """The :class:`Headline` of a plan: the search's own best (``searched``) against the
    existing systems, the recommended plan's placement gain (``best``'s program in library
    orders) and the strategy gain (the best of the survivors' programs, ``compiled``, in
    plain order against the best existing system). ``could_win``: whether a setup's
    candidate may still be the fastest (:meth:`~aoizora_lab.prune.Pruning.could_win`); a
    system with such a setup left uncompiled leaves the headline unknown. ``options``: the ICI
    model the library orders are priced under (the plan's)."""
    topology = best.topology
    systems = {o.name: o.plan.predicted.total_s if o.plan else math.nan
               for o in baselines if o.name in SYSTEMS}
    priced = {k: v for k, v in systems.items() if not math.isnan(v)}
    orders: dict[str, float] = {}
    shape, names = best.candidate.mesh_shape, best.candidate.axis_names
    for key, build in (("make_mesh", lambda: make_mesh_order(shape, names, topology)),
                       ("create_device_mesh", lambda: create_device_mesh_order(
                           shape, topology, allow_split=False))):
        try:
            orders[key] = predict(best.program, topology, build(), options=options).total_s
        except LibraryRefuses:
            orders[key] = math.nan
    plain = plain_order(topology)
    in_plain = [(predict(r.program, topology, plain, options=options).total_s, r)
                for r in compiled
                if r.status is CompileStatus.OK]
    strategy_s, top = min(in_plain, key=lambda pair: pair[0]) if in_plain else (math.nan, None)
    return Headline(
        best.predicted.total_s, searched.predicted.total_s, systems,
        min(priced, key=priced.get) if priced else "",
        predict(best.program, topology, plain, options=options).total_s, orders["make_mesh"],
        orders["create_device_mesh"],
        f"{top.candidate.name} ({top.flags.label} flags)" if top else "", strategy_s,
        tuple(o.name for o in baselines if o.name in SYSTEMS and o.unstarted),
        tuple(o.name for o in baselines if o.name in SYSTEMS and any(
            t.not_run is not None and t.setup is not None and could_win(t.setup.candidate)
            for t in o.trials)))
