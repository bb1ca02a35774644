"""The PyMC step with one tuner for all chains (``pooled=True``) against its default and NUTS.

    ./dev run python -m benchmarks.pooled_table --output benchmarks/results/pymc_pooled.md

Two committed studies (their commands are in the output):

* the logistic regressions, seeds 0-5, every sampler in the same run (``pymc_pooled_lr6_seed*.json``):
  the default step (``ahmc_pymc``), ``ahmc_pymc_pooled``, PyMC's NUTS and nutpie;
* Pima over twenty seeds (``pymc_pooled_pima20_seed*.json``, the step with ``pooled=True``) against
  PyMC's NUTS and the default step of the same seeds in earlier files (``pima_pymc_seeds50.json``,
  ``pymc_traj_pima50.json``), whose runs this machine repeats exactly.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from .compare_runs import load_runs

RESULTS = Path(__file__).parent / "results"
LR_COMMAND = ("python -m benchmarks.seeds --models pima,ripley,breast_cancer --samplers "
              "ahmc_pymc,ahmc_pymc_pooled,pymc_nuts,nutpie --baseline pymc_nuts --seeds 0,1,2,3,4,5 "
              "--output benchmarks/results/pymc_pooled_lr6.json")
PIMA_COMMAND = ("python -m benchmarks.seeds --models pima --samplers ahmc_pymc --baseline ahmc_pymc --seeds 0,...,19 "
                "--sampler-options '{\"ahmc_pymc\": {\"pooled\": true}}' --output benchmarks/results/pymc_pooled_pima20.json")


def _by_seed(paths) -> dict[int, dict]:
    """``seed -> {(model, sampler): run}`` of the finished runs (``compare_runs.load_runs``, regrouped)."""
    seeds: dict[int, dict] = {}
    for (model, sampler, seed), run in load_runs(paths).items():
        seeds.setdefault(seed, {})[model, sampler] = run
    return seeds


def _min(run, key="ess_per_grad"):
    return float(run["metrics"][key]["min"])


def _spread(ratios) -> str:
    ratios = np.asarray(ratios, dtype=float)
    se = ratios.std(ddof=1) / math.sqrt(len(ratios)) if len(ratios) > 1 else math.nan
    return f"{ratios.mean():.2f} ({se:.2f}), {ratios.min():.2f}-{ratios.max():.2f}"


def same_run_table(paths) -> str:
    """Per model and step: mean (standard error), min-max over seeds of the ratios to PyMC's NUTS of the same run."""
    seeds = _by_seed(paths)
    models = sorted({model for runs in seeds.values() for model, _ in runs}, key=["pima", "ripley", "breast_cancer"].index)
    lines = [f"Seeds {sorted(seeds)}; mean (standard error), min-max of the per-seed ratios.", "",
             "| model | step | min ESS/grad vs PyMC's NUTS | vs the better of PyMC's NUTS and nutpie | seeds >= 1.3x | "
             "counting warm-up vs PyMC's NUTS | min ESS/s vs PyMC's NUTS | min ESS/s vs nutpie | max R-hat (largest) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model in models:
        for step in ("ahmc_pymc", "ahmc_pymc_pooled"):
            rows = [runs for runs in seeds.values() if (model, step) in runs and (model, "pymc_nuts") in runs]
            if not rows:
                continue
            nuts = [r[model, "pymc_nuts"] for r in rows]
            best = [max(_min(r[model, "pymc_nuts"]), _min(r[model, "nutpie"]) if (model, "nutpie") in r else 0.0)
                    for r in rows]
            mine = [r[model, step] for r in rows]
            per_grad = [_min(a) / _min(n) for a, n in zip(mine, nuts)]
            vs_best = [_min(a) / b for a, b in zip(mine, best)]
            warm = [_min(a, "ess_per_grad_with_warmup") / _min(n, "ess_per_grad_with_warmup") for a, n in zip(mine, nuts)]
            per_second = [_min(a, "ess_per_second") / _min(n, "ess_per_second") for a, n in zip(mine, nuts)]
            vs_nutpie = [_min(r[model, step], "ess_per_second") / _min(r[model, "nutpie"], "ess_per_second")
                         for r in rows if (model, "nutpie") in r]
            rhat = max(float(a["metrics"]["rhat_max"]) for a in mine)
            name = "default (`pooled=False`)" if step == "ahmc_pymc" else "`pooled=True`"
            lines.append(f"| {model} | {name} | {_spread(per_grad)} | {_spread(vs_best)} | "
                         f"{sum(r >= 1.3 for r in per_grad)} of {len(per_grad)} | {_spread(warm)} | {_spread(per_second)} | "
                         f"{_spread(vs_nutpie) if vs_nutpie else '-'} | "
                         f"{rhat:.3f} |")
    return "\n".join(lines) + "\n"


def pima_table(pooled_paths, nuts_summary, default_summary) -> str:
    """Pima: the pooled step's per-seed ratio to PyMC's NUTS of the same seed, beside the default's."""
    nuts_table = json.loads(Path(nuts_summary).read_text())["table"]["pima"]["pymc_nuts"]
    default_table = json.loads(Path(default_summary).read_text())["table"]["pima"]["ahmc_pymc"]
    nuts = dict(zip(nuts_table["seeds"], nuts_table["min_ess_per_grad"]))
    default = dict(zip(default_table["seeds"], default_table["min_ess_per_grad"]))
    pooled = {}
    for seed, runs in _by_seed(pooled_paths).items():
        run = runs["pima", "ahmc_pymc"]
        if not run.get("options", {}).get("pooled"):
            raise ValueError(f"seed {seed}: the run was not made with pooled=True")
        pooled[seed] = _min(run)
    seeds = sorted(pooled)
    ratio_pooled = [pooled[s] / nuts[s] for s in seeds]
    ratio_default = [default[s] / nuts[s] for s in seeds]
    paired = [p - d for p, d in zip(ratio_pooled, ratio_default)]
    lines = ["| seed | " + " | ".join(str(s) for s in seeds) + " | mean (standard error), min-max |",
             "|---|" + "---|" * (len(seeds) + 1),
             "| `pooled=True` | " + " | ".join(f"{r:.2f}" for r in ratio_pooled) + f" | {_spread(ratio_pooled)} |",
             "| default | " + " | ".join(f"{r:.2f}" for r in ratio_default) + f" | {_spread(ratio_default)} |",
             "| paired difference | " + " | ".join(f"{r:+.2f}" for r in paired) + f" | {_spread(paired)} |"]
    summary = (f"\n`pooled=True` at or above 1.3x in {sum(r >= 1.3 for r in ratio_pooled)} of {len(seeds)} seeds "
               f"(default: {sum(r >= 1.3 for r in ratio_default)}); below 1x in {sum(r < 1 for r in ratio_pooled)} "
               f"(default: {sum(r < 1 for r in ratio_default)}).\n")
    return "\n".join(lines) + "\n" + summary


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pooled_table", description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=None, help="write the Markdown here (default: print it)")
    args = parser.parse_args(argv)
    lr = sorted(RESULTS.glob("pymc_pooled_lr6_seed*.json"))
    pima = sorted(RESULTS.glob("pymc_pooled_pima20_seed*.json"))
    text = ("# The PyMC step with one tuner for all chains (`pooled=True`)\n\n"
            "Min ESS per gradient (bulk, over coordinates) as a ratio to PyMC's NUTS; 4 chains, 1000 + 1000 draws, "
            "2 shared CPU cores (AMD EPYC), 2026-11-29. Made by `python -m benchmarks.pooled_table`.\n\n"
            f"## The logistic regressions, every sampler in the same run\n\n`{LR_COMMAND}`\n\n"
            + same_run_table(lr) +
            f"\n## Pima, twenty seeds\n\n`{PIMA_COMMAND}`\n\nPyMC's NUTS and the default step of the same seeds: "
            "`pima_pymc_seeds50.json` and `pymc_traj_pima50.json` (this machine redraws their chains exactly).\n\n"
            + pima_table(pima, RESULTS / "pima_pymc_seeds50.json", RESULTS / "pymc_traj_pima50.json"))
    if args.output:
        Path(args.output).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
