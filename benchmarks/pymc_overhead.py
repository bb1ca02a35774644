"""Per-iteration cost of ahmc's PyMC step method against PyMC's own ``HamiltonianMC``.

    ./dev run python -m benchmarks.pymc_overhead                 # pima + std_gauss_10
    ./dev run python -m benchmarks.pymc_overhead --iterations 3000 --repeats 7

Issue 5's target: ``AdaptiveHMC``'s per-iteration overhead within 10% of
``pm.HamiltonianMC`` at equal numbers of gradient evaluations.  Both samplers
run the same PyMC model (``benchmarks/pymc_models.py``) through ``pm.sample``
(one chain, ``tune=0``, one core), with the same identity mass matrix
(``QuadPotentialDiag``) and the same fixed step size ``eps``:

* ``hmc``: ``pm.HamiltonianMC`` with ``step_rand=None`` (no step-size jitter),
  no step-size adaptation and ``path_length`` giving exactly ``L0`` leapfrog
  steps per iteration.
* ``ahmc_fixed``: ``AdaptiveHMC`` with a one-point box ``eps`` x ``2 L0 - 1``
  and ``freeze_after=0``: the tuner never moves, and each iteration takes
  ``n ~ Uniform{1..2 L0 - 1}`` steps (the paper's random path length), ``L0`` on
  average, so both samplers make the same number of gradient evaluations in
  expectation.  All of the step method's per-iteration bookkeeping still runs
  (round statistics, the tuner's update at the end of every round, its stats).
* ``ahmc_tuning``: ``AdaptiveHMC`` with the box ``eps x (0.5, 2)`` by
  ``(1, 2 L0 - 1)`` and the adaptation on (``freeze_after=None``): the GP-UCB
  update every ``round_length`` iterations is included.  Its arms change the
  gradient count, so compare it per gradient.

Measured per run from PyMC's per-iteration clocks: the loop's wall time (first
iteration's ``perf_counter_start`` to the last one's end: includes the trace
writing between iterations) and the step's own time (sum of
``perf_counter_diff``), both per iteration and per gradient evaluation; the
gradient itself is timed alone (PyMC's compiled ``logp_dlogp`` function, called
in a loop) to give the overhead beyond the gradients, per iteration.  Runs of
the samplers alternate, ``--repeats`` times, and the medians are reported: the
machine has 2 cores and other jobs, so single runs are noisy.  The ratio of the
fastest runs (``ratio_min_loop_per_grad_vs_hmc``) is reported beside the
median's: other jobs only ever slow a run down, so the fastest run of each
sampler is the least disturbed one (the rule of ``timeit``).

``outside_step`` is the loop time not inside ``BaseHMC.astep``'s own clock:
for ``AdaptiveHMC`` it holds the step method's bookkeeping after the
trajectory, which one extra instrumented run per ``AdaptiveHMC`` variant
splits into ``record_round`` (of which ``gp_update`` and ``round_update``).

Writes ``runs/pymc_overhead.json`` (not committed) (with the command).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

RESULTS = Path("runs") / "pymc_overhead.json"  # a study: its outputs are not committed

# model -> (eps, L0): acceptance ~0.8-0.95 with the identity metric from the starting point below.
SETTINGS = {
    "pima": (0.05, 10),
    "breast_cancer": (0.01, 10),
    "ripley": (0.1, 10),
    "std_gauss_10": (0.3, 10),
    "diag_gauss_10": (0.005, 10),
    "corr_gauss_2": (0.05, 10),
}


def _steps(model, name, eps, num_steps):
    """The three step methods (built inside ``model``)."""
    import pymc as pm
    from pymc.step_methods.hmc.quadpotential import QuadPotentialDiag

    from ahmc.adapters.pymc import AdaptiveHMC

    with model:
        dim = model.initial_point()["x"].size
        if name == "hmc":
            return pm.HamiltonianMC(potential=QuadPotentialDiag(np.ones(dim)), step_scale=eps * dim**0.25,
                                    adapt_step_size=False, step_rand=None, path_length=(num_steps + 0.5) * eps)
        top = 2 * num_steps - 1
        if name == "ahmc_fixed":
            return AdaptiveHMC(step_size_bounds=(eps, eps), num_steps_bounds=(top, top), freeze_after=0,
                               adapt_mass_matrix=False)
        if name == "ahmc_tuning":
            return AdaptiveHMC(step_size_bounds=(0.5 * eps, 2.0 * eps), num_steps_bounds=(1, top),
                               adapt_mass_matrix=False)
    raise ValueError(name)


def _one_run(model, step, start, iterations, seed):
    import pymc as pm

    idata = pm.sample(draws=iterations, tune=0, chains=1, cores=1, step=step, initvals=[{"x": start}],
                      random_seed=seed, progressbar=False, compute_convergence_checks=False, model=model, quiet=True)
    stats = idata.sample_stats
    starts = stats["perf_counter_start"].values[0]
    diffs = stats["perf_counter_diff"].values[0]
    grads = int(stats["n_steps"].values.sum())
    loop_s = float(starts[-1] + diffs[-1] - starts[0])
    accept = stats["accept"].values if "accept" in stats else stats["acceptance_rate"].values
    return {"loop_s": loop_s, "step_s": float(diffs.sum()), "grads": grads, "iterations": iterations,
            "mean_accept": float(np.mean(accept)), "divergences": int(stats["diverging"].values.sum())}


def _breakdown(model, step, start, iterations, seed):
    """Seconds per iteration inside AdaptiveHMC's own bookkeeping, from one instrumented run.

    ``record_round``: ``AdaptiveHMC._record_round`` (round statistics, reward,
    tuner update, stats), ``gp_update``: the core tuner's ``update`` (runs at the
    end of every round, also when frozen), ``round_update``: the per-iteration
    round statistics.  Timers wrap the calls, so this run is not one of the timed ones.
    """
    import ahmc.adapters.pymc._step as adapter  # the module whose round_update the step calls

    seconds = {"record_round": 0.0, "gp_update": 0.0, "round_update": 0.0}

    def timed(name, func):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - t
        return wrapper

    original_tuner, original_round_update = step._tuner, adapter.round_update
    step._record_round = timed("record_round", step._record_round)
    step._tuner = lambda: (lambda t: t._replace(update=timed("gp_update", t.update)))(original_tuner())
    adapter.round_update = timed("round_update", original_round_update)
    try:
        row = _one_run(model, step, start, iterations, seed)
    finally:
        del step._record_round, step._tuner
        adapter.round_update = original_round_update
    out = {f"{name}_us_per_iteration": value / iterations * 1e6 for name, value in seconds.items()}
    out["outside_step_us_per_iteration"] = (row["loop_s"] - row["step_s"]) / iterations * 1e6
    return out


def _gradient_seconds(step, start, calls=3000):
    """Seconds per call of the step's compiled log density + gradient (median of 5 batches)."""
    func = step._logp_dlogp_func
    try:
        func.set_extra_values({})
    except Exception:  # noqa: BLE001 - models without extra values
        pass
    q = np.asarray(start, dtype=np.float64)
    func(q)
    batches = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            func(q)
        batches.append((time.perf_counter() - t) / calls)
    return float(np.median(batches))


