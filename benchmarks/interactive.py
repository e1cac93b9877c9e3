"""Interactive speed: the main job from empty caches, then every notebook re-run warm.

    python benchmarks/interactive.py [--matrix data/reports.yaml] [--out reports/benchmarks.md]

Runs the reports of the matrix not marked ``default: false`` with every cache in an empty
temporary folder (a fresh machine after installation), then again on the caches that run
filled, and prints one row per notebook; with ``--out`` it also rewrites that report's
"Interactive speed" section. The measurement lives in :mod:`aoizora_lab.bench.interactive`.
"""

from __future__ import annotations

import argparse

from aoizora_lab.bench import ReportFile, interactive_markdown, interactive_speed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="data/reports.yaml", help="report matrix (YAML)")
    parser.add_argument("--notebooks", default="notebooks", help="folder of the notebooks")
    parser.add_argument("--out", default=None,
                        help="a report whose Interactive speed section to rewrite")
    args = parser.parse_args()
    table = interactive_speed(args.matrix, args.notebooks)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    if args.out:
        report = ReportFile(args.out, command="python benchmarks/interactive.py", keep=True)
        report.add(interactive_markdown(table),
                   module="aoizora_lab.bench.interactive")
        print(f"section written to {report.path}")


if __name__ == "__main__":
    main()
