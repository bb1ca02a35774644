"""Swap NUTS for AdaptiveHMC in an ordinary NumPyro model (eight schools).

    ./dev run python examples/numpyro_kernel.py
"""

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

from ahmc.adapters.numpyro import AdaptiveHMC

y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools(y, sigma):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", len(y)):
        theta_trans = numpyro.sample("theta_trans", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * theta_trans)
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def run(kernel):
    mcmc = MCMC(kernel, num_warmup=1000, num_samples=1000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), y, sigma, extra_fields=("num_steps",))
    return mcmc


def main():
    results = {}
    for name, kernel in [("NUTS", NUTS(eight_schools)), ("AdaptiveHMC", AdaptiveHMC(eight_schools))]:
        mcmc = run(kernel)
        gradients = int(np.sum(mcmc.get_extra_fields()["num_steps"]))
        summary = numpyro.diagnostics.summary(mcmc.get_samples(group_by_chain=True))
        min_ess = min(float(np.min(s["n_eff"])) for s in summary.values())
        results[name] = min_ess / gradients
        print(f"{name:12s} min ESS {min_ess:7.0f}  gradients {gradients:7d}  min ESS per gradient {min_ess / gradients:.4f}")
        if name == "AdaptiveHMC":
            fields = mcmc.get_extra_fields()
            print(f"{'':12s} final arm: step size {float(fields['step_size'][-1]):.3f}, "
                  f"L = {int(fields['max_steps'][-1])}; acceptance {float(np.mean(fields['accept_prob'])):.2f}")
            mcmc.print_summary(exclude_deterministic=False)
    return results


if __name__ == "__main__":
    main()
