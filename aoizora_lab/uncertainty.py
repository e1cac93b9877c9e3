"""How sure an answer is: the model's uncertain constants and choices, each with its source,
drawn together into an ensemble that prices the compiled programs again.

Every step the planner gives is a prediction from constants nobody measured for these
programs and choices public evidence does not settle. This module holds all of them, in one
place (:data:`SPREADS`, :data:`CHOICES`; nothing else changes a default):

- a :class:`Spread` is a constant's range, low to high, with its source (a published figure,
  the spread between published runs, or a documented assumption);
- a :class:`Choice` is a modelling choice with equally likely alternatives.

An :class:`Ensemble` draws every spread and choice together, ``count`` times from one seed,
the same draws for every program of a comparison (so a plan and a system are compared under
the same model, draw by draw). :func:`price` prices one compiled program on one placement
under all draws in one pass (:func:`aoizora_lab.cost.predict_draws`: the ICI estimate is
worked out once per choice of device-order model and kept on disk, each draw is array
arithmetic), so a plan's
uncertainty costs seconds, not compiles; placements are those the search found with the
default model, priced again per draw. :func:`assess` turns a plan into intervals: each
candidate's median and 80 % interval, against each system the probability that the plan is
faster and the interval of the speedup, and a robust choice beside the median winner.

A placement can win under one modelling choice and lose under another: under the
``"compiler"`` order model an all-gather maps any device order onto its emitter's own ring,
under ``"logical"`` it runs along its group's order, so a placement that scrambles a
32-device gather's group costs nothing under the first and pays every long hop under the
second. So the plan's own program in the libraries' device orders (plain, ``jax.make_mesh``,
``create_device_mesh``: :func:`~aoizora_lab.placement.library_orders`) are options too: the
same sharding, and a robust choice where the search's placement is the risk.

Worked example: a plan whose step is 1.00 s and a system at 1.05 s under the default model.
If in 240 of 256 draws the plan is faster, ``P(plan faster) = 0.94``; if the speedup's 10th
and 90th percentiles are 0.99x and 1.08x, the 80 % interval straddles 1: the model's own
uncertainty could reverse the answer, and the table says so.

The attention kernel's efficiency is a constant per kernel (:data:`KERNELS`): every program
compiled here runs jax's splash attention (:data:`DEFAULT_KERNEL`), while a published run may
have run another (Tokamax's, MaxDiffusion's own ring kernel), so each kernel has
its own spread, drawn independently, and :meth:`Ensemble.constants` takes the kernel a
program stands for. A kernel's spread need not hold the chip's default efficiency, which is
the splash kernel's.

A constant that a calibration file or an override set is taken as known: its spread is not
drawn (:func:`known_constants`). Draws are uniform between ``low`` and ``high``, or
log-uniform where the range spans a factor of 3 or more. Several defaults lie at an end of
their range (the compiler's own pricing, or the book's figure, as the only published value on
that side), so an ensemble's median need not be the default model's step, which can even lie
outside its own 80 % interval: the interval says where the step may be, the default what the
plan was searched with.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.cost import COMPUTE_MODELS, Constants, predict, predict_draws
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import ChipSpec, chip_spec, device_spec, load_calibration
from aoizora_lab.placement import library_orders
from aoizora_lab.records import Records
from aoizora_lab.topology import Topology

if TYPE_CHECKING:
    import pandas as pd

    from aoizora_lab.planner import PlanResult
    from aoizora_lab.realize import Plan


@dataclass(frozen=True)
class Spread:
    """One uncertain constant: where its true value is taken to lie, and why."""

    name: str
    """The :class:`~aoizora_lab.cost.Constants` field (a ``ChipSpec`` constant, or
    ``overlap`` of ``ModelOptions``)."""
    low: float
    """Lowest value (a multiple of the chip's value where :attr:`relative`)."""
    high: float
    """Highest value (likewise)."""
    source: str
    """Where the range comes from."""
    relative: bool = False
    """Whether :attr:`low` and :attr:`high` multiply the generation's default."""
    generations: tuple[str, ...] = ()
    """The generations it applies to (empty: all)."""
    kernel: str = ""
    """``attention_efficiency`` only: the attention kernel it is the efficiency of (a key of
    :data:`KERNELS`); empty for every other constant."""

    def __post_init__(self) -> None:
        if self.name not in Constants.__dataclass_fields__:
            raise AoizoraError(f"Spread {self.name!r}: not a cost.Constants field; use one of "
                               f"{sorted(Constants.__dataclass_fields__)}.")
        if (self.name == "attention_efficiency") != (self.kernel in KERNELS):
            raise AoizoraError(
                f"Spread {self.name!r} with kernel={self.kernel!r}: an attention_efficiency "
                f"spread names its kernel (one of {list(KERNELS)}), no other spread does.")
        if not 0 < self.low <= self.high:
            raise AoizoraError(f"Spread {self.name!r}: low={self.low!r}, high={self.high!r} "
                               "must satisfy 0 < low <= high.")

    @property
    def label(self) -> str:
        """The name, with the kernel for an attention efficiency: ``attention_efficiency
        (tokamax)``."""
        return f"{self.name} ({self.kernel})" if self.kernel else self.name

    @property
    def log(self) -> bool:
        """Drawn log-uniform (the range spans a factor of 3 or more) rather than uniform."""
        return self.high >= 3 * self.low

    def values(self, units: np.ndarray, default: float) -> np.ndarray:
        """The constant at quantiles ``units`` (in [0, 1)) of the range."""
        scale = default if self.relative else 1.0
        low, high = self.low * scale, self.high * scale
        if self.log:
            return np.exp(np.log(low) + units * (np.log(high) - np.log(low)))
        return low + units * (high - low)


@dataclass(frozen=True)
class Choice:
    """A modelling choice public evidence does not settle: its alternatives, equally likely."""

    name: str
    """``"compute_model"`` (:data:`aoizora_lab.cost.COMPUTE_MODELS`) or ``"order"``
    (``ModelOptions.order``)."""
    values: tuple[str, ...]
    """The alternatives."""
    source: str
    """Why these (and not others)."""

    def __post_init__(self) -> None:
        allowed = {"compute_model": COMPUTE_MODELS, "order": ("compiler", "logical", "physical")}
        if self.name not in allowed or not self.values or \
                not set(self.values) <= set(allowed[self.name]):
            raise AoizoraError(f"Choice {self.name!r} with {self.values!r}: choices are "
                               f"{ {k: list(v) for k, v in allowed.items()} }.")


KERNELS: dict[str, str] = {
    "splash": "jax's Pallas splash attention (jax.experimental.pallas.ops.tpu."
              "splash_attention): every program compiled here, and MaxDiffusion's flash and "
              "ulysses attention on every generation",
    "tokamax": "Tokamax's splash kernel (openxla/tokamax; copied into maxdiffusion/kernels/"
               "splash_attention by its PR #359): MaxDiffusion's tokamax_flash, and per ring hop "
               "its tokamax_ring and ulysses_ring",
    "ring-custom": "MaxDiffusion's own splash ring kernel (kernels/custom_splash_attention.py): "
                   "its ulysses_ring_custom (PR #430)",
}
"""The attention kernels with an efficiency of their own (module docstring)."""
DEFAULT_KERNEL = "splash"
"""The kernel the programs compiled here run."""

SCALING_BOOK = "the scaling book (jax-ml.github.io/scaling-book)"

SPREADS: tuple[Spread, ...] = (
    Spread("ici_link_bandwidth", 1.0, 10 / 9, relative=True, source=(
        "the two published one-way link figures: the scaling book's (4.5e10 B/s v5e, 9e10 "
        "v5p/v6e, the default) and the Google Cloud docs' per-chip totals over the ports "
        "(5e10, 1e11): 10/9 of the book's on every generation both give")),
    Spread("ici_efficiency", 0.83, 0.96, source=(
        f"{SCALING_BOOK}, sharding chapter: its profiled 8.4 MB-shard all-gather over 4 v5e "
        "chips (680 us against 560 us at nominal bandwidth) achieves 83 % of nominal with "
        "the 1 us hops priced (check G1 of the published measurements, so G1 is not "
        "independent of this range); about 95 % for 10 MB all-gathers on v5e 8x16 (the "
        "default); single-hop ppermutes of 86.3 / 86.8 GB/s on v5p / v6e, 96 % of the "
        "book's 9e10 (marin-community/marin issue #6736)")),
    Spread("ici_hop_latency", 0.5e-6, 1.9e-6, source=(
        f"{SCALING_BOOK}, sharding chapter: about 1 us per hop (the default), 1/2 us for v5e "
        "in an older text; its profiled 32 kB-shard all-gather over 4 v5e chips (\"closer to "
        "8us\" for 3 hops and 2.3 us of bytes) implies 1.9 us (check G2, likewise not "
        "independent)")),
    Spread("attention_efficiency", 0.36, 0.72, kernel="splash", source=(
        "what jax's splash kernel achieves, which the compiler does not estimate: "
        "splash attention on Wan 720p at 36 % of v6e's peak (head dim 128 on a 256-wide MXU; "
        "yangwhale/gpu-tpu-pedia, Wan2.2 TPU optimisation guide, a third-party profile); the "
        "highest floor a published Wan run implies (reports/benchmarks.md, 'Published "
        "measurements', attention_efficiency_floor: 0.72, the MaxDiffusion README's "
        "approximate ~20 s Ulysses gain on v6e-8, with the default model's other constants)")),
    Spread("attention_efficiency", 0.21, 0.34, kernel="tokamax", source=(
        "Tokamax's own splash microbenchmarks on TPU7x (openxla/tokamax, tokamax/_src/ops/"
        "experimental/tpu/splash_attention/microbenchmarks.pdf, Nov 2025): forward, head dim "
        "128, one TensorCore (this model's device), block sizes tuned, 20.6 % of peak at 4k "
        "tokens to 34.3 % at 131k (causal, so the masked half is not counted: a Wan "
        "sequence's non-causal kernel is taken to lie in the same range)")),
    Spread("attention_efficiency", 0.56, 0.60, kernel="ring-custom", source=(
        "MaxDiffusion commit 8dd63054 (PR #452), Wan 2.2 at 720p on v7x-8 with dp 2 x ring 2 "
        "x Ulysses 2: one ring hop of ulysses_ring_custom took 22.65 ms, 21.15 ms with its "
        "fixed-max softmax; a hop is 20 heads of 37,800 x 37,800 tokens at head dim 128 on one "
        "TensorCore (1.46e13 FLOPs, the shape inferred from the mesh, not stated), i.e. 56 % "
        "and 60 % of the TensorCore's 1.15e15 FLOP/s")),
    Spread("matmul_efficiency", 0.66, 1.0, source=(
        "matmul ops the compiler gives no cycle estimate for, and every op under the roofline "
        "compute model: the compiler's own pricing of Wan's matmuls, 0.96x their roofline "
        "(the default 1, hardware.EFFICIENCY_SOURCES); jnp.matmul of 8192^3 bf16 at 92 % of "
        "v5e's peak (JAX Pallas TPU matmul guide); Wan's linear layers at 66 % on v6e-16 "
        "(yangwhale/gpu-tpu-pedia, a third-party profile)")),
    Spread("hbm_efficiency", 0.37, 0.87, source=(
        "memory-bound ops the compiler gives no estimate for, and every op under the roofline "
        "model: the compiler prices Wan's memory-class ops at 0.37 of the HBM roofline (the "
        "default, hardware.EFFICIENCY_SOURCES: vector-unit work the roofline does not see); "
        "copies of 128 MiB or more stream at 87 % of nominal on TPU7x "
        "(AI-Hypercomputer/accelerator-microbenchmarks, Ironwood HBM guide)")),
    Spread("intra_chip_bandwidth", 3.6e11, 3.69e12, generations=("tpu7x",), source=(
        "TPU7x's die-to-die path, for which Google publishes no figure: at most 3.69e12 B/s "
        "(the default, hardware.py: half the chip's HBM bandwidth per chiplet) and more than "
        "one torus axis's ICI at a chip (4 x 9e10 B/s), since JAX's mesh_utils \"assigns the "
        "core axis preferentially due to its higher bandwidth\"; a contributor's ~1.2 TB/s "
        "(jax-ml/jax PR #39340, unconfirmed) lies inside")),
    Spread("overlap", 0.77, 1.0, source=(
        "the share of an asynchronous collective's time that compute hides: all of it in the "
        "default model; the scaling book's collective matmul hides 77 % of its all-gather "
        "(311 us blocking, 244 us overlapped, 224 us of matmul alone), although the matmul "
        "is 2.6x longer than the transfer")),
)
"""Every uncertain constant, with its range and source (module docstring)."""

CHOICES: tuple[Choice, ...] = (
    Choice("compute_model", ("compiler", "roofline"), source=(
        "the compiler's own estimated_cycles (the default) or the roofline at the spreads' "
        "efficiencies: no TPU here times an op, and neither has been checked against one")),
    Choice("order", ("compiler", "logical"), source=(
        "how a collective follows its group's device order (comm_model, 'Device order'): the "
        "published order-only measurements reject 'physical' and do not separate 'compiler' "
        "(libtpu's emitter labels, the default) from 'logical'")),
)
"""Every modelling choice the ensemble draws (module docstring)."""


@dataclass(frozen=True)
class Ensemble:
    """Draws of the model: ``count`` values of every spread and choice, from ``seed``."""

    count: int = 256
    """Draws (at least 2)."""
    seed: int = 0
    """The random seed: the same ensemble draws the same model for every program."""
    spreads: tuple[Spread, ...] = SPREADS
    """The constants drawn."""
    choices: tuple[Choice, ...] = CHOICES
    """The choices drawn."""

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and self.count >= 2):
            raise AoizoraError(f"Ensemble(count={self.count!r}): draw at least 2 models, e.g. "
                               "256.")
        names = [s.label for s in self.spreads]
        if len(set(names)) != len(names):
            raise AoizoraError(f"Ensemble: a constant is spread twice in {names}.")

    def units(self) -> tuple[np.ndarray, np.ndarray]:
        """Quantiles ``[count, spreads]`` in [0, 1) and choice indices ``[count, choices]``."""
        rng = np.random.default_rng(self.seed)
        units = rng.random((self.count, len(self.spreads)))
        picks = np.stack([rng.integers(0, len(c.values), self.count) for c in self.choices],
                         axis=1) if self.choices else np.zeros((self.count, 0), dtype=int)
        return units, picks

    def constants(self, topology: Topology, chip: ChipSpec | None = None, *,
                  kernel: str = DEFAULT_KERNEL) -> Constants:
        """One device's constants under every draw (arrays ``[count]``) for a program whose
        attention runs ``kernel`` (:data:`KERNELS`): the spreads that apply to the
        generation and the kernel, except the constants :func:`known_constants` names, which
        keep ``chip``'s value."""
        if kernel not in KERNELS:
            raise AoizoraError(f"kernel={kernel!r}: attention kernels are {list(KERNELS)}.")
        known = known_constants(topology.generation, chip)
        chip = device_spec(topology, chip)
        base = Constants.of(chip)
        values = {name: getattr(base, name) for name in Constants.__dataclass_fields__}
        units, _ = self.units()
        for index, spread in enumerate(self.spreads):
            applies = (not spread.generations or topology.generation in spread.generations) \
                and spread.kernel in ("", kernel)
            # a calibration measures the programs' own kernel, not a published run's
            calibrated = spread.name in known and spread.kernel in ("", DEFAULT_KERNEL)
            if applies and not calibrated:
                values[spread.name] = spread.values(units[:, index], values[spread.name])
        return Constants(**values)

    def choice_groups(self) -> list[tuple[dict[str, str], np.ndarray]]:
        """The draws grouped by the alternatives they picked: ``({choice: value}, draw
        indices)`` per combination drawn."""
        _, picks = self.units()
        groups = []
        for combo in sorted({tuple(row) for row in picks.tolist()}):
            index = np.nonzero((picks == np.array(combo)).all(axis=1))[0]
            groups.append(({c.name: c.values[i] for c, i in zip(self.choices, combo,
                                                                strict=True)}, index))
        return groups

    def draws_frame(self, topology: Topology, chip: ChipSpec | None = None, *,
                    kernel: str = DEFAULT_KERNEL) -> pd.DataFrame:
        """One row per draw: every constant and choice it drew for a program running
        ``kernel`` (for people and plots)."""
        import pandas as pd

        constants = self.constants(topology, chip, kernel=kernel)
        frame = pd.DataFrame({name: np.broadcast_to(getattr(constants, name), self.count)
                              for name in Constants.__dataclass_fields__})
        _, picks = self.units()
        for index, choice in enumerate(self.choices):
            frame[choice.name] = [choice.values[i] for i in picks[:, index]]
        return frame


