"""The leapfrog jitter: ``L_t ~ U{ceil(f L)..L}`` for several ``f`` (``min_steps_fraction``) against NUTS.

    ./dev run python -m benchmarks.jitter --fractions 0,0.25,0.5 --seeds 0 \\
        --output benchmarks/results/jitter.json

The paper draws ``L_t`` from ``{1..L}`` (``f = 0``).  For each seed: one benchmark run
(``benchmarks.run``, quick settings) of the NUTS samplers and of the AHMC sampler
with the first fraction, then one run of the AHMC sampler per further fraction,
every JSON kept beside the summary (``<output stem>_f<f>_seed<k>.json``).  The runs are
made with ``--resume``: a run already in such a file (same settings) is kept, so
adding a seed to ``--seeds`` runs only the new seed.  The
summary gives, per model, the min bulk ESS per gradient of the coordinates (means)
and of their squares (variances) for every fraction, and as a ratio to the best
NUTS of the same seed: the jitter moves the two in opposite directions.

``--objective esjd_moments`` runs the AHMC sampler with that reward (every fraction), ``--sampler-options``
any further options of it (JSON, e.g. ``{"dense_mass": true}``);
``--baseline <summary.json>`` takes the best NUTS of each model and seed from an earlier
summary of this tool (same seeds and settings) instead of running NUTS again:

    ./dev run python -m benchmarks.jitter --objective esjd_moments --fractions 0,0.5 --seeds 0 \
        --baseline benchmarks/results/jitter.json --output benchmarks/results/moments.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from . import run as bench
from .seeds import min_metric

DEFAULT_MODELS = ("pima,ripley,breast_cancer,std_gauss_10,diag_gauss_10,corr_gauss_2,lgcp_16,eight_schools,"
                  "kidiq,earnings,sblrc,arK,garch,gp_pois_regr,gauss_mix")
METRICS = {"means": "ess_per_grad", "squares": "ess_per_grad_squares"}


def min_values(results: dict) -> dict:
    """``{(model, sampler): {"means": min ESS/grad, "squares": min ESS/grad of x^2}}`` of the finished runs."""
    per_metric = {name: min_metric(results, key) for name, key in METRICS.items()}
    runs = set().union(*per_metric.values())
    return {run: {name: values.get(run) for name, values in per_metric.items()} for run in runs}


def baseline_best_nuts(summary: dict, seeds: list[int]) -> dict:
    """``{(model, name, seed): best NUTS}`` from an earlier summary of this tool."""
    out = {}
    for model, row in summary["table"].items():
        for name in METRICS:
            for seed, value in zip(summary["seeds"], row[f"best_nuts_{name}"]):
                if seed in seeds:
                    out[(model, name, seed)] = value
    return out


def run_best_nuts(runs: dict, models: list[str], nuts: list[str]) -> dict:
    """``{(model, name, seed): best NUTS}`` from the first fraction's runs, where NUTS ran."""
    first = next(iter(runs))[0]
    out = {}
    for (fraction, seed), values in runs.items():
        if fraction != first:
            continue
        for model in models:
            for name in METRICS:
                found = [v for v in (values.get((model, s), {}).get(name) for s in nuts) if v is not None]
                out[(model, name, seed)] = max(found) if found else None
    return out


def summarize(runs: dict, models: list[str], nuts: list[str], sampler: str, baseline: dict | None = None) -> dict:
    """``runs[(fraction, seed)]`` = min_values of that run -> per model and fraction, values and NUTS ratios.

    The best NUTS come from the first fraction's runs, or from ``baseline`` (see ``baseline_best_nuts``)."""
    fractions = list(dict.fromkeys(f for f, _ in runs))
    seeds = sorted({s for _, s in runs})
    best_nuts = run_best_nuts(runs, models, nuts) if baseline is None else baseline
    table = {}
    for model in models:
        row = {}
        for name in METRICS:
            best = [best_nuts.get((model, name, seed)) for seed in seeds]
            row[f"best_nuts_{name}"] = best
            for fraction in fractions:
                values = [runs.get((fraction, seed), {}).get((model, sampler), {}).get(name) for seed in seeds]
                ratios = [v / b if v is not None and b else None for v, b in zip(values, best)]
                finite = [r for r in ratios if r is not None]
                row[f"f{fraction:g}_{name}"] = {
                    "values": values, "ratio_to_best_nuts": ratios,
                    "ratio_mean": float(np.mean(finite)) if finite else None}
        table[model] = row
    return {"fractions": fractions, "seeds": seeds, "nuts": nuts, "sampler": sampler, "table": table}


