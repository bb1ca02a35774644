"""Hard geometry against NUTS: ``python -m benchmarks.hard_geometry [--seeds 0-7] [--routes numpyro,pymc]``.

Two posteriors whose small scales sit in a neck: the 10-d funnel (``v ~ N(0, 3)``, nine ``x ~ N(0, e^(v/2))``)
and the centered eight schools (the truth of its ``log tau`` from a long NUTS run on the non-centered model).
Each sampler runs as its users call it, 4 chains x (1000 warm-up + 1000 draws): NumPyro's ``MCMC`` with
``AdaptiveHMC`` (default, and ``divergence_retry=None``) and ``NUTS`` (vectorized chains); PyMC's
``pm.sample`` with ``step=AdaptiveHMC()`` (and without the retry), nutpie and PyMC's NUTS (``cores=2``).

Per run: divergences while sampling, the strict ESS (min over coordinates of min(bulk ESS of x, of
(x - mean)^2)), the mean and sd of the neck's coordinate (``v``; ``log tau``) against the truth.  Per
sampler, over the seeds: the root mean square error of that mean, what the ESS alone does not show (a
chain that never enters the neck mixes fast, wrongly).  Uses only the public APIs; prints Markdown.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np

from .metrics import strict_ess

EIGHT_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
EIGHT_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
NUM_CHAINS, NUM_WARMUP, NUM_SAMPLES = 4, 1000, 1000


def log_tau_truth(num_samples: int = 20000) -> tuple[float, float]:
    """Mean and sd of eight schools' ``log tau``, from NumPyro's NUTS on the non-centered model (the same
    posterior without the neck: 4 chains x 20000 draws; posteriordb's reference draws give 0.81 and 1.17)."""
    import jax
    from numpyro.infer import MCMC, NUTS

    from .posteriordb import POSTERIORS, load_data

    posterior, builder = POSTERIORS["eight_schools"]
    eight_schools_noncentered = builder(load_data(posterior))  # posteriordb's data: the same y and sigma
    mcmc = MCMC(NUTS(eight_schools_noncentered, target_accept_prob=0.95), num_warmup=1000,
                num_samples=num_samples, num_chains=NUM_CHAINS, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(2013))
    log_tau = np.log(np.asarray(mcmc.get_samples()["tau"]))
    return float(log_tau.mean()), float(log_tau.std())


def numpyro_run(model_name: str, sampler: str, seed: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    from ahmc.adapters.numpyro import AdaptiveHMC

    def funnel():
        v = numpyro.sample("v", dist.Normal(0.0, 3.0))
        numpyro.sample("x", dist.Normal(0.0, jnp.exp(v / 2)).expand([9]))

    def eight_schools_centered(y, sigma):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("school", len(y)):
            theta = numpyro.sample("theta", dist.Normal(mu, tau))
            numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

    model, args = (funnel, ()) if model_name == "funnel" else (eight_schools_centered, (EIGHT_Y, EIGHT_SIGMA))
    kernel = {"ahmc": lambda: AdaptiveHMC(model), "ahmc_no_retry": lambda: AdaptiveHMC(model, divergence_retry=None),
              "nuts": lambda: NUTS(model)}[sampler]()
    mcmc = MCMC(kernel, num_warmup=NUM_WARMUP, num_samples=NUM_SAMPLES, num_chains=NUM_CHAINS,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(seed), *args, extra_fields=("diverging",))
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    neck = samples["v"] if model_name == "funnel" else np.log(samples["tau"])
    draws = np.concatenate([samples[k].reshape(NUM_CHAINS, NUM_SAMPLES, -1) for k in sorted(samples)], axis=-1)
    if model_name != "funnel":  # score log tau, the neck's coordinate, not tau
        draws[..., sorted(samples).index("tau")] = neck
    diverging = int(np.asarray(mcmc.get_extra_fields()["diverging"]).sum())
    return {"divergences": diverging, "strict_ess": strict_ess(draws), "neck": neck}


def pymc_run(sampler: str, seed: int) -> dict:
    import pymc as pm

    from ahmc.adapters.pymc import AdaptiveHMC

    with pm.Model():
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfCauchy("tau", 5.0)
        theta = pm.Normal("theta", mu, tau, shape=8)
        pm.Normal("obs", theta, EIGHT_SIGMA, observed=EIGHT_Y)
        options = dict(chains=NUM_CHAINS, cores=2, tune=NUM_WARMUP, draws=NUM_SAMPLES, random_seed=seed,
                       progressbar=False, compute_convergence_checks=False)
        if sampler in ("ahmc", "ahmc_no_retry"):
            step = AdaptiveHMC() if sampler == "ahmc" else AdaptiveHMC(divergence_retry=None)
            tree = pm.sample(step=step, **options)
        else:
            tree = pm.sample(nuts_sampler=sampler, **options)
    post = tree.posterior
    neck = np.log(post["tau"].values)
    draws = np.concatenate([post["mu"].values[..., None], neck[..., None], post["theta"].values], axis=-1)
    return {"divergences": int(tree.sample_stats["diverging"].values.sum()), "strict_ess": strict_ess(draws),
            "neck": neck}


CASES = {  # (route, model) -> samplers; the truth of the neck's coordinate
    ("numpyro", "funnel"): ("ahmc", "ahmc_no_retry", "nuts"),
    ("numpyro", "eight_schools_centered"): ("ahmc", "ahmc_no_retry", "nuts"),
    ("pymc", "eight_schools_centered"): ("ahmc", "ahmc_no_retry", "nutpie", "pymc"),
}


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(v) for v in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(v) for v in text.split(",")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-7", help="e.g. 0-7 or 0,3")
    parser.add_argument("--routes", default="numpyro,pymc")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    warnings.filterwarnings("ignore")
    seeds, routes = parse_seeds(args.seeds), args.routes.split(",")
    log_tau = log_tau_truth()
    print("| route | model | sampler | divergences per seed | strict ESS per seed | neck mean (sd) per seed "
          "| RMSE of the neck's mean |")
    print("|---|---|---|---|---|---|---|")
    for (route, model), samplers in CASES.items():
        if route not in routes:
            continue
        truth = (0.0, 3.0) if model == "funnel" else log_tau
        for sampler in samplers:
            start, runs = time.perf_counter(), []
            for seed in seeds:
                runs.append(numpyro_run(model, sampler, seed) if route == "numpyro" else pymc_run(sampler, seed))
            means = np.array([r["neck"].mean() for r in runs])
            rmse = math.sqrt(float(np.mean((means - truth[0]) ** 2)))
            necks = ", ".join("%.2f (%.2f)" % (r["neck"].mean(), r["neck"].std()) for r in runs)
            divergences = ", ".join(str(r["divergences"]) for r in runs)
            ess = ", ".join("%.0f" % r["strict_ess"] for r in runs)
            print(f"| {route} | {model} | {sampler} | {divergences} | {ess} | {necks} | {rmse:.2f} "
                  f"(truth {truth[0]:.2f} ({truth[1]:.2f})) |", flush=True)
            print(f"<!-- {route} {model} {sampler}: {time.perf_counter() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