LINK_RATE = frozenset({"ici_link_bandwidth", "ici_efficiency"})
"""Constants a measurement can only pin down together: a calibration fits the achieved link
rate (bandwidth x efficiency), so knowing either fixes both."""


def known_constants(generation: str, chip: ChipSpec | None = None) -> frozenset[str]:
    """The constants taken as known, so not drawn: those the generation's calibration file
    sets (whatever their value, the default's included) and those ``chip`` overrides beyond
    it; either of :data:`LINK_RATE` fixes both."""
    calibrated = chip_spec(generation)
    fields = set(load_calibration(generation).get("overrides", {}))
    if chip is not None:
        fields |= {name for name in Constants.__dataclass_fields__
                   if name in ChipSpec.__dataclass_fields__
                   and getattr(chip, name) != getattr(calibrated, name)}
    if fields & LINK_RATE:
        fields |= LINK_RATE
    return frozenset(fields)


DEFAULT_ENSEMBLE = Ensemble()
"""256 draws of every spread and choice, seed 0."""


def sources() -> pd.DataFrame:
    """Every spread and choice with its range or alternatives and its source."""
    import pandas as pd

    rows = [{"name": s.label, "range": (f"x{s.low:g} .. x{s.high:g} of the default"
                                       if s.relative else f"{s.low:g} .. {s.high:g}"),
             "drawn": "log-uniform" if s.log else "uniform",
             "generations": ", ".join(s.generations) or "all", "source": s.source}
            for s in SPREADS]
    rows += [{"name": c.name, "range": " | ".join(c.values), "drawn": "equally likely",
              "generations": "all", "source": c.source} for c in CHOICES]
    return pd.DataFrame(rows)


