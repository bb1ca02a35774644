"""ARMHMC against each hand-set RMHMC over several seeds of ``benchmarks.rmhmc``.

Reads the JSON files of one ``benchmarks.rmhmc`` run per seed and prints a Markdown table: per model
and hand-set sampler, the ratio ARMHMC / hand-set of the min ESS per cost unit of the means and of
the squares (variances), per seed and as the mean over seeds, with the largest R-hat of each.

    ./dev run python -m benchmarks.rmhmc_seeds_table benchmarks/results/rmhmc_gc_seed0.json ...

``--adaptive armhmc_paper_box`` divides another adaptive sampler of the same runs (e.g. ARMHMC in the
paper's box) by every other sampler of the runs instead (``armhmc`` then shows as a row of its own).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path


def ratios(files: list[Path], adaptive: str = "armhmc") -> list[dict]:
    """One row per (model, hand-set sampler): per-seed ratios of ``adaptive`` to it, and R-hats."""
    runs = [json.loads(Path(f).read_text())["runs"] for f in files]
    rows = []
    for model in runs[0]:
        if adaptive not in runs[0][model]:
            continue
        for sampler in runs[0][model]:
            if sampler == adaptive or not all(sampler in r.get(model, {}) for r in runs):
                continue
            row = {"model": model, "sampler": sampler, "means": [], "squares": [], "rhat": [], "rhat_adaptive": []}
            for r in runs:
                ours, theirs = r[model][adaptive], r[model][sampler]
                for column, key in (("means", "ess_per_grad"), ("squares", "ess_per_grad_squares")):
                    row[column].append(_ratio(ours[key]["min"], theirs[key]["min"]))
                row["rhat"].append(theirs["rhat_max"])
                row["rhat_adaptive"].append(ours["rhat_max"])
            rows.append(row)
    return rows


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs > 0 else math.inf


def _cell(values: list[float], digits: int = 2) -> str:
    shown = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{shown} (mean {sum(values) / len(values):.{digits}f})"  # inf when any ratio is


def markdown(rows: list[dict], files: list[Path], command: str, adaptive: str = "armhmc") -> str:
    name = "ARMHMC" if adaptive == "armhmc" else f"`{adaptive}`"
    lines = [
        f"# {name} / hand-set RMHMC over seeds",
        "",
        f"`{command}`",
        "",
        "Files: " + ", ".join(f"`{Path(f).name}`" for f in files) + f". Ratio of {name}'s min ESS per cost "
        f"unit to the hand-set sampler's, per seed (mean); above 1 means {name} is ahead. inf: the hand-set "
        "sampler's ESS is 0 or it never moved.",
        "",
        f"| model | hand-set | means | squares (variances) | hand-set max R-hat | {name} max R-hat |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['model']} | {row['sampler']} | {_cell(row['means'])} | {_cell(row['squares'])} | "
                     f"{', '.join(f'{v:.3f}' for v in row['rhat'])} | "
                     f"{', '.join(f'{v:.3f}' for v in row['rhat_adaptive'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="benchmarks.rmhmc JSON files, one per seed")
    parser.add_argument("--output", type=Path, help="write the Markdown here as well")
    parser.add_argument("--adaptive", default="armhmc",
                        help="the sampler divided by every other sampler of the runs (default armhmc)")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.rmhmc_seeds_table " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    text = markdown(ratios(args.files, args.adaptive), args.files, command, args.adaptive)
    if args.output:
        args.output.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
