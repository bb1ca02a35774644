"""Before/after table of the same (model, sampler, seed) runs in two sets of benchmark JSON files.

    ./dev run python -m benchmarks.compare_runs --before benchmarks/results/jax_seeds_seed{0,1,2}.json \
        --after benchmarks/results/restart_rule_seeds_seed{0,1,2}.json --output benchmarks/results/restart_rule.md

For a change that should alter only some runs (a rule that fires rarely): every pair present in both
sets is listed with its min ESS per gradient, max R-hat and warm-up restarts before and after, and
whether the draws changed (same min ESS per gradient to 1e-12 counts as unchanged: the runs are
deterministic given the seed). Each file's seed comes from its environment record.

For a change that alters every run (a new default), the table's per-seed ratios are mostly the seed's
noise; the summary below it gives per model and sampler the means over the seeds of the min ESS per
gradient of the means and of the squares, the largest R-hat, and how many runs had a chain whose
final arm takes a single leapfrog step (``L = 1``, every transition a MALA step).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def load_runs(paths) -> dict[tuple[str, str, int], dict]:
    """``(model, sampler, seed) -> run`` for the finished runs of every file."""
    runs = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        seed = int(data["environment"]["seed"])
        for run in data["runs"]:
            if run.get("status") == "ok":
                runs[run["model"], run["sampler"], seed] = run
    return runs


def _row(run) -> tuple[float, float, float]:
    metrics = run["metrics"]
    restarts = sum(run.get("extra", {}).get("restarts", []) or [0])
    return float(metrics["ess_per_grad"]["min"]), float(metrics["rhat_max"]), float(restarts)


def compare(before: dict, after: dict) -> tuple[str, dict]:
    """Markdown table of the pairs present in both, and counts (pairs, changed)."""
    lines = ["| model | sampler | seed | min ESS/grad before | after | ratio | max R-hat before | after | "
             "restarts before | after |", "|---|---|---|---|---|---|---|---|---|---|"]
    changed, log_ratios = 0, []
    keys = sorted(set(before) & set(after))
    for key in keys:
        (ess0, rhat0, restarts0), (ess1, rhat1, restarts1) = _row(before[key]), _row(after[key])
        same = abs(ess1 - ess0) <= 1e-12 * max(abs(ess0), 1.0)
        changed += not same
        if ess0 > 0 and ess1 > 0:
            log_ratios.append(math.log(ess1 / ess0))
        ratio = "same" if same else f"{ess1 / ess0:.2f}x" if ess0 > 0 else "n/a"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {ess0:.4g} | {ess1:.4g} | {ratio} | {rhat0:.3f} | "
                     f"{rhat1:.3f} | {restarts0:g} | {restarts1:g} |")
    geometric_mean = math.exp(sum(log_ratios) / len(log_ratios)) if log_ratios else math.nan
    below = sum(r < 0 for r in log_ratios)
    return "\n".join(lines) + "\n", {"pairs": len(keys), "changed": changed, "geometric_mean": geometric_mean,
                                      "below": below}


def _summary_row(run) -> tuple[float, float, float, bool]:
    metrics = run["metrics"]
    squares = metrics.get("ess_per_grad_squares", {}).get("min", math.nan)
    steps = run.get("extra", {}).get("final_num_steps") or []
    return (float(metrics["ess_per_grad"]["min"]), float(squares), float(metrics["rhat_max"]),
            any(s is not None and s <= 1 for s in steps))


def summarize_pairs(before: dict, after: dict) -> str:
    """Per (model, sampler), over the seeds present in both sets: means of the min ESS per gradient
    (means and squares), the largest R-hat, and the runs with a chain at ``L = 1``."""
    groups: dict[tuple[str, str], list] = {}
    for key in sorted(set(before) & set(after)):
        groups.setdefault(key[:2], []).append((_summary_row(before[key]), _summary_row(after[key])))
    lines = ["| model | sampler | seeds | min ESS/grad before | after | squares before | after | "
             "max R-hat before | after | runs at L = 1 before | after |", "|---" * 11 + "|"]
    for (model, sampler), pairs in groups.items():
        cells = []
        for column in range(3):
            for side in (0, 1):
                values = [pair[side][column] for pair in pairs]
                cells.append(f"{max(values):.3f}" if column == 2 else f"{sum(values) / len(values):.4g}")
        cells += [str(sum(pair[side][3] for pair in pairs)) for side in (0, 1)]
        lines.append(f"| {model} | {sampler} | {len(pairs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_runs", description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", required=True, help="benchmark JSON files (the old runs)")
    parser.add_argument("--after", nargs="+", required=True, help="benchmark JSON files (the new runs)")
    parser.add_argument("--output", default=None, help="write the Markdown table here (default: print it)")
    args = parser.parse_args(argv)
    before, after = load_runs(args.before), load_runs(args.after)
    table, counts = compare(before, after)
    text = (f"{counts['changed']} of {counts['pairs']} runs changed; min ESS per gradient after / before: "
            f"geometric mean {counts['geometric_mean']:.3f}, {counts['below']} runs below 1.\n\n{table}\n"
            f"Per model and sampler, over the seeds (means; R-hat the largest):\n\n{summarize_pairs(before, after)}")
    if args.output:
        Path(args.output).write_text(text)
    print(text)
    return counts


if __name__ == "__main__":
    main()