def price(program: Any, topology: Topology, placement: Any,
          ensemble: Ensemble = DEFAULT_ENSEMBLE, *, chip: ChipSpec | None = None,
          kernel: str = DEFAULT_KERNEL, model: ModelOptions | None = None) -> np.ndarray:
    """The step of a compiled ``program`` on ``placement`` under every draw of ``ensemble``
    (``[count]`` seconds, draw by draw as :meth:`Ensemble.units` orders them); ``kernel``:
    the attention kernel the program's attention stands for (:data:`KERNELS`); ``model``:
    the ICI model the draws vary (its order drawn where the ensemble draws it, its other
    options kept; default :class:`~aoizora_lab.comm_model.ModelOptions`)."""
    constants = ensemble.constants(topology, chip, kernel=kernel)
    base = model or ModelOptions()
    total = np.empty(ensemble.count)
    for picked, index in ensemble.choice_groups():
        options = dataclasses.replace(base, order=picked.get("order", base.order))
        _, steps = predict_draws(program, topology, placement, constants.take(index),
                                 chip=chip, compute_model=picked.get("compute_model"),
                                 options=options)
        total[index] = steps
    return total


# ----------------------------------------------------------------------------- assessment

QUANTILES = (0.1, 0.5, 0.9)
"""The 80 % interval and the median."""
OUR_ROLES = ("search", "setup", "order")
"""The :attr:`Option.role` values of options the plan could run (:attr:`Option.ours`)."""


