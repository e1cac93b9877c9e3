"""Device order: the compiler's labels and the published order-only gains, predicted.

    python benchmarks/device_order.py [--no-compile] [--workers N] [--cases CASE ...] \
        [--out reports/benchmarks.md]

Prints the tables of :mod:`aoizora_lab.bench.order` and writes its "Device order" section of
the report (the other sections are kept). ``--no-compile`` skips the deviceless compiles of
the label table (the measurements need only the libtpu slices); ``--cases`` adds each case's
plan searched and priced under every order model (planned at 2 layers through the caches:
cold, that is a whole plan per case).
"""

from __future__ import annotations

import argparse

import pandas as pd

from aoizora_lab.bench.order import SECTION, device_order_check
from aoizora_lab.bench.report import ReportFile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-compile", action="store_true",
                        help="leave out the compiler's labels (no deviceless compiles)")
    parser.add_argument("--workers", type=int, default=None,
                        help="compiles at a time (default: as many as fit)")
    parser.add_argument("--cases", nargs="*", default=[], metavar="CASE",
                        help="plans to search and price under every order model, e.g. "
                             "wan2.1-t2v-14b@832x480x81/v5e:8x8")
    parser.add_argument("--out", default="reports/benchmarks.md",
                        help=f"report whose {SECTION!r} section is rewritten")
    args = parser.parse_args()
    check = device_order_check(compile_probes=not args.no_compile, workers=args.workers,
                               cases=args.cases, progress=print)
    with pd.option_context("display.width", 250, "display.max_columns", 40,
                           "display.max_colwidth", 60):
        if check.probes is not None:
            print(check.probes.to_string(index=False))
        print(check.measurements.drop(columns=["note"]).to_string(
            index=False, float_format=lambda v: f"{v:.4g}"))
        print(check.targets.to_string(index=False))
        if check.plans is not None:
            print(check.plans.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    report = ReportFile(args.out, keep=True, command="python benchmarks/device_order.py")
    report.add(check.markdown(),
               module="aoizora_lab.bench.order")
    print(f"\nwrote {report.path}")


if __name__ == "__main__":
    main()
