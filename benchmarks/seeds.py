"""The seed-to-seed spread of the benchmark's headline ratio: strict ESS per gradient against a baseline.

    ./dev run python -m benchmarks.seeds --models pima,ripley,breast_cancer \\
        --samplers ahmc_pymc,pymc_nuts --baseline pymc_nuts --seeds 0,1,2,3,4 \\
        --output runs/pymc_seeds.json

One benchmark run (``benchmarks.run``, quick settings) per seed; each run's
JSON is kept beside the summary (``<output stem>_seed<k>.json``).  The summary
gives, per model and sampler, the strict ESS per gradient of every seed (min over coordinates of
min(bulk ESS of x, of (x - mean)^2) over all gradients, warm-up included: ``benchmarks.headline``;
``--metric means``: the older min ESS of the means per sampling gradient), its ratio
to the baseline's in the same seed, and the mean, min and max of those ratios:
one seed's ratio moves by 10-30% on these models, so a target is judged on the
spread, not on one run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from . import headline
from . import run as bench


def min_metric(results: dict, key: str = "ess_per_grad") -> dict:
    """``{(model, sampler): min of metrics[key]}`` of one run's completed samplers that have it."""
    out = {}
    for row in results["runs"]:
        metrics = row.get("metrics") or {}
        value = (metrics.get(key) or {}).get("min")
        if row.get("status") == "ok" and value is not None:
            out[(row["model"], row["sampler"])] = float(value)
    return out


def strict_metric(results: dict, per: str = "gradient") -> dict:
    """``{(model, sampler): strict ESS per gradient (warm-up included) or per second (total wall time)}``."""
    of = headline.per_gradient if per == "gradient" else headline.per_second
    return {(row["model"], row["sampler"]): float(of(row)) for row in results["runs"]
            if row.get("status") == "ok" and row.get("metrics")}


def min_ess_per_grad(results: dict) -> dict:
    """``{(model, sampler): min ESS per gradient}`` of one run's completed samplers."""
    return min_metric(results, "ess_per_grad")


def baseline_value(values_of_seed: dict, model: str, baseline: str) -> float | None:
    """The baseline's value on ``model`` in one seed; for ``"a,b"`` the best of the listed samplers there."""
    found = [values_of_seed[(model, name)] for name in baseline.split(",") if (model, name) in values_of_seed]
    return max(found) if found else None


def summarize(per_seed: dict[int, dict], baseline: str) -> dict:
    """Ratios to ``baseline`` (a sampler, or ``"a,b"``: the best of them in each seed) per model, sampler
    and seed, and their spread."""
    keys = sorted({key for values in per_seed.values() for key in values})
    table = {}
    for model, sampler in keys:
        seeds, values, ratios = [], [], []
        for seed, values_of_seed in sorted(per_seed.items()):
            value, base = values_of_seed.get((model, sampler)), baseline_value(values_of_seed, model, baseline)
            seeds.append(seed)
            values.append(value)
            ratios.append(value / base if value is not None and base else None)
        finite = [r for r in ratios if r is not None]
        table.setdefault(model, {})[sampler] = {
            "seeds": seeds, "min_ess_per_grad": values, "ratio_to_baseline": ratios,
            "ratio_mean": float(np.mean(finite)) if finite else None,
            "ratio_min": float(np.min(finite)) if finite else None,
            "ratio_max": float(np.max(finite)) if finite else None,
        }
    return table


def _table_lines(table: dict) -> list[str]:
    lines = ["| model | sampler | ratio per seed | mean (min-max) |", "|---|---|---|---|"]
    for model, samplers in table.items():
        for sampler, row in samplers.items():
            per_seed = ", ".join("-" if r is None else f"{r:.2f}" for r in row["ratio_to_baseline"])
            spread = "-" if row["ratio_mean"] is None else (
                f"{row['ratio_mean']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})")
            lines.append(f"| {model} | {sampler} | {per_seed} | {spread} |")
    return lines


def _named(baseline: str) -> str:
    return f"the best of {baseline.replace(',', ', ')} in each seed" if "," in baseline else baseline


def markdown(summary: dict, baseline: str, command: str) -> str:
    metric = "Strict ESS" if summary.get("metric", "strict") == "strict" else "Min ESS of the means"
    lines = [f"# {metric} per gradient over seeds, as a ratio to {_named(baseline)}", "", f"`{command}`", "",
             *_table_lines(summary["table"])]
    if summary.get("per_second_table"):
        strict = summary.get("metric", "strict") == "strict"
        lines += ["", f"## {metric} per second, as a ratio to {_named(summary['per_second_baseline'])}", "",
                  "(Total wall time, compilation included; the same runs.)" if strict else
                  "(Sampling phase, compilation apart; the same runs.)", "",
                  *_table_lines(summary["per_second_table"])]
    lines += ["", f"Seeds: {summary['seeds']}. Machine: {summary['environment']}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--samplers", required=True)
    parser.add_argument("--baseline", required=True,
                        help="sampler the ratios divide by (also run); a,b: the best of these in each seed")
    parser.add_argument("--per-second-baseline", default=None,
                        help="also tabulate min ESS per second as a ratio to this sampler (or a,b: the best)")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--metric", choices=("strict", "means"), default="strict",
                        help="strict (the headline's) or means (min ESS of x per sampling gradient)")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--sampler-options", default=None,
                        help="passed to every run unchanged (JSON: {sampler: {option: value}})")
    args = parser.parse_args(argv)
    samplers = args.samplers.split(",")
    for option, value in (("--baseline", args.baseline), ("--per-second-baseline", args.per_second_baseline)):
        if value is not None and not set(value.split(",")) <= set(samplers):
            parser.error(f"{option} {value} must be among --samplers {args.samplers}")
    seeds = [int(s) for s in args.seeds.split(",")]
    per_seed, per_second, environment = {}, {}, None
    for seed in seeds:
        path = args.output.with_name(f"{args.output.stem}_seed{seed}.json")
        options = ["--sampler-options", args.sampler_options] if args.sampler_options else []
        results = bench.main(["--models", args.models, "--samplers", args.samplers, "--seed", str(seed),
                              "--output", str(path), *options])
        if args.metric == "strict":
            per_seed[seed], per_second[seed] = strict_metric(results), strict_metric(results, "second")
        else:
            per_seed[seed], per_second[seed] = min_ess_per_grad(results), min_metric(results, "ess_per_second")
        env = results["environment"]
        environment = environment or f"{env.get('cpu_model', '?')}, {env.get('nproc', '?')} CPUs (shared)"
    command = "python -m benchmarks.seeds " + shlex.join(argv)
    summary = {"command": command, "metric": args.metric, "baseline": args.baseline, "seeds": seeds, "environment": environment,
               "table": summarize(per_seed, args.baseline)}
    if args.per_second_baseline:
        summary.update(per_second_baseline=args.per_second_baseline,
                       per_second_table=summarize(per_second, args.per_second_baseline))
    args.output.write_text(json.dumps(summary, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(summary, args.baseline, command) + "\n")
    print(markdown(summary, args.baseline, command))
    return summary


if __name__ == "__main__":
    main()