@dataclass(frozen=True, eq=False)
class Option:
    """One program on one placement, priced under every draw."""

    label: str
    """``candidate (flags)``; for the plan's program in a library's order ``candidate (flags)
    on <order>``; for a system's own setup ``system: candidate (flags)``."""
    role: str
    """``"search"`` (a survivor's program placed by the search), ``"setup"`` (a system's
    setup placed by the search), ``"order"`` (the plan's program in a library's device
    order) or the system's name (its setup in its own order)."""
    point_s: float
    """The step under the plan's model (``PlanResult.model``; what the plan prints)."""
    steps: np.ndarray = field(repr=False)
    """The step under each draw ``[count]``."""

    @property
    def ours(self) -> bool:
        """Whether the plan could run it: a program the search placed, or the plan's program
        in a library's order (not a system's setup in the system's own order)."""
        return self.role in OUR_ROLES

    @property
    def low_s(self) -> float:
        """10th percentile of the step."""
        return float(np.quantile(self.steps, QUANTILES[0]))

    @property
    def median_s(self) -> float:
        """Median step."""
        return float(np.quantile(self.steps, QUANTILES[1]))

    @property
    def high_s(self) -> float:
        """90th percentile of the step: the robust choice's criterion."""
        return float(np.quantile(self.steps, QUANTILES[2]))


