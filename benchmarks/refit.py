"""Refits with and without a warm start: ``python -m benchmarks.refit [--seeds 3] [--models pima] [--route pymc]``.

Each scenario fits a model (the logistic regressions Pima and breast cancer, posteriordb's kidiq linear
regression) once (cold, the earlier fit), keeps its tuning snapshot
(:func:`ahmc.adapters.blackjax.tuning_snapshot`), and refits new data twice with the same seeds: cold
(1000 warm-up iterations) and warm (``warm_start=snapshot``, 250).  The new data are a bootstrap
resample of the rows, or every row after an earlier fit on the first 90% ("one more batch").

Reported per refit, the mean over seeds: warm-up gradients (the warm start's check counted), total wall
seconds (compilation included: the new data are a new log density), the strict ESS (min over coordinates
of min(bulk ESS of x, of (x - mean)^2)) per gradient and per second, the ceiling (the cold run's gradients
over its draws': what skipping the whole warm-up could give per gradient, were the draws as efficient), the
largest |z| of the warm run's means against the cold run's (both MCSEs), and the largest R-hat.  Uses only
the public API.

``--route pymc`` refits the logistic regressions with ``pm.sample(step=AdaptiveHMC(warm_start=...))``
instead (4 chains, ``cores=2``; tune 1000 cold, 250 warm, the snapshot's check inside the warm tune),
the snapshot read off the earlier fit's DataTree by ``ahmc.adapters.pymc.tuning_snapshot``.

``--metric softabs`` (any metric name ``run_chains`` takes) refits the BlackJAX route with Riemann-manifold
HMC: the snapshot then keeps the step size and GP evidence, and ``G(x)`` is computed on the new posterior.

``--route partial`` refits the logistic regressions on the BlackJAX route with each log density a
``jax.tree_util.Partial(logdensity, X, y)``, the data as arguments of ``run_chains``' compiled program, in
one process: the earlier fit (cold, then a warm refit) compiles the programs of its shapes, and a refit of
the same shapes, cold or warm, compiles nothing (a bootstrap resample; one more batch is a new shape, which
the first seed's cold and warm refits each compile once).

``--route numpyro`` refits the logistic regressions with ``MCMC(AdaptiveHMC(model, warm_start=...))``, the data
as model arguments (``jit_model_args=True``) and JAX's persistent compilation cache on (a fresh folder for
the run), as a user who refits the same model daily would run it: the earlier fit compiles the programs and
every refit, cold or warm, loads them (docs/warm_start.md, "Refits without compiling again").
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings
from typing import Callable, NamedTuple

import jax
import numpy as np

from ahmc.adapters.blackjax import run_chains, tuning_snapshot
from ahmc.core.snapshot import CHECK_ITERATIONS, WarmStartWarning

from .metrics import bulk_ess, split_rhat, strict_ess
from .models import load_breast_cancer, load_pima, logistic_logdensity, logistic_regression
from .posteriordb import POSTERIORS, load_data

LOADERS = {"pima": load_pima, "breast_cancer": load_breast_cancer}
POSTERIORDB = {"kidiq": "kidiq-kidscore_momiq"}  # a posteriordb linear regression: rows of its data
NUM_CHAINS, NUM_SAMPLES, COLD_WARMUP, WARM_WARMUP = 4, 1000, 1000, 250


class Posterior(NamedTuple):
    logdensity_fn: Callable
    dim: int


def posteriordb_model(name: str, rows) -> Posterior:
    """The posteriordb posterior ``name`` on the given rows of its data (every length-N array subset)."""
    from jax.flatten_util import ravel_pytree
    from numpyro.infer.util import initialize_model

    posterior, builder = POSTERIORS[name]
    data = load_data(posterior)
    size = int(data["N"])
    data = {key: (np.asarray(value)[rows].tolist() if np.ndim(value) and len(value) == size else value)
            for key, value in data.items()}
    data["N"] = len(rows)
    info = initialize_model(jax.random.key(0), builder(data), dynamic_args=False)
    flat, unravel = ravel_pytree(info.param_info.z)
    potential = info.potential_fn
    return Posterior(lambda x: -potential(unravel(x)), int(flat.shape[0]))


def scenarios(name: str, rng):
    """``(label, earlier model, refit model)`` pairs of one data set."""
    if name in POSTERIORDB:
        size = int(load_data(POSTERIORDB[name])["N"])
        every, first = np.arange(size), int(0.9 * size)
        yield "bootstrap", posteriordb_model(name, every), posteriordb_model(name, rng.integers(0, size, size))
        yield "+10% rows", posteriordb_model(name, every[:first]), posteriordb_model(name, every)
        return
    X, y, _ = LOADERS[name]()
    rows = rng.integers(0, len(y), len(y))
    first = int(0.9 * len(y))
    yield "bootstrap", logistic_regression(name, X, y, ""), logistic_regression(name, X[rows], y[rows], "")
    yield "+10% rows", logistic_regression(name, X[:first], y[:first], ""), logistic_regression(name, X, y, "")


def partial_scenarios(name: str, rng):
    """The logistic regressions' scenarios (the rows of :func:`scenarios`), each log density a
    ``jax.tree_util.Partial`` of one function and its data: refits of the same shapes compile nothing."""
    for label, (X, y), (X_new, y_new) in numpyro_scenarios(name, rng):
        yield (label, Posterior(jax.tree_util.Partial(logistic_logdensity, X, y), X.shape[1] + 1),
               Posterior(jax.tree_util.Partial(logistic_logdensity, X_new, y_new), X.shape[1] + 1))




def mcse(draws):
    return draws.std(axis=(0, 1)) / np.sqrt(bulk_ess(draws))


def run(model, seed: int, num_warmup: int, warm_start=None, metric=None) -> dict:
    """One ``run_chains`` fit (``metric``: RMHMC's, by name), timed from the call."""
    positions = 0.1 * jax.random.normal(jax.random.key(seed), (NUM_CHAINS, model.dim))
    logdensity = model.logdensity_fn
    if not isinstance(logdensity, jax.tree_util.Partial):  # a new function: compiled anew, as a refit is
        logdensity = lambda x: model.logdensity_fn(x)  # noqa: E731
    extra = {} if metric is None else {"metric": metric}
    start = time.perf_counter()
    samples, info, state = run_chains(jax.random.key(seed + 1), logdensity, positions, num_warmup, NUM_SAMPLES,
                                      warm_start=warm_start, return_state=True, **extra)
    draws = np.asarray(samples)
    seconds = time.perf_counter() - start
    # RMHMC counts its metric's evaluations with the gradients (num_gradient_evals), as the benchmark does.
    steps = np.asarray(info.num_integration_steps if metric is None else info.num_gradient_evals)
    warmup = np.asarray(info.is_warmup)
    # The check: CHECK_ITERATIONS transitions per chain with L ~ U{1..L} at the snapshot's arm (its mean).
    check = 0.0 if warm_start is None else NUM_CHAINS * CHECK_ITERATIONS * (warm_start.arm[1] + 1) / 2
    grads = {"warmup": float(steps[warmup].sum()) + check, "sampling": float(steps[~warmup].sum())}
    return {"draws": draws, "seconds": seconds, "grads": grads, "ess": strict_ess(draws),
            "rhat": float(split_rhat(draws).max()), "snapshot": tuning_snapshot(info, state, **extra),
            "fell_back": int(warmup.sum(axis=1)[0]) != num_warmup}


def pymc_scenarios(name: str, rng):
    """The logistic regressions' scenarios as PyMC models (the same rows as :func:`scenarios`)."""
    from .pymc_models import logistic_regression as pymc_logistic

    X, y, _ = LOADERS[name]()
    rows = rng.integers(0, len(y), len(y))
    first = int(0.9 * len(y))
    yield "bootstrap", pymc_logistic(X, y), pymc_logistic(X[rows], y[rows])
    yield "+10% rows", pymc_logistic(X[:first], y[:first]), pymc_logistic(X, y)


def run_pymc(model, seed: int, num_warmup: int, warm_start=None) -> dict:
    """One ``pm.sample(step=AdaptiveHMC())`` fit, timed from the call (the step compiles the model in it)."""
    import pymc as pm

    from ahmc.adapters.pymc import AdaptiveHMC, tuning_snapshot as pymc_snapshot

    start = time.perf_counter()
    with model:
        tree = pm.sample(draws=NUM_SAMPLES, tune=num_warmup, chains=NUM_CHAINS, cores=2, random_seed=seed,
                         step=AdaptiveHMC(warm_start=warm_start), progressbar=False, discard_tuned_samples=False,
                         compute_convergence_checks=False)
    seconds = time.perf_counter() - start
    posterior = tree["posterior"]
    draws = np.concatenate([np.asarray(posterior[name]).reshape(NUM_CHAINS, NUM_SAMPLES, -1)
                            for name in posterior.data_vars], axis=-1)
    grads = {"warmup": float(np.asarray(tree["warmup_sample_stats"]["n_steps"]).sum()),
             "sampling": float(np.asarray(tree["sample_stats"]["n_steps"]).sum())}
    fell_back = warm_start is not None and bool(np.any(np.asarray(
        tree["warmup_sample_stats"]["step_size"])[:, :CHECK_ITERATIONS] != warm_start.arm[0]))
    with model:
        snapshot = pymc_snapshot(tree)
    return {"draws": draws, "seconds": seconds, "grads": grads, "ess": strict_ess(draws),
            "rhat": float(split_rhat(draws).max()), "snapshot": snapshot, "fell_back": fell_back}


def numpyro_scenarios(name: str, rng):
    """The logistic regressions' scenarios as ``(X, y)`` pairs (the rows of :func:`scenarios`)."""
    from .models import standardize

    X, y, _ = LOADERS[name]()
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    rows = rng.integers(0, len(y), len(y))
    first = int(0.9 * len(y))

    def data(rows):  # each data set standardized on its own rows, as benchmarks.models.logistic_regression does
        return standardize(X[rows]), y[rows]
    yield "bootstrap", data(np.arange(len(y))), data(rows)
    yield "+10% rows", data(np.arange(first)), data(np.arange(len(y)))


def _numpyro_logistic(X, y):
    """The benchmark's logistic regression (intercept and coefficients, prior variance 100) as a NumPyro model."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from .models import PRIOR_VARIANCE

    x = numpyro.sample("x", dist.Normal(0.0, float(np.sqrt(PRIOR_VARIANCE))).expand([X.shape[1] + 1]))
    eta = x[0] + X @ x[1:]
    numpyro.factor("loglik", jnp.sum(y * eta - jax.nn.softplus(eta)))


def run_numpyro(data, seed: int, num_warmup: int, warm_start=None) -> dict:
    """One NumPyro fit, one ``mcmc.run`` as users call it (warm-up and draws in one loop, every iteration
    kept to count the warm-up's gradients), timed from the kernel's construction to the draws on the host."""
    import jax.numpy as jnp
    from numpyro.infer import MCMC

    from ahmc.adapters.numpyro import AdaptiveHMC, tuning_snapshot as numpyro_snapshot

    from .samplers import _keep_every_iteration

    X, y = (jnp.asarray(a) for a in data)
    start = time.perf_counter()
    mcmc = MCMC(AdaptiveHMC(_numpyro_logistic, warm_start=warm_start), num_warmup=num_warmup,
                num_samples=NUM_SAMPLES, num_chains=NUM_CHAINS, chain_method="vectorized", progress_bar=False,
                jit_model_args=True)
    _keep_every_iteration(mcmc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", WarmStartWarning)
        mcmc.run(jax.random.key(seed), X, y, extra_fields=("num_steps",))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])[:, num_warmup:]
    seconds = time.perf_counter() - start
    steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"])
    check = 0.0 if warm_start is None else NUM_CHAINS * CHECK_ITERATIONS * (warm_start.arm[1] + 1) / 2
    grads = {"warmup": float(steps[:, :num_warmup].sum()) + check, "sampling": float(steps[:, num_warmup:].sum())}
    snapshot = numpyro_snapshot(mcmc)
    return {"draws": draws, "seconds": seconds, "grads": grads, "ess": strict_ess(draws),
            "rhat": float(split_rhat(draws).max()), "snapshot": snapshot,
            "fell_back": any(issubclass(w.category, WarmStartWarning) for w in caught),
            "why": [str(w.message) for w in caught if issubclass(w.category, WarmStartWarning)]}


def compare(name: str, seeds: int, route: str = "blackjax", metric: str | None = None,
            warm_warmup: int = WARM_WARMUP) -> list[dict]:
    rows = []
    fit, cases = {"pymc": (run_pymc, pymc_scenarios), "numpyro": (run_numpyro, numpyro_scenarios),
                  "partial": (run, partial_scenarios)}.get(route, (functools.partial(run, metric=metric), scenarios))
    for label, earlier, refit in cases(name, np.random.default_rng(0)):
        if route == "numpyro":  # every new MCMC keeps its programs in JAX's caches: free them (docs/warm_start.md)
            jax.clear_caches()
        snapshot = fit(earlier, 100, COLD_WARMUP)["snapshot"]
        if route in ("numpyro", "partial"):  # the earlier day's warm refit: the warm programs are compiled too
            fit(earlier, 101, warm_warmup, warm_start=snapshot)
        per_seed = []
        for seed in range(seeds):
            cold, warm = fit(refit, seed, COLD_WARMUP), fit(refit, seed, warm_warmup, warm_start=snapshot)
            z = (warm["draws"].mean(axis=(0, 1)) - cold["draws"].mean(axis=(0, 1))) / np.hypot(
                mcse(warm["draws"]), mcse(cold["draws"]))
            per_seed.append((cold, warm, float(np.abs(z).max())))
        rows.append(summary(name, label, per_seed))
    return rows


def summary(name: str, label: str, per_seed) -> dict:
    def mean(key, which):
        return float(np.mean([key(pair[which]) for pair in per_seed]))

    out = {"model": name, "scenario": label, "max_abs_z": max(p[2] for p in per_seed),
           "fell_back": sum(p[1]["fell_back"] for p in per_seed)}
    for which, tag in ((0, "cold"), (1, "warm")):
        out[f"{tag}_warmup_grads"] = mean(lambda r: r["grads"]["warmup"], which)
        out[f"{tag}_seconds"] = mean(lambda r: r["seconds"], which)
        out[f"{tag}_ess_per_grad"] = mean(lambda r: r["ess"] / (r["grads"]["warmup"] + r["grads"]["sampling"]), which)
        out[f"{tag}_ess_per_s"] = mean(lambda r: r["ess"] / r["seconds"], which)
        out[f"{tag}_max_rhat"] = max(pair[which]["rhat"] for pair in per_seed)
    # What skipping the whole warm-up could give per gradient, were the draws as efficient as the cold run's.
    out["ceiling"] = mean(lambda r: (r["grads"]["warmup"] + r["grads"]["sampling"]) / r["grads"]["sampling"], 0)
    return out


def table(rows: list[dict]) -> str:
    lines = ["| model | refit | warm-up grads cold / warm | wall s cold / warm | strict ESS/grad warm : cold "
             "| ceiling | strict ESS/s warm : cold | max abs z (warm vs cold) | max R-hat cold / warm | fell back |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['scenario']} | {r['cold_warmup_grads']:.0f} / {r['warm_warmup_grads']:.0f} "
            f"| {r['cold_seconds']:.1f} / {r['warm_seconds']:.1f} | {r['warm_ess_per_grad'] / r['cold_ess_per_grad']:.2f} "
            f"| {r['ceiling']:.2f} | {r['warm_ess_per_s'] / r['cold_ess_per_s']:.2f} | {r['max_abs_z']:.2f} "
            f"| {r['cold_max_rhat']:.3f} / {r['warm_max_rhat']:.3f} | {r['fell_back']} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--models", default=None, help="default: pima,breast_cancer,kidiq (pymc: no kidiq)")
    parser.add_argument("--route", choices=("blackjax", "partial", "numpyro", "pymc"), default="blackjax")
    parser.add_argument("--metric", default=None, help="RMHMC's metric on the BlackJAX route, e.g. softabs")
    parser.add_argument("--warm-warmup", type=int, default=WARM_WARMUP, help="warm runs' num_warmup")
    args = parser.parse_args(argv)
    if args.metric is not None and args.route != "blackjax":
        parser.error("--metric: RMHMC refits run on the BlackJAX route (--route blackjax)")
    jax.config.update("jax_enable_x64", True)
    if args.route == "numpyro":  # refits load the earlier fit's compiled programs
        import tempfile

        jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="ahmc-refit-cache-"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    models = args.models or ("pima,breast_cancer,kidiq" if args.route == "blackjax" else "pima,breast_cancer")
    rows = [row for name in models.split(",") for row in compare(name, args.seeds, args.route, args.metric,
                                                                   args.warm_warmup)]
    print(table(rows))


if __name__ == "__main__":
    main()
