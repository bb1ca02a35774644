"""Where AHMC's warm-up gradients go, and what two warm-up variants change.

    ./dev run python -m benchmarks.warmup_cost run --models pima,ripley --seeds 0,1,2 --output OUT.json
    ./dev run python -m benchmarks.warmup_cost table OUT.json [MORE.json ...] > OUT.md

``run`` repeats the benchmark's ``ahmc_blackjax`` run (same keys, starting points and 1000 + 1000
draws, so the default's seed-0 rows are the full run's) for each model, seed and variant, and records
the leapfrog steps per iteration in the four parts of a run: the early metric phase (until the first
slow mass-matrix window closes, where ``L`` is capped at ``EARLY_MAX_STEPS``), the rest of the metric
phase, the GP rounds of warm-up (``p_i = 1``: the arm moves every round) and sampling; with the min
bulk ESS of the coordinates and of their centred squares, per sampling gradient and counting warm-up
too, and the max R-hat (the benchmark's ``metrics.summarize``).  Variants (``--variants``, JSON
``{label: options}``): the options go to the sampler, except ``early_max_steps``, which sets the
engine's module constant for that variant's runs.  Finished
(model, seed, variant) records already in ``--output`` are kept, so two processes can split the models
between two files.  ``table`` prints the means over seeds with their standard errors, from any number
of such files.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

import numpy as np

DEFAULT_VARIANTS = {"default": {}, "early_max_steps_16": {"early_max_steps": 16},
                    "metric_fraction_0.7": {"metric_fraction": 0.7}}
PHASES = ("early", "metric", "gp_warmup", "sampling")


def phase_bounds(num_warmup: int, metric_fraction: float) -> list[tuple[int, int]]:
    """Iteration ranges of the four parts: the first slow window's end comes from BlackJAX's schedule."""
    from blackjax.adaptation.window_adaptation import build_schedule

    metric = int(round(metric_fraction * num_warmup))
    window_ends = np.flatnonzero(np.asarray(build_schedule(metric))[:, 1])
    first = int(window_ends[0]) + 1 if len(window_ends) else metric
    return [(0, first), (first, metric), (metric, num_warmup), (num_warmup, None)]


def run_one(model, seed: int, options: dict, num_warmup: int = 1000, num_samples: int = 1000) -> dict:
    from ahmc.adapters import _jax_engine

    from .metrics import summarize
    from .models import initial_positions
    from .run import _model_key
    from .samplers import run_ahmc_blackjax

    options = dict(options)
    early = options.pop("early_max_steps", None)
    saved = _jax_engine.EARLY_MAX_STEPS
    try:
        if early is not None:
            _jax_engine.EARLY_MAX_STEPS = int(early)  # read when the engine's step is traced
        run = run_ahmc_blackjax(_model_key(seed, model.name), model, initial_positions(model, 4, seed),
                                num_warmup, num_samples, **options)
    finally:
        _jax_engine.EARLY_MAX_STEPS = saved
    steps = np.asarray(run.keep["tuning"]["info"]["num_integration_steps"]).mean(axis=1)
    default_fraction = inspect.signature(_jax_engine.build_engine).parameters["metric_fraction"].default
    bounds = phase_bounds(num_warmup, options.get("metric_fraction", default_fraction))
    metrics = summarize(run.draws, run.num_grads_warmup, run.num_grads_sampling)  # the benchmark's own numbers
    return {"model": model.name, "seed": seed,
            "steps_per_iteration": {name: float(steps[a:b].mean()) for name, (a, b) in zip(PHASES, bounds)},
            "grads_warmup": metrics["grads"]["warmup"], "grads_sampling": metrics["grads"]["sampling"],
            "min_ess": metrics["ess_bulk"]["min"], "min_ess_squares": metrics["ess_bulk_squares"]["min"],
            "rhat_max": metrics["rhat_max"]}


def _mean_se(values) -> str:
    values = np.asarray(values, dtype=float)
    se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else float("nan")
    return f"{values.mean():.3g} ± {se:.2g}"


def table(records: list[dict]) -> str:
    lines = ["| model | variant | seeds | min ESS/grad | counting warm-up | squares' min ESS/grad | warm-up / sampling "
             "gradients | steps per iteration: early, metric, GP warm-up, sampling | max R-hat (seeds >= 1.01) |",
             "|---|---|---|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r["model"], r["variant"]) for r in records))
    for model, variant in keys:
        here = [r for r in records if (r["model"], r["variant"]) == (model, variant)]
        per_grad = [r["min_ess"] / r["grads_sampling"] for r in here]
        with_warmup = [r["min_ess"] / (r["grads_sampling"] + r["grads_warmup"]) for r in here]
        squares = [r["min_ess_squares"] / r["grads_sampling"] for r in here]
        ratio = np.mean([r["grads_warmup"] / r["grads_sampling"] for r in here])
        steps = " / ".join(f"{np.mean([r['steps_per_iteration'][p] for r in here]):.1f}" for p in PHASES)
        rhats = [r["rhat_max"] for r in here]
        lines.append(f"| {model} | {variant} | {len(here)} | {_mean_se(per_grad)} | {_mean_se(with_warmup)} | "
                     f"{_mean_se(squares)} | {ratio:.2f} | {steps} | {max(rhats):.3f} "
                     f"({sum(h >= 1.01 for h in rhats)}) |")
    return "\n".join(lines)


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"commands": [], "variants": {}, "records": []}


def run(argv) -> dict:
    import jax

    jax.config.update("jax_enable_x64", True)
    from .models import get_model
    from .run import free_compiled_programs

    parser = argparse.ArgumentParser(prog="python -m benchmarks.warmup_cost run")
    parser.add_argument("--models", required=True)
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    parser.add_argument("--variants", default=json.dumps(DEFAULT_VARIANTS))
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    variants = json.loads(args.variants)
    output = Path(args.output)
    results = _load(output)
    results["commands"].append("python -m benchmarks.warmup_cost run " + " ".join(argv))
    results["variants"].update(variants)
    done = {(r["model"], r["seed"], r["variant"]) for r in results["records"]}
    for name in args.models.split(","):
        model = get_model(name)
        for seed in (int(s) for s in args.seeds.split(",")):
            for label, options in variants.items():
                if (name, seed, label) in done:
                    continue
                record = {"variant": label, **run_one(model, seed, options)}
                free_compiled_programs()  # else the programs' memory maps pile up until XLA's compiler fails
                results["records"].append(record)
                output.write_text(json.dumps(results, indent=1))
                print(json.dumps(record), flush=True)
    output.write_text(json.dumps(results, indent=1))
    return results


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("run", "table"):
        raise SystemExit(__doc__)
    if argv[0] == "run":
        run(argv[1:])
    else:
        files = [_load(Path(path)) for path in argv[1:]]
        commands = list(dict.fromkeys(c for f in files for c in f["commands"]))
        print("# AHMC's warm-up gradients by part of the run (`ahmc_blackjax`, 4 chains, 1000 + 1000 draws)\n")
        print("Made by:\n")
        print("\n".join(f"    {c}" for c in commands) + "\n")
        print("Means over seeds ± standard error; min bulk ESS over the coordinates (and over their centred squares), "
              "per gradient of the sampling phase and counting warm-up's too.\n")
        print(table([r for f in files for r in f["records"]]))


if __name__ == "__main__":
    main()
