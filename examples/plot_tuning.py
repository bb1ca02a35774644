"""What did the tuner do? Summary and figure for a NumPyro run (eight schools).

    ./dev run python examples/plot_tuning.py          # prints the summary, writes docs/tuning.png
"""

import pathlib

import arviz_base
import jax
import matplotlib
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from ahmc.adapters.diagnostics import config_from_numpyro, history_from_datatree
from ahmc.adapters.numpyro import AdaptiveHMC
from ahmc.adapters.plots import plot_tuning
from ahmc.core.diagnostics import tuning_summary

matplotlib.use("Agg")
OUTPUT = pathlib.Path(__file__).resolve().parent.parent / "docs" / "tuning.png"
y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools(y, sigma):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", len(y)):
        theta_trans = numpyro.sample("theta_trans", dist.Normal(0.0, 1.0))
        numpyro.sample("obs", dist.Normal(mu + tau * theta_trans, sigma), obs=y)


def main(output=OUTPUT, num_warmup=1000, num_samples=1000, seed=0):
    mcmc = MCMC(AdaptiveHMC(eight_schools), num_warmup=num_warmup, num_samples=num_samples, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    # Most GP rounds happen in warm-up: keep its stats (NumPyro drops them by default).
    mcmc.warmup(jax.random.key(seed), y, sigma, collect_warmup=True)
    warmup = arviz_base.from_numpyro(mcmc)
    mcmc.run(mcmc.post_warmup_state.rng_key, y, sigma)
    tree = arviz_base.from_numpyro(mcmc)
    tree["warmup_sample_stats"] = warmup["sample_stats"]
    tree.attrs["ahmc_config"] = config_from_numpyro(mcmc).to_json()  # search box + GP settings

    history = history_from_datatree(tree)
    summary = tuning_summary(history)
    print(summary)
    figure = plot_tuning(history)
    pathlib.Path(output).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=80)
    print(f"wrote {output}")
    return summary


if __name__ == "__main__":
    main()
