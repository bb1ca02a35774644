"""Riemann-manifold HMC in PyMC: a logistic regression with its Fisher metric.

AdaptiveRMHMC tunes (eps, L) with the same GP-UCB bandit as AdaptiveHMC; the metric G(x)
moves with the position. Each draw reports whether the implicit leapfrog's fixed points
converged and how many model evaluations it took. Without a metric, AdaptiveRMHMC()
uses SoftAbs of the Hessian (slower: third derivatives).

    ./dev run python examples/pymc_rmhmc.py [--draws 250] [--seed 0]
"""

import argparse

import numpy as np
import pymc as pm

from ahmc.adapters.pymc import AdaptiveRMHMC, fisher_logistic_metric


def main(draws=250, seed=0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(200), rng.normal(size=(200, 2))])  # intercept column first
    y = rng.random(200) < 1 / (1 + np.exp(-X @ np.array([-0.5, 2.0, -1.0])))
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)  # prior variance 100
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
        step = AdaptiveRMHMC(metric=fisher_logistic_metric(X, prior_variance=100.0))
        idata = pm.sample(draws=draws, tune=draws, chains=2, cores=1, step=step, random_seed=seed,
                          progressbar=False)
    stats = idata.sample_stats
    print(f"beta posterior mean {idata.posterior['beta'].values.reshape(-1, 3).mean(0).round(2)} "
          f"(simulated with -0.5, 2.0, -1.0)")
    print(f"eps {stats['step_size'].values[:, -1].round(3)}, L {stats['max_steps'].values[:, -1]} (last arm per chain)")
    print(f"fixed points converged in {stats['fixed_point_converged'].values.mean():.1%} of the draws; "
          f"{stats['n_grad_evals'].values.mean():.1f} model evaluations per draw "
          f"for {stats['n_steps'].values.mean():.1f} leapfrog steps")

    return idata


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    main(**vars(parser.parse_args()))