def measure(model_name, iterations, repeats, seed=0):
    from .models import get_model
    from .pymc_models import build

    eps, num_steps = SETTINGS[model_name]
    model = build(model_name)
    jax_model = get_model(model_name)
    start = np.asarray(jax_model.mean if jax_model.mean is not None else jax_model.init, dtype=np.float64)
    if model_name in ("pima", "ripley", "breast_cancer"):
        start = _mode(model, start)
    names = ("hmc", "ahmc_fixed", "ahmc_tuning")
    steps = {name: _steps(model, name, eps, num_steps) for name in names}
    for name in names:  # warm: first-call costs (compilation of pm.sample's helpers) out of the timings
        _one_run(model, steps[name], start, 50, seed)
    runs = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            runs[name].append(_one_run(model, steps[name], start, iterations, seed + r))
    grad_s = _gradient_seconds(steps["hmc"], start)
    breakdown = {name: _breakdown(model, steps[name], start, iterations, seed) for name in names[1:]}
    out = {"eps": eps, "L0": num_steps, "dim": int(start.size), "gradient_call_us": grad_s * 1e6, "samplers": {}}
    for name in names:
        rows = runs[name]
        loop_per_grad = [row["loop_s"] / row["grads"] for row in rows]
        step_per_grad = [row["step_s"] / row["grads"] for row in rows]
        loop_per_iter = [row["loop_s"] / row["iterations"] for row in rows]
        grads_per_iter = [row["grads"] / row["iterations"] for row in rows]
        overhead = [(row["loop_s"] - row["grads"] * grad_s) / row["iterations"] for row in rows]
        outside = [(row["loop_s"] - row["step_s"]) / row["iterations"] for row in rows]
        out["samplers"][name] = {
            "loop_us_per_grad": float(np.median(loop_per_grad)) * 1e6,
            "step_us_per_grad": float(np.median(step_per_grad)) * 1e6,
            "loop_us_per_iteration": float(np.median(loop_per_iter)) * 1e6,
            "grads_per_iteration": float(np.median(grads_per_iter)),
            "overhead_us_per_iteration": float(np.median(overhead)) * 1e6,
            "outside_step_us_per_iteration": float(np.median(outside)) * 1e6,
            "breakdown_instrumented": breakdown.get(name),
            "mean_accept": float(np.mean([row["mean_accept"] for row in rows])),
            "divergences": int(sum(row["divergences"] for row in rows)),
            "loop_us_per_grad_min": float(np.min(loop_per_grad)) * 1e6,
            "loop_us_per_grad_all": [v * 1e6 for v in loop_per_grad],
            "runs": rows,
        }
    hmc = out["samplers"]["hmc"]
    for name in ("ahmc_fixed", "ahmc_tuning"):
        s = out["samplers"][name]
        s["ratio_loop_per_grad_vs_hmc"] = s["loop_us_per_grad"] / hmc["loop_us_per_grad"]
        # The fastest run of each is the least disturbed by other jobs (timeit's rule): robust on a shared machine.
        s["ratio_min_loop_per_grad_vs_hmc"] = s["loop_us_per_grad_min"] / hmc["loop_us_per_grad_min"]
        s["ratio_step_per_grad_vs_hmc"] = s["step_us_per_grad"] / hmc["step_us_per_grad"]
        s["extra_overhead_us_per_iteration_vs_hmc"] = s["overhead_us_per_iteration"] - hmc["overhead_us_per_iteration"]
    return out


