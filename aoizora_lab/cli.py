"""``aoizora-lab`` command line: the workbench's entry points for people and scripts.

Workloads on slices are written as one *case* spec (:mod:`aoizora_lab.cases`), e.g.
``wan2.1-t2v-14b@1280x720x81/v5e:4x4``.

``aoizora-lab prune wan2.1-t2v-14b@720p/v5e:4x4`` lists the sharding candidates and which
survive IR pruning, with a reason for each.

``aoizora-lab plan wan2.1-t2v-14b@1280x720x81/v5e:4x4`` runs the search within the
:data:`~aoizora_lab.options.INTERACTIVE` preset's time limit (``--time-limit``; ``--full``:
the :data:`~aoizora_lab.options.FULL_SEARCH` preset) and prints the ranking, the best plan,
its breakdown and the baseline table; ``--verify`` then compiles the best plan on its own
mesh and checks it is what was scored (:meth:`Plan.verify`).

``aoizora-lab topology v5e:4x4`` prints the slice (shape, wraparound, where the devices came
from, which device sits on which chip) and a table of predicted collective times under a
compact placement (logical neighbours on physical neighbours) and a scattered one (a seeded
random permutation), so a reader sees at once that placement matters.

``aoizora-lab reports`` runs the notebooks headless for every report of ``data/reports.yaml``
into ``reports/`` (HTML pages and ``index.html``); its exit status is the number of notebooks
that failed (at most 125).

``aoizora-lab bench [--quick] [--out reports/benchmarks.md]`` runs the benchmarks (plan quality,
search cost, quick plans, placement throughput, interactive speed; :mod:`aoizora_lab.bench`)
and writes their sections of the Markdown report.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from aoizora_lab.cases import CASE_SPEC, parse_case
from aoizora_lab.comm_model import (
    ORDER_MODELS,
    ModelOptions,
    compare_placements,
    standard_collectives,
)
from aoizora_lab.compile import Compiles, NotRunReason
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import chip_spec
from aoizora_lab.options import FULL_SEARCH, INTERACTIVE, INTERACTIVE_TIME_LIMIT_S, SEARCHED_FLAGS
from aoizora_lab.topology import Topology


def _topology_command(args: argparse.Namespace) -> int:
    import pandas as pd

    deviceless = {"auto": None, "require": True, "never": False}[args.deviceless]
    topology = Topology.from_name(args.name, deviceless=deviceless)
    chip = chip_spec(topology.generation, calibrated=not args.uncalibrated)
    print(topology.describe())
    print(
        f"chip {chip.generation}: {chip.peak_bf16_flops:.3g} bf16 FLOP/s, "
        f"{chip.hbm_bytes / 2**30:.4g} GiB HBM, ICI {chip.ici_link_bandwidth:.3g} B/s per link "
        f"one way x {chip.ici_efficiency:g} efficiency, {chip.ici_hop_latency * 1e6:g} us per "
        f"hop ({chip.source})"
    )
    mesh_shape = topology.shape + ((topology.devices_per_chip,)
                                   if topology.devices_per_chip > 1 else ())
    compact = topology.device_grid().ravel()
    scattered = np.random.default_rng(args.seed).permutation(topology.num_devices)
    table = compare_placements(
        standard_collectives(mesh_shape, args.bytes), topology,
        {"compact": compact, "scattered": scattered}, chip=chip,
        options=ModelOptions(order=args.order_model))
    print(f"\nPredicted time of collectives over a logical {'x'.join(map(str, mesh_shape))} "
          f"mesh, {args.bytes:.4g} result bytes per device; compact = logical neighbours on "
          f"physical neighbours, scattered = random permutation (seed {args.seed}); device "
          f"order model {args.order_model!r}:")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False))
    return 0


def _prune_command(args: argparse.Namespace) -> int:
    import pandas as pd

    from aoizora_lab.candidates import explain_candidates
    from aoizora_lab.options import PlanOptions
    from aoizora_lab.prune import prune

    case = parse_case(args.case)
    workload, topology = case.workload, case.topology()
    space = explain_candidates(workload, topology, allow_padding=not args.no_padding)
    candidates = space.valid
    print(f"{workload.name} ({workload.tokens:,} tokens) on {topology.name}: "
          f"{len(space)} combinations considered, {len(candidates)} valid")
    with pd.option_context("display.width", 250, "display.max_columns", 20,
                           "display.max_colwidth", 100, "display.max_rows", 500):
        if args.show_invalid:
            table = space.to_frame()
            print(table[~table["valid"]][["name", "reason"]].to_string(index=False))
        # as the planner prunes: each candidate at the best of the flag sets it searches
        pruning = prune(candidates, workload, topology,
                        flag_async=PlanOptions().flag_async(topology))
        columns = ["candidate", "estimate_s", "lower_bound_s", "also_async", "comm_gb_per_device",
                   "memory_lower_bound_gib", "verdict", "reason"]
        print(pruning.to_frame()[columns].to_string(index=False,
                                                    float_format=lambda v: f"{v:.3g}"))
    print(f"kept {len(pruning.kept)} of {len(pruning)} for compilation")
    return 0


def _draws(text: str) -> int:
    """``--draws``: 0 (none) or at least 2."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value != 0 and value < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 (no intervals) or a number of "
                                         "draws of at least 2, e.g. 256")
    return value


