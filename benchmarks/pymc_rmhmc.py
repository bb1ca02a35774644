"""Cost and efficiency of ``AdaptiveRMHMC`` (PyMC) against ``AdaptiveHMC`` and PyMC's NUTS.

    ./dev run python -m benchmarks.pymc_rmhmc            # about 5 minutes on 2 shared cores

Part 1, cost against the dimension: Neal's funnel with ``d - 1`` x's and the SoftAbs metric,
for a few ``d``: compile time of the geometry function (log density, gradient, Hessian, third
derivatives), time of one geometry evaluation (compiled call + SoftAbs + Cholesky) against one
plain gradient (PyMC's compiled ``logp_dlogp``), and time and evaluations per generalized leapfrog
step (``eps = 0.2``, from exact draws, tolerance 1e-6).

Part 2, samplers on the same models in the same run (2 chains, one after the other on one core,
500 tune + 500 draws): the funnel (d = 10, SoftAbs) and the Pima logistic regression (d = 8,
Fisher metric).  ESS is ArviZ bulk ESS per coordinate (min and median; the funnel's ``v`` on its
own).  "grads" counts leapfrog steps for NUTS and AdaptiveHMC and model-function calls for
AdaptiveRMHMC (``n_grad_evals``), each of which also computes ``G`` and ``dG/dx``: part 1 gives
their price in gradients.  Seconds are the draws' own clock (sum of ``perf_counter_diff``).

Writes ``benchmarks/results/pymc_rmhmc.json`` and ``.md`` with the command.
"""

from __future__ import annotations

import datetime
import json
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import pymc as pm

from ahmc.adapters import _riemann
from ahmc.adapters.pymc import AdaptiveHMC, AdaptiveRMHMC, fisher_logistic_metric
from benchmarks.metrics import bulk_ess, split_rhat
from benchmarks.models import PRIOR_VARIANCE, load_pima, standardize
from benchmarks.pymc_models import build

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = "./dev run python -m benchmarks.pymc_rmhmc"
DIMENSIONS = (2, 5, 10, 20)
SAMPLING = dict(tune=500, draws=500, chains=2, cores=1, progressbar=False, compute_convergence_checks=False)


def funnel(d):
    with pm.Model() as model:
        v = pm.Normal("v", 0.0, 3.0)
        pm.Normal("x", 0.0, pm.math.exp(v / 2), shape=d - 1)
    return model


def funnel_draws(rng, d, n):
    points = []
    for _ in range(n):
        v = rng.normal(0.0, 3.0)
        points.append({"v": v, "x": rng.normal(0.0, np.exp(v / 2), size=d - 1)})
    return points


def per_call(function, argument, seconds=1.0):
    """Median over 5 batches of the time per call (the machine is shared: single timings are noisy)."""
    function(argument)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds / 5:
        function(argument)
        calls += 1
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            function(argument)
        batches.append((time.perf_counter() - start) / calls)
    return float(np.median(batches))


def cost(d, seed=0):
    rng = np.random.default_rng(seed)
    with funnel(d):
        start = time.perf_counter()
        step = AdaptiveRMHMC()
        build_seconds = time.perf_counter() - start
    evaluate = step.integrator._evaluate
    gradient = step._logp_dlogp_func._pytensor_function
    points = [np.concatenate([[p["v"]], p["x"]]) for p in funnel_draws(rng, d, 20)]
    evaluation = per_call(evaluate, points[0])
    plain = per_call(gradient, points[0])
    evaluations, steps, converged, start = 0, 0, 0, time.perf_counter()
    for x in points:
        geom = evaluate(x)
        p = _riemann.sample_momentum(geom, rng)
        for _ in range(5):
            try:
                with np.errstate(all="ignore"):
                    result = _riemann.generalized_leapfrog(evaluate, geom, p, 0.2, 1e-6, 20)
            except _riemann.NotPositiveDefiniteError:  # the path left the region where G is defined
                steps += 1
                break
            evaluations, steps, converged = evaluations + result.num_evaluations, steps + 1, converged + result.converged
            if not result.converged:
                break
            geom, p = result.geometry, result.momentum
    leapfrog_seconds = (time.perf_counter() - start) / steps
    return {"d": d, "build_seconds": build_seconds, "evaluation_ms": 1e3 * evaluation, "gradient_ms": 1e3 * plain,
            "evaluation_over_gradient": evaluation / plain, "leapfrog_step_ms": 1e3 * leapfrog_seconds,
            "evaluations_per_step": evaluations / steps, "steps_converged": converged / steps}