def _mode(model, start):
    """The posterior mode (``pm.find_MAP``, L-BFGS): the runs start in the bulk of the posterior."""
    import warnings

    import pymc as pm

    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # find_MAP's announced API changes
        point = pm.find_MAP(initvals={"x": start}, progressbar=False, return_raw=False)
    return np.asarray(point["x"], dtype=np.float64)


def _versions():
    out = {}
    for name in ("ahmc", "pymc", "pytensor", "numba", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pymc_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="pima,std_gauss_10", help=f"comma-separated, of: {', '.join(SETTINGS)}")
    parser.add_argument("--iterations", type=int, default=2000, help="iterations per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per sampler (alternating order)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from .run import _cpu_model, _git

    started = time.perf_counter()
    results = {
        "command": shlex.join([Path(sys.executable).name, "-m", "benchmarks.pymc_overhead", *argv]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "nproc": os.cpu_count(),
        "load_average_start": list(os.getloadavg()),
        "packages": _versions(),
        "git_commit": _git("rev-parse", "HEAD"),
        "settings": {"iterations": args.iterations, "repeats": args.repeats},
        "target": "AdaptiveHMC loop time per gradient within 10% of pm.HamiltonianMC (ratio <= 1.10)",
        "models": {},
    }
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        print(f"{name}: {args.repeats} x {args.iterations} iterations per sampler ...", flush=True)
        out = measure(name, args.iterations, args.repeats)
        results["models"][name] = out
        print(f"  gradient call alone: {out['gradient_call_us']:.1f} us (eps {out['eps']}, L0 {out['L0']})")
        for sampler, s in out["samplers"].items():
            ratio = s.get("ratio_loop_per_grad_vs_hmc")
            print(f"  {sampler:12s} loop {s['loop_us_per_grad']:7.1f} us/grad, {s['loop_us_per_iteration']:8.1f} us/iter "
                  f"({s['grads_per_iteration']:.2f} grads/iter), overhead beyond gradients "
                  f"{s['overhead_us_per_iteration']:7.1f} us/iter, accept {s['mean_accept']:.2f}"
                  + ("" if ratio is None else f"; vs hmc per grad x{ratio:.3f} (median), "
                                              f"x{s['ratio_min_loop_per_grad_vs_hmc']:.3f} (fastest runs)"), flush=True)
            if s.get("breakdown_instrumented"):
                b = s["breakdown_instrumented"]
                print(f"  {'':12s} outside the trajectory {b['outside_step_us_per_iteration']:.1f} us/iter, of which "
                      f"_record_round {b['record_round_us_per_iteration']:.1f} (GP update "
                      f"{b['gp_update_us_per_iteration']:.1f}, round stats {b['round_update_us_per_iteration']:.1f})",
                      flush=True)
    results["load_average_end"] = list(os.getloadavg())
    results["elapsed_s"] = time.perf_counter() - started
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.output} ({results['elapsed_s']:.0f} s)")
    return results


if __name__ == "__main__":
    main()