def _plan_command(args: argparse.Namespace) -> int:
    import pandas as pd

    from aoizora_lab.compile import check_num_layers
    from aoizora_lab.generation import check_steps, official_sampling, plan_generation
    from aoizora_lab.planner import plan
    from aoizora_lab.progress import PROGRESS_ENV
    from aoizora_lab.versions import environment_variable

    case = parse_case(args.case)
    workload = case.workload
    if args.json and not Path(args.json).absolute().parent.is_dir():
        raise AoizoraError(f"--json {args.json!r}: folder {str(Path(args.json).parent)!r} does "
                           "not exist; create it or write the plan elsewhere.")
    if args.full and args.time_limit is not None:
        raise AoizoraError(f"--full with --time-limit {args.time_limit:g}: --full compiles "
                           "every survivor and every system's setup whatever the time; give "
                           "one of the two.")
    check_num_layers(args.layers, workload.config().num_layers)  # names the model's depth
    if args.steps is not None and not args.whole:
        raise AoizoraError(f"--steps {args.steps} counts the steps of a whole video: add "
                           "--whole (a plan without it is one step).")
    steps = official_sampling(workload).steps if args.steps is None else args.steps
    if args.whole:
        check_steps(steps)
    preset = FULL_SEARCH if args.full else INTERACTIVE
    options = preset.replace(
        num_layers=args.layers, budget=args.budget, quiet=True, compare=args.compare,
        max_compiled=args.max_compiled, systems=not args.no_systems,
        model=ModelOptions(order=args.order_model),
        **({"time_limit_s": args.time_limit} if args.time_limit is not None else {}),
        **({"flags": args.flags} if args.flags else {}))
    limit = options.time_limit_s
    topology = case.topology()
    # Progress lines, not a bar: each stage and each compile as it finishes (a cold plan
    # compiles for minutes), with the best step so far.
    with environment_variable(PROGRESS_ENV, "0" if args.quiet else "1"):
        result = plan(workload, topology, options)
    best = result.best
    with pd.option_context("display.width", 250, "display.max_columns", 20,
                           "display.max_colwidth", 70):
        print(f"{workload.name} ({workload.tokens:,} tokens) on {topology.name}")
        print("\nRanking (candidate x placement, predicted seconds per step):")
        print(result.ranking[:args.top].to_frame().drop(columns=["placement"])
              .to_string(float_format=lambda v: f"{v:.4g}"))
        print(f"\nBest plan: {best.candidate.name} ({best.flags.label} compiler flags), "
              f"{best.placement.description}: "
              f"{best.predicted.total_s:.4g} s (compute {best.predicted.compute_s:.4g} s, "
              f"communication {best.predicted.comm_s:.4g} s)")
        own = result.searched
        if own.predicted.total_s > best.predicted.total_s:
            print(f"  (a setup of an existing system or yours: the search's own best, "
                  f"{own.candidate.name} ({own.flags.label} flags), "
                  f"{own.predicted.total_s:.4g} s, is slower)")
        print("\nWhere its communication time goes:")
        print(best.breakdown.head(args.top).to_string(float_format=lambda v: f"{v:.4g}"))
        _print_not_compiled(result.compiled, limit)
        if args.no_systems:
            print("\nThe systems people run: not compared (--no-systems).")
        else:
            print("\nThe systems people run (same compiler, same model; speedup_of_plan = "
                  "system / plan):")
            print(result.baselines.to_frame().drop(columns=["reason", "note"])
                  .to_string(float_format=lambda v: f"{v:.4g}"))
            for outcome in result.baselines:
                if outcome.unstarted:
                    print(f"  {outcome.name}: priced on the setups compiled within the "
                          f"{_limit_words(limit)}; not compiled: "
                          + "; ".join(outcome.unstarted) + " (its best may be among them, "
                          "so the ratios may flatter the plan: --full compiles every setup)")
        print("\nWhere the gain comes from (vs existing systems: system / the search's own "
              "best, below 1 where a system wins; placement: the plan's program in library "
              "orders / its placement; strategy: best system / best survivor in plain "
              "order):")
        print(result.headline.to_frame().to_string(float_format=lambda v: f"{v:.4g}"))
        if args.draws:
            from aoizora_lab.uncertainty import Ensemble, assess

            assessment = assess(result, Ensemble(count=args.draws))
            print(f"\nHow sure (the step under {args.draws} draws of the model's uncertain "
                  "constants and choices, each with its source: aoizora_lab.uncertainty."
                  "sources()):")
            print("\n".join(f"  {line}" for line in assessment.summary(topology)))
            print(assessment[:args.top].to_frame().drop(columns=["median_winner"])
                  .to_string(float_format=lambda v: f"{v:.4g}"))
        if args.whole:
            video = plan_generation(best, steps, options=result.model)
            print(f"\nThe whole video ({steps} steps; text encoder and VAE decoder planned on "
                  f"the same slice, each on its own mesh): {video.total_s:.4g} s")
            frame = video.to_frame()
            print(frame.to_string(float_format=lambda v: f"{v:.4g}"))
            print(f"The DiT's weights stay in HBM ({video.resident_bytes / 2**30:.3g} GiB per "
                  "device): each part runs its fastest split that fits beside them "
                  "(hbm_with_dit_gib, fits), on the faster of its mesh's library orders and "
                  "the DiT plan's (dit_order_s); maxdiffusion_s: MaxDiffusion's VAE program "
                  "on this slice, the baseline.")
            for part in frame.loc[frame["fits"].eq(False).fillna(False), "part"]:
                print(f"  {part}: no split fits beside the DiT's weights; the video needs them "
                      "out of HBM while it runs (offloaded, not priced).")
            shard = video.expert_bytes_per_device / 2**30
            if shard and workload.swap_experts:
                print(f"One expert resident, the other swapped in from the host "
                      f"({shard:.3g} GiB per device per move, {video.expert_swap_s:.3g} s per "
                      "video over PCIe); the step was planned with one expert's HBM.")
            elif shard:
                print(f"Both experts stay resident ({shard:.3g} GiB per device each); "
                      f"swapping them through the host instead would add "
                      f"{video.expert_swap_s:.3g} s per video over PCIe and free that much HBM "
                      "per device (a workload ending in -swap, e.g. "
                      "wan2.2-t2v-a14b@1280x720x81-swap, plans the step with one expert's HBM).")
        if args.compare:
            print("\nYour setup, and what to change (speedup = yours / that row):")
            print(result.advice(budget=args.budget)
                  .to_string(float_format=lambda v: f"{v:.4g}"))
        if best.flags.args:
            print(f"\nRun it with LIBTPU_INIT_ARGS=\"{best.flags.args}\"")
    if args.json:
        best.to_json(args.json)
        print(f"\nplan written to {args.json}")
    if args.verify:
        check = best.verify(num_layers=args.layers, options=result.model)
        print(f"\nThe best plan compiled on its own mesh: {check.summary()}")
        if not check.equal:
            with pd.option_context("display.width", 250, "display.max_colwidth", 120):
                print(check.to_frame().drop(columns=["groups"]).to_string())
            return 1
    return 0