def efficiency(model_name, make_model, samplers, draw_values, initvals=None, seed=1):
    rows = []
    for name, make_step in samplers.items():
        with make_model():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = pm.sample(step=make_step(), random_seed=seed, initvals=initvals, **SAMPLING)
        values = draw_values(tree)
        stats = tree.sample_stats
        grads = float(stats["n_grad_evals"].values.sum() if "n_grad_evals" in stats else
                      stats["n_steps"].values.sum() if "n_steps" in stats else stats["tree_size"].values.sum())
        seconds = float(stats["perf_counter_diff"].values.sum())
        ess = bulk_ess(values)
        row = {"model": model_name, "sampler": name, "min_ess": float(ess.min()), "median_ess": float(np.median(ess)),
               "ess_first": float(ess[0]), "grads": grads, "seconds": seconds,
               "min_ess_per_grad": float(ess.min()) / grads, "min_ess_per_second": float(ess.min()) / seconds,
               "grads_per_draw": grads / values.shape[0] / values.shape[1],
               "max_rhat": float(split_rhat(values).max()),
               "divergences": int(stats["diverging"].values.sum())}
        if "fixed_point_converged" in stats:
            row["fixed_point_converged"] = float(stats["fixed_point_converged"].values.mean())
        rows.append(row)
        print(row, flush=True)
    return rows


def funnel_values(tree):
    return np.concatenate([tree.posterior["v"].values[..., None], tree.posterior["x"].values], axis=-1)


def pima_model_and_metric():
    X, _, _ = load_pima()
    design = np.column_stack([np.ones(len(X)), standardize(np.asarray(X, dtype=float))])
    return fisher_logistic_metric(design, prior_variance=PRIOR_VARIANCE)


def markdown(result):
    lines = ["# AdaptiveRMHMC in PyMC: cost and efficiency", "",
             f"`{result['command']}` -- {result['date']}, {result['machine']}; PyMC {result['pymc']}. "
             f"Total {result['total_minutes']:.1f} min. 2 CPU cores shared with other jobs: times are noisy.", "",
             "## Cost against the dimension (funnel, SoftAbs metric)", "",
             "One evaluation = compiled log density, gradient, Hessian and third derivatives, then SoftAbs "
             "(eigendecomposition) and a Cholesky factorization, in NumPy. Leapfrog steps at eps = 0.2 from "
             "exact draws, fixed-point tolerance 1e-6.", "",
             "| d | build s (compile) | evaluation ms | gradient ms | evaluation / gradient | leapfrog step ms | "
             "evaluations / step | steps converged |", "|---|---|---|---|---|---|---|---|"]
    for row in result["cost"]:
        lines.append(f"| {row['d']} | {row['build_seconds']:.1f} | {row['evaluation_ms']:.3f} | {row['gradient_ms']:.4f} | "
                     f"{row['evaluation_over_gradient']:.0f} | {row['leapfrog_step_ms']:.2f} | "
                     f"{row['evaluations_per_step']:.1f} | {row['steps_converged']:.2f} |")
    lines += ["", "## Samplers (2 chains x (500 tune + 500 draws), sequential, same run)", "",
              "grads: leapfrog steps (NUTS, AdaptiveHMC) or model-function calls (AdaptiveRMHMC: each also "
              "computes G and dG/dx, see the table above). Seconds: the draws' own clock.", "",
              "| model | sampler | min ESS | median ESS | ESS of first coord. | min ESS / grad | min ESS / s | "
              "grads / draw | max R-hat | divergences | fixed points converged |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["samplers"]:
        fp = f"{row['fixed_point_converged']:.3f}" if "fixed_point_converged" in row else ""
        lines.append(f"| {row['model']} | {row['sampler']} | {row['min_ess']:.0f} | {row['median_ess']:.0f} | "
                     f"{row['ess_first']:.0f} | {row['min_ess_per_grad']:.4f} | {row['min_ess_per_second']:.1f} | "
                     f"{row['grads_per_draw']:.1f} | {row['max_rhat']:.3f} | {row['divergences']} | {fp} |")
    return "\n".join(lines) + "\n"


def main():
    begin = time.perf_counter()
    result = {"command": COMMAND, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.processor() or platform.machine()}, 2 CPUs", "pymc": pm.__version__,
              "settings": {k: v for k, v in SAMPLING.items() if k != "progressbar"}}
    result["cost"] = [cost(d) for d in DIMENSIONS]
    for row in result["cost"]:
        print(row, flush=True)
    rng = np.random.default_rng(2)
    samplers = {"AdaptiveRMHMC (SoftAbs)": lambda: AdaptiveRMHMC(), "AdaptiveHMC": lambda: AdaptiveHMC(),
                "NUTS (PyMC)": lambda: pm.NUTS()}
    rows = efficiency("funnel (d = 10)", lambda: funnel(10), samplers, funnel_values,
                      initvals=funnel_draws(rng, 10, SAMPLING["chains"]))
    metric = pima_model_and_metric()
    samplers = {"AdaptiveRMHMC (Fisher)": lambda: AdaptiveRMHMC(metric=metric), "AdaptiveHMC": lambda: AdaptiveHMC(),
                "NUTS (PyMC)": lambda: pm.NUTS()}
    rows += efficiency("pima (d = 8)", lambda: build("pima"), samplers, lambda tree: tree.posterior["x"].values)
    result["samplers"] = rows
    result["total_minutes"] = (time.perf_counter() - begin) / 60
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pymc_rmhmc.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "pymc_rmhmc.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
