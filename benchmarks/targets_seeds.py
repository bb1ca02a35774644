"""The issue's targets over several seeds: how often each is met, and its mean ratio.

    ./dev run python -m benchmarks.targets_seeds RUN_SEED0.json RUN_SEED1.json ... > OUT.md

Each file is one benchmark run (``benchmarks.run``, or the per-seed files of ``benchmarks.seeds``)
of one seed; all must share the chains, draws and dtype. For every AHMC sampler, model and target of
:func:`benchmarks.report.targets` (per gradient against the best NUTS of the same seed, per second
against NumPyro's NUTS of the same seed, counting warm-up on the logistic regressions, the largest
|z| against a posteriordb reference, max R-hat) it gives the seeds in which the target is met, the
mean ratio over seeds and its range. One seed is one draw: a model's ratio moves by 10-30% from seed
to seed, so a target met in the mean but not in every seed is told apart from one missed in the mean.
Only (model, sampler) pairs present in every file are counted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from .readme_table import SAME_RUN_SETTINGS
from .report import NUTS, targets
from .seeds import min_metric, summarize

# (key of report.targets' rows, label, threshold, comparison; "need": the row's own threshold, 1.3x or 1x)
TARGETS = (
    ("grad_ratio", "min ESS/grad vs best NUTS", None, "need"),
    ("warmup_ratio", "counting warm-up vs best NUTS (logistic)", 1.0, ">="),
    ("second_ratio", "min ESS/s vs NumPyro's NUTS", 1.0, ">="),
    ("rhat", "max R-hat", 1.01, "<"),
    ("z", "max \\|z\\| against the reference", 4.0, "<="),  # escaped: a Markdown table cell
)


def load(paths: list[str]) -> dict[int, dict]:
    """``{seed: results}``; every run must be made with the same chains, draws and dtype, one per seed."""
    runs: dict[int, dict] = {}
    first = None
    for path in paths:
        results = json.load(open(path))
        seed = int(results["environment"]["seed"])
        settings = {key: results["settings"].get(key) for key in SAME_RUN_SETTINGS}
        if first is None:
            first = (path, settings)
        elif settings != first[1]:
            raise SystemExit(f"{path} was not made like {first[0]}: {settings} against {first[1]}")
        if seed in runs:
            raise SystemExit(f"{path}: seed {seed} is given twice")
        runs[seed] = results
    return runs


def _met(value: float, threshold: float, comparison: str) -> bool:
    return {">=": value >= threshold, "<": value < threshold, "<=": value <= threshold}[comparison]


def per_seed(runs: dict[int, dict], models: list[str] | None = None) -> dict:
    """``{(sampler, model): {key: {seed: (value, met, threshold)}}}``, keeping a target only where every
    seed has it (and a pair only if some target is left)."""
    found: dict = {}
    for seed, results in runs.items():
        for row in targets(results):
            if models is not None and row["model"] not in models:
                continue
            cell = found.setdefault((row["sampler"], row["model"]), {})
            for key, _, threshold, comparison in TARGETS:
                if row.get(key) is None:
                    continue
                if comparison == "need":
                    met = row["grad_met"]
                    threshold = row["grad_need"]
                else:
                    met = _met(row[key], threshold, comparison)
                cell.setdefault(key, {})[seed] = (float(row[key]), bool(met), threshold)
    seeds = set(runs)
    complete = {pair: {key: values for key, values in cell.items() if set(values) == seeds}
                for pair, cell in found.items()}
    return {pair: cell for pair, cell in complete.items() if cell}


def _per_second_ratios(runs: dict[int, dict], models, sampler: str, base: str) -> dict:
    """``{model: [sampler's min ESS/s / base's, per seed]}`` over the models where both ran in every seed."""
    per_seed_values = {seed: min_metric(results, "ess_per_second") for seed, results in runs.items()}
    table = summarize(per_seed_values, base)
    order = [model for model in next(iter(runs.values()))["models"] if models is None or model in models]
    ratios = {model: table.get(model, {}).get(sampler, {}).get("ratio_to_baseline") for model in order}
    return {model: values for model, values in ratios.items() if values and None not in values}


def nuts_per_second(runs: dict[int, dict], models: list[str] | None = None) -> dict:
    """``{sampler: {model: [min ESS/s / NumPyro NUTS's, per seed]}}`` for the other NUTS baselines."""
    names = dict.fromkeys(r["sampler"] for results in runs.values() for r in results["runs"])
    found = {name: _per_second_ratios(runs, models, name, "numpyro_nuts") for name in names
             if name in NUTS and name != "numpyro_nuts"}
    return {name: ratios for name, ratios in found.items() if ratios}


# Each AHMC sampler and the NUTS that runs in the same loop as it.
SAME_FRAMEWORK = {"ahmc_blackjax": "blackjax_nuts", "ahmc_numpyro": "numpyro_nuts", "ahmc_pymc": "pymc_nuts",
                  "ahmc_pymc_pooled": "pymc_nuts", "ahmc_pymc_jax": "nutpie"}


def same_framework_per_second(runs: dict[int, dict], models: list[str] | None = None) -> dict:
    """``{ahmc sampler: (its NUTS, {model: [per-second ratios per seed]})}``."""
    found = {sampler: (nuts, _per_second_ratios(runs, models, sampler, nuts))
             for sampler, nuts in SAME_FRAMEWORK.items()}
    return {sampler: pair for sampler, pair in found.items() if pair[1]}


def spread(values: dict) -> dict:
    """Mean, min and max of a target's values over the seeds, the seeds in which it is met, and its threshold."""
    numbers = np.array([v[0] for v in values.values()])
    threshold = next(iter(values.values()))[2]
    return {"mean": float(numbers.mean()), "min": float(numbers.min()), "max": float(numbers.max()),
            "seeds_met": sum(v[1] for v in values.values()), "seeds": len(values), "threshold": threshold}


def mean_met(key: str, row: dict) -> bool:
    """A ratio is met on average when its mean over seeds reaches the target; R-hat and |z| in every seed."""
    comparison = next(t[3] for t in TARGETS if t[0] == key)
    if comparison in ("need", ">="):
        return row["mean"] >= row["threshold"]
    return row["seeds_met"] == row["seeds"]


def markdown(runs: dict[int, dict], models: list[str] | None = None) -> str:
    cells = per_seed(runs, models)
    samplers = list(dict.fromkeys(sampler for sampler, _ in cells))
    seeds = sorted(runs)
    lines = [f"# The issue's targets over seeds {', '.join(map(str, seeds))}", "",
             "Ratios are against the NUTS of the same seed (per gradient: the best of the NUTS run; per "
             "second: NumPyro's NUTS). A ratio is *met on average* when its mean over the seeds reaches "
             "the target; R-hat and |z| must hold in every seed. \"Seeds met\" counts the seeds in which "
             "the target holds.", "",
             "| sampler | target | models met on average | models met in every seed | below on average: mean "
             "(min-max), seeds met |", "|---|---|---|---|---|"]
    for sampler in samplers:
        for key, label, _, _ in TARGETS:
            rows = {model: spread(cell[key]) for (s, model), cell in cells.items() if s == sampler and key in cell}
            if not rows:
                continue
            on_average = [m for m, row in rows.items() if mean_met(key, row)]
            every = [m for m, row in rows.items() if row["seeds_met"] == row["seeds"]]
            below = [f"{m} {_number(key, row['mean'])} ({_number(key, row['min'])}-{_number(key, row['max'])}), "
                     f"{row['seeds_met']} of {row['seeds']}"
                     for m, row in rows.items() if m not in on_average]
            lines.append(f"| {sampler} | {label} | {len(on_average)} of {len(rows)} | {len(every)} of {len(rows)} | "
                         f"{'; '.join(below) or 'none'} |")
    lines += ["", "## The NUTS samplers per second against NumPyro's NUTS (the same runs)", "",
              "What the per-second target asks of a sampler, seen on the baselines themselves.", "",
              "| sampler | models at or above NumPyro's NUTS on average | mean ratio per model, lowest to highest |",
              "|---|---|---|"]
    for sampler, ratios in nuts_per_second(runs, models).items():
        means = sorted((float(np.mean(values)), model) for model, values in ratios.items())
        at_or_above = sum(mean >= 1.0 for mean, _ in means)
        lines.append(f"| {sampler} | {at_or_above} of {len(means)} | "
                     + ", ".join(f"{model} {mean:.2f}x" for mean, model in means) + " |")
    lines += ["", "## Context, not a target: per second against the NUTS of the same framework", "",
              "The PyMC step methods against PyMC's NUTS (both in PyMC's Python loop), the compiled PyMC path "
              "against nutpie (both compiled), the NumPyro kernel against NumPyro's NUTS (both in NumPyro's "
              "loop) and the BlackJAX routine against BlackJAX's NUTS (whose chains are `vmap`-ed, so each "
              "iteration waits for the longest trajectory of the four: that row flatters AHMC).", "",
              "| sampler | against | models at or above on average | below on average: mean (min-max) |",
              "|---|---|---|---|"]
    for sampler, (nuts, ratios) in same_framework_per_second(runs, models).items():
        below = [f"{model} {np.mean(v):.2f}x ({min(v):.2f}x-{max(v):.2f}x)" for model, v in ratios.items()
                 if np.mean(v) < 1.0]
        lines.append(f"| {sampler} | {nuts} | {len(ratios) - len(below)} of {len(ratios)} | "
                     f"{'; '.join(below) or 'none'} |")
    lines += ["", "## Per model", "",
              "| model | sampler | " + " | ".join(label for _, label, _, _ in TARGETS) + " |",
              "|---|---|" + "---|" * len(TARGETS)]
    for (sampler, model), cell in sorted(cells.items(), key=lambda item: (item[0][1], samplers.index(item[0][0]))):
        entries = []
        for key, _, _, _ in TARGETS:
            if key not in cell:
                entries.append("-")
                continue
            row = spread(cell[key])
            entries.append(f"{_number(key, row['mean'])} ({_number(key, row['min'])}-{_number(key, row['max'])}), "
                           f"{row['seeds_met']}/{row['seeds']}")
        lines.append(f"| {model} | {sampler} | " + " | ".join(entries) + " |")
    lines += ["", "Each cell: mean (min-max) over the seeds, and the seeds in which the target is met. The runs:", "",
              *[f"- seed {seed}: `{runs[seed]['environment'].get('command', '?')}` (git "
                f"{str(runs[seed]['environment'].get('git_commit', '?'))[:7]}, {runs[seed].get('mode', '?')} mode)"
                for seed in seeds]]
    return "\n".join(lines)


def _number(key: str, value: float) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:.3f}" if key == "rhat" else (f"{value:.2f}" if key == "z" else f"{value:.2f}x")


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.targets_seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="benchmark run JSON files, one per seed")
    parser.add_argument("--models", default=None, help="only these models (comma-separated)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    text = markdown(load(args.files), args.models.split(",") if args.models else None)
    print(text)
    return text


if __name__ == "__main__":
    main()