def _reports_command(args: argparse.Namespace) -> int:
    import pandas as pd

    from aoizora_lab.reports import load_matrix, run_reports, select_reports, write_index

    specs = select_reports(load_matrix(args.matrix), args.only, everything=args.all)
    result = run_reports(specs, args.notebooks, args.out, kernel_name=args.kernel,
                         progress=not args.quiet)
    index = write_index(result, args.out)
    with pd.option_context("display.width", 250, "display.max_colwidth", 90):
        print(result.to_frame().to_string(index=False))
    print(f"\n{len(result.runs) - result.failed} of {len(result.runs)} notebooks ok; "
          f"index: {index}")
    return min(result.failed, 125)  # exit statuses above 125 mean something else to shells


def _bench_command(args: argparse.Namespace) -> int:
    from aoizora_lab.bench import run_all

    flags = [("--quick", args.quick), (f"--out {args.out}", args.out != "reports/benchmarks.md"),
             (f"--only {' '.join(args.only or [])}", bool(args.only)),
             (f"--num-layers {args.num_layers}", args.num_layers is not None),
             ("--skip-exhaustive", args.skip_exhaustive),
             (f"--cases {' '.join(args.cases or [])}", bool(args.cases)),
             (f"--search-cases {' '.join(args.search_cases or [])}", bool(args.search_cases)),
             (f"--cache-dir {args.cache_dir}", args.cache_dir is not None),
             ("--resume", args.resume), ("--records-only", args.records_only)]
    command = " ".join(["aoizora-lab bench", *(flag for flag, used in flags if used)])
    path = run_all(quick=args.quick, out=args.out, only=args.only, num_layers=args.num_layers,
                   skip_exhaustive=args.skip_exhaustive, cache_dir=args.cache_dir,
                   cases=args.cases, search_cases=args.search_cases, command=command,
                   resume=args.resume, records_only=args.records_only,
                   progress=None if args.quiet else lambda m: print(m, file=sys.stderr))
    print(path.read_text())
    print(f"report written to {path}")
    return 0


