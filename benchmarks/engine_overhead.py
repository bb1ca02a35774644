"""Cost per iteration of the JAX engine after warm-up, against bare BlackJAX HMC.

For each model: warm up once (4 chains, the engine's defaults), then time
1000 post-warm-up iterations, compiled ahead of time, three ways from the same
state with the same keys:

* ``step``: a ``lax.scan`` of ``engine.step`` (every iteration carries the
  warm-up adapters and a run-time branch around the GP update; how the draws
  were made before ``scan_draws``);
* ``scan_draws``: what ``run_chains`` runs now (whole rounds as an inner scan,
  the GP update once per round without a branch);
* ``bare``: BlackJAX ``dynamic_hmc`` with ``L ~ U{1..L}`` at the engine's final
  arm and mass matrix, no tuner: the floor any tuner adds cost to.

Reports microseconds per iteration (all chains), min and median over repeats,
and the leapfrog steps per chain per iteration::

    ./dev run python -m benchmarks.engine_overhead [--models std_gauss_10,...] [--repeats 21] [--dense]

Writes ``runs/engine_overhead.{json,md}`` (not committed).  Wall-clock figures
on this machine's 2 shared cores: compare the columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path("runs") / "engine_overhead.json"  # a study: its outputs are not committed
DEFAULT_MODELS = ("std_gauss_10", "eight_schools", "arK", "pima")


def _time(compiled, args, repeats):
    import jax

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return np.asarray(times), out


def measure(model, num_chains=4, num_warmup=1000, num_iterations=1000, repeats=21, seed=0, dense_mass=False,
            jump_estimate=None, pooled=True) -> dict:
    """Per-iteration times of the three ways (see the module docstring) on one model."""
    import jax
    import jax.numpy as jnp

    from ahmc.adapters import _jax_engine, _jax_run
    from ahmc.adapters.blackjax import uniform_steps_hmc

    from . import models as bench_models

    positions = jnp.asarray(bench_models.initial_positions(model, num_chains, seed))
    engine = _jax_engine.build_engine(model.logdensity_fn, num_warmup=num_warmup, dense_mass=dense_mass,
                                      jump_estimate=jump_estimate, pooled=pooled)
    init_key, warm_key, draw_key, bare_key = jax.random.split(jax.random.key(seed), 4)
    scan = jax.jit(_jax_run._scan_impl, static_argnums=(0, 3, 4))
    state = engine.init(positions, init_key)
    state, _ = jax.block_until_ready(scan.lower(engine.step, warm_key, state, num_warmup, False).compile()(
        warm_key, state))

    step_scan = scan.lower(engine.step, draw_key, state, num_iterations, True).compile()
    draws = jax.jit(engine.scan_draws, static_argnums=(2, 3)).lower(
        draw_key, state, num_iterations, num_warmup).compile()
    t_step, (_, (_, info)) = _time(step_scan, (draw_key, state), repeats)
    t_draws, (_, (_, info_draws)) = _time(draws, (draw_key, state), repeats)

    parameters = engine.parameters(state)
    if not pooled:  # a tuner per chain: the bare kernel runs chain 0's arm
        parameters = {**parameters, "step_size": jnp.ravel(parameters["step_size"])[0],
                      "num_integration_steps": jnp.ravel(parameters["num_integration_steps"])[0]}
    kernel = uniform_steps_hmc(model.logdensity_fn, parameters["step_size"], parameters["inverse_mass_matrix"],
                               int(parameters["num_integration_steps"]))
    bare_state = jax.vmap(kernel.init)(state.position, jax.random.split(bare_key, num_chains))

    def bare_run(key, bare_state):
        def body(s, k):
            s, i = jax.vmap(kernel.step)(jax.random.split(k, num_chains), s)
            return s, (s.position, i.num_integration_steps)
        return jax.lax.scan(body, bare_state, jax.random.split(key, num_iterations))

    bare = jax.jit(bare_run).lower(bare_key, bare_state).compile()
    t_bare, (_, (_, bare_steps)) = _time(bare, (bare_key, bare_state), repeats)

    def row(times, steps):
        per = 1e6 * times / num_iterations
        return {"us_per_iteration_min": float(per.min()), "us_per_iteration_median": float(np.median(per)),
                "steps_per_chain_iteration": float(np.mean(np.asarray(steps)))}

    return {
        "model": model.name, "dim": int(model.dim), "dense_mass": bool(dense_mass), "num_chains": num_chains,
        "pooled": bool(pooled),
        "jump_estimate": engine.config.jump_estimate,
        "num_iterations": num_iterations,
        "repeats": repeats, "final_step_size": float(parameters["step_size"]),
        "final_num_steps": int(parameters["num_integration_steps"]),
        "step": row(t_step, info.num_integration_steps),
        "scan_draws": row(t_draws, info_draws.num_integration_steps),
        "bare": row(t_bare, bare_steps),
        "same_draws": bool(np.array_equal(np.asarray(info.num_integration_steps),
                                          np.asarray(info_draws.num_integration_steps))),
    }


def markdown(results: dict) -> str:
    env = results["environment"]
    lines = [
        "# Engine cost per iteration after warm-up",
        "",
        f"`{env['command']}` -- {env['date_utc']}; {env['cpu_model']}, {env['nproc']} CPUs (shared); "
        f"JAX {env['packages'].get('jax')}, BlackJAX {env['packages'].get('blackjax')}; git {env['git_commit']}.",
        "",
        "Microseconds per iteration of all chains (min / median over repeats); `steps` = leapfrog steps "
        "per chain per iteration. `step`: scan of `engine.step` (before); `scan_draws`: what `run_chains` "
        "runs now; `bare`: BlackJAX `dynamic_hmc` at the final arm, no tuner.",
        "",
        "| model | d | mass matrix | jump estimate | chains | step (us) | scan_draws (us) | bare BlackJAX (us) | speed-up | "
        "scan_draws / bare | steps | same draws |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["models"]:
        s, d, b = r["step"], r["scan_draws"], r["bare"]
        lines.append(
            f"| {r['model']} | {r['dim']} | {'dense' if r.get('dense_mass') else 'diagonal'} | "
            f"{r.get('jump_estimate', 'transition')} | {r['num_chains']} | "
            f"{s['us_per_iteration_min']:.1f} / "
            f"{s['us_per_iteration_median']:.1f} | {d['us_per_iteration_min']:.1f} / "
            f"{d['us_per_iteration_median']:.1f} | {b['us_per_iteration_min']:.1f} / "
            f"{b['us_per_iteration_median']:.1f} | {s['us_per_iteration_min'] / d['us_per_iteration_min']:.2f}x | "
            f"{d['us_per_iteration_min'] / b['us_per_iteration_min']:.2f}x | "
            f"{d['steps_per_chain_iteration']:.2f} | {'yes' if r['same_draws'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--num-iterations", type=int, default=1000)
    parser.add_argument("--num-warmup", type=int, default=1000)
    parser.add_argument("--dense", action="store_true", help="dense_mass=True (the bare kernel gets the dense matrix)")
    parser.add_argument("--jump-estimate", default=None, choices=("trajectory", "transition"),
                        help="the engine's jump_estimate (default: the engine's default)")
    parser.add_argument("--unpooled", action="store_true", help="pooled=False: a tuner per chain")
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    from . import models as bench_models
    from .run import save_study

    rows = []
    for name in args.models.split(","):
        print(f"{name} ...", flush=True)
        rows.append(measure(bench_models.get_model(name), num_warmup=args.num_warmup,
                            num_iterations=args.num_iterations, repeats=args.repeats,
                            dense_mass=args.dense, jump_estimate=args.jump_estimate, pooled=not args.unpooled))
    args.seed = 0
    results = save_study(args, argv, "engine_overhead", rows, markdown, args.output)
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
