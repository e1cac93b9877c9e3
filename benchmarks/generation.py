"""Generation parts: published absolute VAE-decode and text-encoder times, rebuilt and predicted.

    python benchmarks/generation.py [--out reports/benchmarks.md]

Prints the tables of :mod:`aoizora_lab.bench.generation` and writes its "Generation" section
of the report (the other sections are kept). Each row compiles one part deviceless (minutes
each, cold; the compile cache keeps them).
"""

from __future__ import annotations

import argparse

import pandas as pd

from aoizora_lab.bench.generation import SECTION, generation_check
from aoizora_lab.bench.report import ReportFile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/benchmarks.md",
                        help=f"report whose {SECTION!r} section is rewritten")
    args = parser.parse_args()
    check = generation_check(progress=print)
    with pd.option_context("display.width", 250, "display.max_columns", 40,
                           "display.max_colwidth", 60):
        print(check.rows.drop(columns=["note", "source"]).to_string(
            index=False, float_format=lambda v: f"{v:.4g}"))
        print(check.targets.to_string(index=False))
    report = ReportFile(args.out, keep=True, command="python benchmarks/generation.py")
    report.add(check.markdown(),
               module="aoizora_lab.bench.generation")
    print(f"\nwrote {report.path}")


if __name__ == "__main__":
    main()