@dataclass(frozen=True)
class Odds:
    """The plan against one system, draw by draw."""

    system: str
    """The system's name."""
    probability: float
    """The share of draws in which the plan is faster (a tie counts half)."""
    speedup: tuple[float, float, float]
    """The system's step over the plan's: 10th percentile, median, 90th percentile."""
    point: float
    """The same ratio under the plan's model (the headline's)."""
    known: bool = True
    """False where a time limit left setups of the system that could still win uncompiled
    (``Headline.unchecked``): the odds are then against the setups compiled only, and who is
    faster is not known."""


class Assessment(Records[Option]):
    """A plan's candidates and systems priced under an ensemble: intervals, odds against each
    system, and the robust choices (module docstring). Rows: fastest median first."""

    COLUMNS = ("label", "role", "point_s", "median_s", "low_s", "high_s", "max_regret_s",
               "median_winner", "robust", "least_regret")

    def __init__(self, items: Iterable[Option] = (), *, plan: str = "",
                 odds: Sequence[Odds] = (), ensemble: Ensemble = DEFAULT_ENSEMBLE) -> None:
        super().__init__(sorted(items, key=lambda o: (o.median_s, o.label)))
        self.plan = plan
        self.odds = tuple(odds)
        self.ensemble = ensemble
        # Chosen over every option once: a slice of the rows (a table's top) keeps the marks.
        self._regrets = self._worst_regrets()
        ours = self._ours()
        self.median_winner = min(ours, key=lambda o: o.median_s).label if ours else ""
        """The option of ours (:attr:`Option.ours`) with the lowest median step."""
        self.robust = min(ours, key=lambda o: o.high_s).label if ours else ""
        """The option of ours with the lowest 90th-percentile step."""
        self.least_regret = (min(self._regrets, key=self._regrets.__getitem__)
                             if self._regrets else "")
        """The option of ours whose worst regret over the draws is least."""

    def _ours(self) -> list[Option]:
        return [o for o in self if o.ours]

    def regrets(self) -> dict[str, float]:
        """Per option of ours: its largest regret over the draws (its step less the fastest
        such option's step in the same draw)."""
        return dict(self._regrets)

    def _worst_regrets(self) -> dict[str, float]:
        options = self._ours()
        if not options:
            return {}
        steps = np.stack([o.steps for o in options])
        worst = (steps - steps.min(axis=0)).max(axis=1)
        return {o.label: float(w) for o, w in zip(options, worst, strict=True)}

    @property
    def differs(self) -> bool:
        """Whether the robust or least-regret choice is not the median winner."""
        return len({self.median_winner, self.robust, self.least_regret}) > 1

    def option(self, label: str) -> Option:
        """The option named ``label``."""
        for item in self:
            if item.label == label:
                return item
        raise KeyError(f"No option {label!r}; options: {[o.label for o in self]}.")

    def row(self, item: Option) -> dict[str, Any]:
        regret = self._regrets.get(item.label, math.nan)
        return {"label": item.label, "role": item.role, "point_s": item.point_s,
                "median_s": item.median_s, "low_s": item.low_s, "high_s": item.high_s,
                "max_regret_s": regret, "median_winner": item.label == self.median_winner,
                "robust": item.label == self.robust,
                "least_regret": item.label == self.least_regret}

    def odds_frame(self) -> pd.DataFrame:
        """Per system: the probability that the plan is faster and the speedup's interval
        (``known`` False: a time limit left setups that could win uncompiled, so these are
        against the setups compiled only)."""
        import pandas as pd

        return pd.DataFrame([{"system": o.system, "known": o.known,
                              "p_plan_faster": o.probability, "speedup_point": o.point,
                              "speedup_low": o.speedup[0], "speedup_median": o.speedup[1],
                              "speedup_high": o.speedup[2]} for o in self.odds],
                            columns=["system", "known", "p_plan_faster", "speedup_point",
                                     "speedup_low", "speedup_median", "speedup_high"])

    def drivers(self, topology: Topology, chip: ChipSpec | None = None,
                against: str | None = None) -> pd.DataFrame:
        """What moves the answer: per drawn constant and choice, how the plan's speedup over
        ``against`` (default: the fastest system, else the runner-up option) follows it.
        Constants first, by their rank correlation with the speedup (``effect``, -1 .. 1; 0
        where the constant or the speedup does not vary), the strongest first; then choices,
        by the spread of the median speedup over their alternatives (``effect``, in speedup
        units: not comparable with a correlation)."""
        import pandas as pd

        plan = self.option(self.plan)
        other = self._opponent(against)
        ratio = other.steps / plan.steps
        frame = self.ensemble.draws_frame(topology, chip)
        rows = []
        for spread in self.ensemble.spreads:
            if spread.kernel not in ("", DEFAULT_KERNEL):  # the programs run splash
                continue
            effect = _rank_correlation(frame[spread.name].to_numpy(dtype=float), ratio)
            rows.append({"name": spread.name, "kind": "constant", "effect": effect,
                         "detail": f"rank correlation with {other.label} / plan"})
        for choice in self.ensemble.choices:
            medians = {v: float(np.median(ratio[frame[choice.name] == v]))
                       for v in choice.values if (frame[choice.name] == v).any()}
            effect = max(medians.values()) - min(medians.values()) if medians else 0.0
            rows.append({"name": choice.name, "kind": "choice", "effect": effect,
                         "detail": ", ".join(f"{v}: {m:.3f}x" for v, m in medians.items())})
        out = pd.DataFrame(rows)
        out["strength"] = out["effect"].abs()
        return out.sort_values(["kind", "strength"], ascending=[False, False],
                               kind="stable").drop(columns="strength").reset_index(drop=True)

    def summary(self, topology: Topology, chip: ChipSpec | None = None) -> list[str]:
        """The assessment in a few lines for people: the plan's interval, its odds against
        each system, the robust choices and the constants that move the answer most."""
        plan = self.option(self.plan)
        lines = [f"plan {plan.label}: median {plan.median_s:.4g} s, 80 % interval "
                 f"{plan.low_s:.4g} - {plan.high_s:.4g} s (point estimate {plan.point_s:.4g} s)"]
        for o in self.odds:
            if not o.known:
                lines.append(f"against {o.system}: not known within the time limit (setups that "
                             "could win were not compiled; against those compiled, P(plan "
                             f"faster) = {o.probability:.2f})")
                continue
            verdict = ("faster in every draw" if o.probability == 1 else
                       "slower in every draw" if o.probability == 0 else
                       "the interval straddles 1: the model's uncertainty could reverse it"
                       if o.speedup[0] < 1 < o.speedup[2] else "")
            lines.append(f"against {o.system}: P(plan faster) = {o.probability:.2f}, speedup "
                         f"{o.speedup[1]:.3f}x (80 %: {o.speedup[0]:.3f} - {o.speedup[2]:.3f}x)"
                         + (f"; {verdict}" if verdict else ""))
        for name, label in (("lowest median", self.median_winner),
                            ("robust (lowest 90th percentile)", self.robust),
                            ("least worst-case regret", self.least_regret)):
            lines.append(f"{name}: {label}")
        if self.robust and self.robust != self.plan:
            lines.append(self.trade())
        if len(self) > 1:
            drivers = self.drivers(topology, chip)
            constants = drivers[drivers["kind"] == "constant"].head(3)
            choices = drivers[drivers["kind"] == "choice"]
            lines.append("what moves the speedup most: " + ", ".join(
                f"{r['name']} (rank correlation {r['effect']:+.2f})"
                for _, r in constants.iterrows()) + "; choices: " + "; ".join(
                f"{r['name']} ({r['detail']})" for _, r in choices.iterrows()))
        return lines

    def tradeoff(self) -> tuple[float, float]:
        """The robust choice's median and 90th-percentile step over the plan's, less 1: what
        it costs at the median and what it saves at the slow end (0, 0 where the plan is the
        robust choice)."""
        plan, robust = self.option(self.plan), self.option(self.robust)
        return robust.median_s / plan.median_s - 1, robust.high_s / plan.high_s - 1

    def trade(self) -> str:
        """:meth:`tradeoff` for a reader choosing between the two: the plan stays the fastest
        under the plan's model (every default has its source), and the robust choice bounds
        the slow end; both are shown, neither replaces the other."""
        median, high = self.tradeoff()
        why = ("faster at the median too: the ensemble, drawn around defaults that sit at an "
               "end of some ranges, orders the two unlike the plan's model" if median <= 0
               else "run the robust one to bound the slow end")
        return (f"the robust choice is not the plan: {self.robust} is {median:+.1%} at the "
                f"median and {high:+.1%} at the 90th percentile against the plan (the plan "
                f"is the fastest under the plan's model; {why})")

    def _opponent(self, against: str | None) -> Option:
        if against is not None:
            return self.option(against)
        systems = [o for o in self if not o.ours]
        if systems:
            return min(systems, key=lambda o: o.point_s)
        others = [o for o in self if o.label != self.plan]
        if not others:
            raise AoizoraError("Nothing to compare the plan with: one option only.")
        return min(others, key=lambda o: o.point_s)


