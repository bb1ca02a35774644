"""Where the JAX engine's compilation goes: ``python -m benchmarks.compile_parts [--models std_gauss_10] [--options JSON]``.

XLA's CPU compiler spends its time per fused kernel it emits, so one iteration of the engine (4 chains,
the defaults plus ``--options``) is compiled three ways, each adding a part to the one before:

* ``transition``: the sampling phase's step without a round's end (the chains' HMC transition, the round sums);
* ``+ rounds``: with the run-time branch of a round's end (the reward, the GP-UCB update);
* ``+ warm-up``: the step as the NumPyro kernel traces it (dual averaging, the metric windows and
  estimator, chain checks, the box), what ``MCMC`` compiles inside its loop;
* ``whole run``: ``run_chains``' program (1000 + 1000 iterations), with the seconds of one run of it.

Prints, per model, the seconds of XLA compilation and the fused kernels of each, as a Markdown table.
``--compiler-options`` passes XLA options to every compilation (e.g.
``'{"xla_backend_optimization_level": 1}'``: docs/decisions.md, "XLA's optimization level");
``--prng-impl rbg`` makes every key JAX's ``rbg`` (or ``unsafe_rbg``) PRNG (docs/decisions.md, "JAX's
cheaper PRNGs"); ``--unrolled-threefry`` lowers JAX's threefry hash on the CPU as on the GPU, unrolled
instead of a loop (docs/decisions.md, "XLA's compile time is its code's size").  The CPU seconds beside
the wall seconds show XLA's compilation threads.  A study: compare the rows of one run, not runs (2 shared
cores).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

PARTS = (("transition", {"sampling": True, "round_end": "never"}),
         ("+ rounds", {"sampling": True}),
         ("+ warm-up", {}))


def compile_parts(model, options: dict, num_chains: int = 4, num_warmup: int = 1000,
                  compiler_options: dict | None = None) -> list[dict]:
    """``[{part, compile_s, compile_cpu_s, fusions, run_s}]``: XLA's compile time (wall and the process's CPU)
    and fused kernels of each way (module text), and for the whole run the seconds of its run (the fastest
    of three; NaN for the parts)."""
    import jax
    import jax.numpy as jnp

    from ahmc.adapters._jax_engine import build_engine
    from ahmc.adapters._jax_run import _run_spec, _spec_run, compiled_init

    from .models import initial_positions

    engine = build_engine(model.logdensity_fn, num_warmup=num_warmup, **options)
    positions = jnp.asarray(initial_positions(model, num_chains, 0))
    state = compiled_init(engine, model.logdensity_fn, positions, jax.random.key(1))
    key = jax.random.key(0)
    spec, inputs = _run_spec(model.logdensity_fn, num_warmup, num_warmup, options)
    ways = [(part, lambda k, s, how=how: engine.step(k, s, **how), (key, state)) for part, how in PARTS]
    ways.append(("whole run", lambda k, p, i: _spec_run(spec, k, p, i), (key, positions, inputs)))
    rows = []
    for part, fn, args in ways:
        lowered = jax.jit(fn).lower(*args)
        start, cpu_start = time.perf_counter(), time.process_time()
        compiled = lowered.compile(compiler_options=compiler_options) if compiler_options else lowered.compile()
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        fusions = len(re.findall(r"= \S+ fusion\(", compiled.as_text()))
        run_s = float("nan")
        if part == "whole run":
            jax.block_until_ready(compiled(*args))  # the first call's allocations are not the run's
            run_s = min(_seconds(compiled, args) for _ in range(3))
        rows.append({"part": part, "compile_s": seconds, "compile_cpu_s": cpu_seconds, "fusions": fusions,
                     "run_s": run_s})
    return rows


def _unroll_threefry() -> None:
    """JAX lowers its threefry hash on the CPU as a five-round loop, elsewhere unrolled; use the unrolled one
    (JAX's private registration: a study's switch, not for the library)."""
    from jax._src.interpreters import mlir
    from jax._src.random import threefry2x32

    mlir.register_lowering(threefry2x32.threefry2x32_p, threefry2x32._threefry2x32_lowering_rule, platform="cpu")


def _seconds(compiled, args) -> float:
    import jax

    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - start


def main(argv=None) -> list:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="std_gauss_10")
    parser.add_argument("--options", default="{}", help="engine options as JSON, e.g. '{\"metric_recipe\": \"welford_diag\"}'")
    parser.add_argument("--compiler-options", default="{}", help="XLA compiler options as JSON")
    parser.add_argument("--prng-impl", default=None, help="JAX's PRNG for every key, e.g. rbg or unsafe_rbg")
    parser.add_argument("--unrolled-threefry", action="store_true",
                        help="lower the threefry hash unrolled on the CPU (JAX's GPU lowering), not as a loop")
    args = parser.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    if args.prng_impl:
        jax.config.update("jax_default_prng_impl", args.prng_impl)
    if args.unrolled_threefry:
        _unroll_threefry()
    from .models import get_model

    options, compiler_options = json.loads(args.options), json.loads(args.compiler_options)
    print(f"options {options}, compiler options {compiler_options}\n\n"
          "| model | part | XLA compile (s) | its CPU (s) | fused kernels | run (s) |\n|---|---|---|---|---|---|")
    results = []
    for name in args.models.split(","):
        for row in compile_parts(get_model(name), options, compiler_options=compiler_options):
            results.append({"model": name, **row})
            run = "" if row["run_s"] != row["run_s"] else f"{row['run_s']:.2f}"
            print(f"| {name} | {row['part']} | {row['compile_s']:.2f} | {row['compile_cpu_s']:.2f} | {row['fusions']} "
                  f"| {run} |", flush=True)
    return results


if __name__ == "__main__":
    main()