def markdown(summary: dict, command: str, environment: str) -> str:
    fractions = summary["fractions"]
    head = " | ".join(f"f = {f:g}" for f in fractions)
    lines = [
        "# Leapfrog jitter: `L_t ~ U{ceil(f L)..L}` against the best NUTS", "",
        f"`{command}`", "",
        f"Sampler `{summary['sampler']}` with `min_steps_fraction = f` (`f = 0`: the paper's `U{{1..L}}`)"
        f"{', objective `' + summary['objective'] + '`' if summary.get('objective') else ''}"
        f"{', options `' + json.dumps(summary['sampler_options']) + '`' if summary.get('sampler_options') else ''}; "
        f"NUTS: best of {', '.join(summary['nuts'])} in the same seed"
        f"{' (from ' + summary['baseline'] + ')' if summary.get('baseline') else ''}. Min bulk ESS per gradient over the "
        f"coordinates (means) and over their squares (variances), as a ratio to the best NUTS (mean over "
        f"seeds {summary['seeds']}).", "",
        f"| model | means: {head} | squares: {head} |",
        "|---|" + "---|" * (2 * len(fractions)),
    ]
    for model, row in summary["table"].items():
        cells = []
        for name in METRICS:
            for f in fractions:
                value = row[f"f{f:g}_{name}"]["ratio_mean"]
                cells.append("-" if value is None else f"{value:.2f}")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    lines += ["", f"Machine: {environment}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jitter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--fractions", default="0,0.5")
    parser.add_argument("--sampler", default="ahmc_blackjax")
    parser.add_argument("--nuts", default="blackjax_nuts,numpyro_nuts")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--objective", default=None, help="the AHMC sampler's objective (default: its own)")
    parser.add_argument("--sampler-options", type=json.loads, default={},
                        help="further options of the AHMC sampler (JSON object), e.g. '{\"dense_mass\": true}'")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="an earlier summary of this tool: its best NUTS per model and seed (NUTS is not run)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    nuts = args.nuts.split(",")
    baseline = None
    if args.baseline is not None:
        earlier = json.loads(args.baseline.read_text())
        missing = sorted(set(seeds) - set(earlier["seeds"]))
        if missing:
            parser.error(f"--baseline {args.baseline} has no NUTS runs for seeds {missing}")
        baseline, nuts = baseline_best_nuts(earlier, seeds), earlier["nuts"]
    runs, environment = {}, None
    for seed in seeds:
        for index, fraction in enumerate(fractions):
            samplers = ([*nuts, args.sampler] if index == 0 and baseline is None else [args.sampler])
            path = args.output.with_name(f"{args.output.stem}_f{fraction:g}_seed{seed}.json")
            sampler_options = {**args.sampler_options, "min_steps_fraction": fraction}
            if args.objective is not None:
                sampler_options["objective"] = args.objective
            options = json.dumps({args.sampler: sampler_options})
            results = bench.main(["--models", args.models, "--samplers", ",".join(samplers), "--seed", str(seed),
                                  "--sampler-options", options, "--output", str(path), "--resume"])
            runs[(fraction, seed)] = min_values(results)
            env = results["environment"]
            environment = environment or f"{env.get('cpu_model', '?')}, {env.get('nproc', '?')} CPUs (shared)"
    command = "python -m benchmarks.jitter " + shlex.join(argv)
    summary = {"command": command, "environment": environment, "objective": args.objective,
               "sampler_options": args.sampler_options,
               "baseline": None if args.baseline is None else str(args.baseline),
               **summarize(runs, args.models.split(","), nuts, args.sampler, baseline)}
    args.output.write_text(json.dumps(summary, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(summary, command, environment) + "\n")
    print(markdown(summary, command, environment))
    return summary


if __name__ == "__main__":
    main()