def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two samples (tied values share their average rank); 0
    where either does not vary."""
    from scipy.stats import rankdata

    if np.all(a == a[0]) or np.all(b == b[0]):
        return 0.0
    return float(np.corrcoef(rankdata(a), rankdata(b))[0, 1])


def odds(plan: np.ndarray, system: np.ndarray) -> tuple[float, tuple[float, float, float]]:
    """The share of draws in which ``plan``'s step is below ``system``'s (ties half) and the
    quantiles of ``system / plan``."""
    plan, system = np.asarray(plan), np.asarray(system)
    probability = float(np.mean(plan < system) + 0.5 * np.mean(plan == system))
    low, median, high = np.quantile(system / plan, QUANTILES)
    return probability, (float(low), float(median), float(high))


def option_label(candidate: str, flags: str) -> str:
    """An option's label: its candidate and flag set, ``"cfg2-uly4 (default)"``."""
    return f"{candidate} ({flags})"


def assess(result: PlanResult, ensemble: Ensemble = DEFAULT_ENSEMBLE) -> Assessment:
    """A plan's answer with intervals: every compiled program on its best placement (under
    the plan's model, ``result.model``), the search's own best program in the libraries'
    device orders (module docstring), and every system on its own, priced under ``ensemble``
    around that model; the odds of the search's own best (``result.searched``, the
    headline's plan) against each system."""
    options: list[Option] = []
    searched_keys = {r.key for r in result.compiled.ok}
    seen: set[tuple[str, str]] = set()
    programs = result.programs
    topology = result.searched.topology
    for ranked in result.ranking.ranked():
        key = (ranked.candidate.name, ranked.flags.label)
        if key in seen or key not in programs:
            continue
        seen.add(key)
        role = "search" if key in searched_keys else "setup"
        options.append(Option(option_label(*key), role, ranked.predicted.total_s,
                              price(programs[key], topology, ranked.placement, ensemble,
                                    model=result.model)))
    plan_label = option_label(result.searched.candidate.name, result.searched.flags.label)
    plan = next((o for o in options if o.label == plan_label), None)
    if plan is None:  # the searched plan is always ranked; keep a clear error if not
        raise AoizoraError(f"assess: the plan {plan_label!r} is not in the ranking.")
    searched = result.searched
    program = programs[searched.candidate.name, searched.flags.label]
    placed = {tuple(searched.placement.order)}
    for order in library_orders(searched.candidate.mesh_shape, searched.candidate.axis_names,
                                topology):
        if tuple(order.order) in placed:  # a library may agree with the search or another
            continue
        placed.add(tuple(order.order))
        options.append(Option(
            f"{plan_label} on {order.description}", "order",
            predict(program, topology, order, options=result.model).total_s,
            price(program, topology, order, ensemble, model=result.model)))
    found = []
    for name, system in result.baselines.plans.items():
        if system.program is None:
            continue
        steps = price(system.program, topology, system.placement, ensemble,
                      model=result.model)
        label = option_label(system.candidate.name, system.flags.label)
        options.append(Option(f"{name}: {label}", name, system.predicted.total_s, steps))
        probability, speedup = odds(plan.steps, steps)
        found.append(Odds(name, probability, speedup, system.predicted.total_s / plan.point_s,
                          known=name not in result.headline.unchecked))
    return Assessment(options, plan=plan_label, odds=found, ensemble=ensemble)


def plan_steps(plan: Plan, ensemble: Ensemble = DEFAULT_ENSEMBLE) -> np.ndarray:
    """:func:`price` of a realised plan (its program on its placement)."""
    if plan.program is None:
        raise AoizoraError(f"Plan {plan.candidate.name!r} has no compiled program (a loaded "
                           "plan file): compile it first (Plan.compiled_program).")
    return price(plan.program, plan.topology, plan.placement, ensemble)
