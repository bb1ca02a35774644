"""How far can tuning (eps, L) go?  A grid of fixed arms with the metric the tuner gets.

AHMC tunes the step size ``eps`` and the maximum leapfrog count ``L`` of HMC with
``L_t ~ U{1..L}`` and a diagonal mass matrix estimated in warm-up.  Its best possible
result is the best fixed arm: this script measures that ceiling by brute force.

For each model: the JAX engine's warm-up (4 chains, ``--num-warmup`` iterations, the
defaults of the benchmark) gives the diagonal inverse mass matrix, the dual-averaging
step size ``eps*`` and the chains' positions.  From there every arm of a grid
(``eps = eps* x factor``, ``L = 1..--max-steps``) runs ``--num-samples`` draws per chain
with BlackJAX's ``dynamic_hmc`` (``ahmc.adapters.blackjax.uniform_steps_hmc``) and
scores min bulk ESS over coordinates per gradient.  ``--steps`` and ``--factors`` replace the
grid's ``L`` values and step-size factors (e.g. a few long ``L`` for a model whose arms run to
hundreds of steps).  The maximum of many noisy scores
is biased upwards, so the ``--recheck`` best arms are run again with fresh keys
(``--recheck-seeds`` times) and their mean re-run score is the reported ceiling::

    ./dev run python -m benchmarks.grid_ceiling [--models pima,ripley,breast_cancer]

Writes ``benchmarks/results/grid_ceiling.{json,md}``.  ESS per gradient only, no times.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "grid_ceiling.json"
DEFAULT_MODELS = ("pima", "ripley", "breast_cancer")
STEP_SIZE_FACTORS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6)


def warm_up(model, num_chains: int, num_warmup: int, seed: int):
    """The engine's warm-up with the benchmark's defaults: (positions, inverse mass matrix, eps*)."""
    import jax
    import jax.numpy as jnp

    from ahmc.adapters import _jax_engine

    from . import models as bench_models

    positions = jnp.asarray(bench_models.initial_positions(model, num_chains, seed))
    engine = _jax_engine.build_engine(model.logdensity_fn, num_warmup=num_warmup)
    init_key, warm_key = jax.random.split(jax.random.key(seed))
    state = engine.init(positions, init_key)
    state, _ = _jax_engine._scan(engine.step, warm_key, state, num_warmup, False)
    eps_star = float(jnp.exp(state.step_size_adaptation.log_step_size_avg))
    return state.position, state.inverse_mass_matrix, eps_star


def arm_runner(model, inverse_mass_matrix, num_chains: int, num_samples: int):
    """A compiled ``run(key, positions, eps, L) -> (draws, gradients per chain)`` (eps and L traced)."""
    import jax

    from ahmc.adapters.blackjax import uniform_steps_hmc

    def run(key, positions, step_size, max_steps):
        kernel = uniform_steps_hmc(model.logdensity_fn, step_size, inverse_mass_matrix, max_steps)
        init_keys, key = jax.random.split(key)
        states = jax.vmap(kernel.init)(positions, jax.random.split(init_keys, num_chains))

        def body(states, step_key):
            states, info = jax.vmap(kernel.step)(jax.random.split(step_key, num_chains), states)
            return states, (states.position, info.num_integration_steps)

        _, (draws, steps) = jax.lax.scan(body, states, jax.random.split(key, num_samples))
        return jax.numpy.swapaxes(draws, 0, 1), steps.sum(axis=0)

    return jax.jit(run)


def score(draws, gradients) -> float:
    """Min bulk ESS over coordinates per gradient (all chains)."""
    from .metrics import bulk_ess

    ess = bulk_ess(np.asarray(draws, dtype=np.float64))
    return float(np.min(ess) / np.sum(np.asarray(gradients)))


def measure(model, *, num_chains=4, num_warmup=1000, num_samples=2000, max_steps=16, recheck=5,
            recheck_seeds=3, seed=0, steps=None, factors=STEP_SIZE_FACTORS) -> dict:
    """Score every arm ``(eps* x factor, L)``, ``L`` in ``steps`` (default ``1..max_steps``)."""
    import jax

    steps = list(range(1, max_steps + 1)) if steps is None else [int(n) for n in steps]
    factors = [float(f) for f in factors]
    positions, imm, eps_star = warm_up(model, num_chains, num_warmup, seed)
    run = arm_runner(model, imm, num_chains, num_samples)
    grid = [(eps_star * f, n) for f in factors for n in steps]
    keys = jax.random.split(jax.random.key(seed + 1), len(grid))
    scores = []
    for key, (eps, n) in zip(keys, grid):
        draws, grads = run(key, positions, eps, n)
        scores.append(score(draws, grads))
    order = np.argsort(scores)[::-1][:recheck]
    rechecks = []
    for rank, index in enumerate(order):
        eps, n = grid[index]
        again = [score(*run(jax.random.key(10_000 * (seed + 1) + 100 * rank + s), positions, eps, n))
                 for s in range(recheck_seeds)]
        rechecks.append({"step_size": eps, "step_size_factor": eps / eps_star, "num_steps": n,
                         "grid_score": scores[index], "recheck_scores": again, "recheck_mean": float(np.mean(again))})
    best = max(rechecks, key=lambda r: r["recheck_mean"])
    return {
        "model": model.name, "dim": int(model.dim), "num_chains": num_chains, "num_warmup": num_warmup,
        "num_samples": num_samples, "eps_star": eps_star, "step_size_factors": factors,
        "max_steps": max(steps), "steps": steps, "grid_scores": [float(s) for s in scores], "rechecks": rechecks,
        "ceiling": best["recheck_mean"], "ceiling_arm": [best["step_size"], best["num_steps"]],
    }


def markdown(results: dict) -> str:
    env = results["environment"]
    lines = [
        "# Ceiling of (eps, L) tuning: the best fixed arm on a grid",
        "",
        f"`{env['command']}` -- {env['date_utc']}; {env['cpu_model']}, {env['nproc']} CPUs (shared); "
        f"JAX {env['packages'].get('jax')}, BlackJAX {env['packages'].get('blackjax')}; git {env['git_commit']}.",
        "",
        "Metric and start from the engine's warm-up; HMC with `L_t ~ U{1..L}`; min bulk ESS per gradient. "
        "`grid best` is the largest single-run score over the grid (biased upwards); `ceiling` is the best "
        "re-checked arm's mean over fresh runs.",
        "",
        "| model | d | eps* | grid | grid best | ceiling (re-run mean) | arm (eps, L) | re-run scores |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["models"]:
        best = max(r["rechecks"], key=lambda c: c["recheck_mean"])
        lines.append(
            f"| {r['model']} | {r['dim']} | {r['eps_star']:.3f} | {len(r['step_size_factors'])} x "
            f"{len(r.get('steps', range(r['max_steps'])))} | "
            f"{max(r['grid_scores']):.3g} | {r['ceiling']:.3g} | ({best['step_size']:.3g}, {best['num_steps']}) | "
            f"{', '.join(f'{s:.3g}' for s in best['recheck_scores'])} |")
    lines += ["", "Re-checked arms (the top grid scores):", "",
              "| model | eps / eps* | L | grid score | re-run mean |", "|---|---|---|---|---|"]
    for r in results["models"]:
        for c in r["rechecks"]:
            lines.append(f"| {r['model']} | {c['step_size_factor']:.2f} | {c['num_steps']} | "
                         f"{c['grid_score']:.3g} | {c['recheck_mean']:.3g} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--num-warmup", type=int, default=1000)
    parser.add_argument("--num-samples", type=int, default=2000)
    parser.add_argument("--max-steps", type=int, default=16)
    parser.add_argument("--steps", default=None, help="comma-separated L values (default 1..--max-steps)")
    parser.add_argument("--factors", default=None,
                        help="comma-separated step-size factors of eps* (default: STEP_SIZE_FACTORS)")
    parser.add_argument("--recheck", type=int, default=5)
    parser.add_argument("--recheck-seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    from . import models as bench_models
    from .run import save_study

    rows = []
    for name in args.models.split(","):
        start = time.time()
        print(f"{name} ...", flush=True)
        rows.append(measure(bench_models.get_model(name), num_warmup=args.num_warmup,
                            num_samples=args.num_samples, max_steps=args.max_steps, recheck=args.recheck,
                            recheck_seeds=args.recheck_seeds, seed=args.seed,
                            steps=None if args.steps is None else args.steps.split(","),
                            factors=STEP_SIZE_FACTORS if args.factors is None else args.factors.split(",")))
        print(f"  ceiling {rows[-1]['ceiling']:.3g} at {rows[-1]['ceiling_arm']} ({time.time() - start:.0f} s)",
              flush=True)
    return save_study(args, argv, "grid_ceiling", rows, markdown, args.output)


if __name__ == "__main__":
    main()