CASE_HELP = (f"workload on a slice, {CASE_SPEC}, e.g. wan2.1-t2v-14b@1280x720x81/v5e:4x4 "
             "(480p / 720p name a size)")


_NOT_COMPILED_WHY = {
    NotRunReason.TIME_LIMIT: "would have ended after the {limit}",
    NotRunReason.FIRST_RUN: "not started by this plan's first run (so the same answer again)",
    NotRunReason.BUDGET: "beyond the compile budget (--max-compiled)",
}
"""Why a survivor was left uncompiled, for the plan's printout (the flag rule's spared
compiles are in ``PlanResult.skipped``, not here: they could not win)."""


def _limit_words(limit: float | None) -> str:
    return f"{limit:g} s limit" if limit is not None else "time limit"


def _print_not_compiled(compiled: Compiles, limit: float | None) -> None:
    """The survivors a plan left uncompiled, by reason: the plan is the best of the rest."""
    unstarted = compiled.not_run
    for reason in dict.fromkeys(r.reason for r in unstarted):
        these = [r for r in unstarted if r.reason is reason]
        why = _NOT_COMPILED_WHY.get(reason, reason.value)
        print(f"\nNot compiled, {why.format(limit=_limit_words(limit))} ({len(these)} of "
              f"{len(compiled)}; the plan is the best of the rest, --full without "
              "--max-compiled compiles every one): "
              + ", ".join(f"{r.candidate.name} ({r.flags.label} flags)" for r in these[:6])
              + (", ..." if len(these) > 6 else ""))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``aoizora-lab``."""
    parser = argparse.ArgumentParser(
        prog="aoizora-lab",
        description="Topology-aware planning of Wan 2.1 DiT inference on TPU slices.")
    commands = parser.add_subparsers(dest="command", required=True)
    topo = commands.add_parser(
        "topology", help="print a TPU slice and predicted collective times on it")
    topo.add_argument("name", help="slice name, e.g. v5e:4x4, v6e:4x4, v5p:2x2x4, v4:2x2x2")
    topo.add_argument("--bytes", type=float, default=32 * 2**20,
                      help="result bytes per device of each collective (default 32 MiB)")
    topo.add_argument("--seed", type=int, default=0, help="seed of the scattered placement")
    topo.add_argument("--deviceless", choices=["auto", "require", "never"], default="auto",
                      help="use libtpu's deviceless devices: when available (auto), always "
                           "(require: fail without libtpu) or never (simulated slice)")
    topo.add_argument("--uncalibrated", action="store_true",
                      help="ignore the calibration file (<generation>.json in the user's data "
                           "folder or $AOIZORA_LAB_CALIBRATION_DIR)")
    topo.add_argument("--order-model", choices=ORDER_MODELS, default=ModelOptions().order,
                      help="what a group's device order does to its collectives "
                           "(comm_model.ModelOptions.order; default %(default)s)")
    topo.set_defaults(run=_topology_command)
    pr = commands.add_parser(
        "prune", help="enumerate sharding candidates and prune them from the traced IR")
    pr.add_argument("case", help=CASE_HELP)
    pr.add_argument("--no-padding", action="store_true",
                    help="exclude sequence degrees that need padded tokens (admitted by "
                         "default: the token axis is padded and the padding masked)")
    pr.add_argument("--show-invalid", action="store_true",
                    help="also list the excluded combinations and why")
    pr.set_defaults(run=_prune_command)
    pl = commands.add_parser(
        "plan", help="search shardings and placements; print the ranking and baselines")
    pl.add_argument("case", help=CASE_HELP)
    pl.add_argument("--layers", type=int, default=None,
                    help="compile this many layers and scale the layer loop (faster)")
    pl.add_argument("--budget", type=int, default=20_000,
                    help="placement evaluations per candidate")
    pl.add_argument("--top", type=int, default=10, help="rows of the ranking to print")
    pl.add_argument("--json", help="write the best plan to this file")
    pl.add_argument("--verify", action="store_true",
                    help="compile the best plan on its own mesh (its device order) and check "
                         "that its collectives and predicted step are the scored ones; exit "
                         "status 1 when they differ")
    pl.add_argument("--compare", metavar="SETUP",
                    help="score your own setup beside the plan and say what to change: "
                         "MaxDiffusion keys ('ici_data_parallelism=2 attention=ulysses'), Wan "
                         "flags (--compare='--ulysses_size 2 --ring_size 4') or a mesh "
                         "('candidate=cfg2-uly4-fsdp order=0,1,4,5,...'; default plain order)")
    pl.add_argument("--order-model", choices=ORDER_MODELS, default=ModelOptions().order,
                    help="what a group's device order does to its collectives, for the whole "
                         "plan (PlanOptions.model; default %(default)s, the one the published "
                         "order-only measurements chose)")
    pl.add_argument("--flags", nargs="+", metavar="FLAGS",
                    help="compiler flag sets to search (names of compile.FLAG_SETS or quoted "
                         f"LIBTPU_INIT_ARGS; default: {' '.join(SEARCHED_FLAGS)})")
    pl.add_argument("--max-compiled", type=int, default=None, metavar="N",
                    help="a quick answer: compile only the N survivors the IR estimates best "
                         "(where estimates tie, the full search's winner may be left out)")
    pl.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                    help=f"answer within SECONDS (default {INTERACTIVE_TIME_LIMIT_S:g}), IR traces "
                         "and placement included: survivors compile best estimate first, "
                         "each system's best-estimate setup among the first; none starts "
                         "that would end later; compiles already cached are always read")
    pl.add_argument("--full", action="store_true",
                    help="no time limit: compile every survivor (with every flag set that "
                         "could win) and every system's setup")
    pl.add_argument("--no-systems", action="store_true",
                    help="skip the existing systems' setups (their compiles); the headline "
                         "then has no system to compare with")
    pl.add_argument("--draws", type=_draws, default=256, metavar="N",
                    help="price the answer under N draws of the model's uncertain constants "
                         "and choices: intervals, the odds against each system and the "
                         "robust choice (default 256; 0: none)")
    pl.add_argument("--whole", action="store_true",
                    help="also plan the text encoder and the VAE decoder on the slice and "
                         "print the whole video's time, part by part")
    pl.add_argument("--steps", type=int, default=None, metavar="N",
                    help="denoising steps of the whole video (with --whole; default: the "
                         "model's official sample_steps, models.wan.SAMPLING)")
    pl.add_argument("--quiet", action="store_true",
                    help="no progress lines (each stage and compile as it finishes)")
    pl.set_defaults(run=_plan_command)
    rep = commands.add_parser(
        "reports", help="run the notebooks for every report of the matrix; write HTML pages")
    rep.add_argument("--matrix", default="data/reports.yaml", help="report matrix (YAML)")
    rep.add_argument("--out", default="reports", help="output folder (pages and index.html)")
    rep.add_argument("--notebooks", default="notebooks", help="folder of the notebooks")
    rep.add_argument("--only", nargs="+", metavar="NAME", help="run only these reports")
    rep.add_argument("--all", action="store_true",
                     help="every report of the matrix, also those marked default: false")
    rep.add_argument("--kernel", default=None,
                     help="installed kernelspec to run (default: this interpreter)")
    rep.add_argument("--quiet", action="store_true", help="no progress lines")
    rep.set_defaults(run=_reports_command)
    ben = commands.add_parser(
        "bench", help="run the benchmarks (plan quality, search cost, quick plans, placement "
                      "throughput, interactive speed) "
                      "and write their Markdown report")
    ben.add_argument("--quick", action="store_true",
                     help="one small workload (1.3B@480p on v5e:2x4) compiled at 2 layers, "
                          "2,000 placement evaluations")
    ben.add_argument("--out", default="reports/benchmarks.md", help="the report to write")
    ben.add_argument("--only", nargs="+",
                     choices=["plan-quality", "search-cost", "quick-plans",
                              "placement-throughput", "interactive"],
                     help="run only these benchmarks")
    ben.add_argument("--num-layers", type=int, default=None,
                     help="compile depth (default: full, or 2 with --quick)")
    ben.add_argument("--cases", nargs="+", metavar="CASE",
                     help="plan-quality cases, e.g. wan2.1-t2v-14b@1280x720x81/v5e:4x4 "
                          "(default: the documented matrix)")
    ben.add_argument("--search-cases", nargs="+", metavar="CASE",
                     help="search-cost and quick-plans cases (default: "
                          "wan2.1-t2v-14b@1280x720x81/v5e:4x4; quick plans two more)")
    ben.add_argument("--skip-exhaustive", action="store_true",
                     help="search cost without the exhaustive comparison")
    ben.add_argument("--cache-dir", default=None,
                     help="compile cache (default compile/ in the user's cache folder or "
                          "$AOIZORA_LAB_CACHE_DIR; search cost always starts from an empty "
                          "one)")
    ben.add_argument("--resume", action="store_true",
                     help="read back the plan-quality cases recorded in plan-quality/ beside "
                          "--out (same depth and budget) instead of planning them again")
    ben.add_argument("--records-only", action="store_true",
                     help="plan nothing: write the plan-quality section from the records "
                          "(a case without one is a row saying so)")
    ben.add_argument("--quiet", action="store_true", help="no progress lines")
    ben.set_defaults(run=_bench_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``aoizora-lab``; library errors print one clear line and exit with status 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except AoizoraError as err:
        print(f"aoizora-lab: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
