"""A PyMC model on the compiled JAX engine: sample_numpyro_ahmc, four chains, one pooled tuner.

The same model as examples/pymc_gaussian.py (a correlated 2-D Gaussian next to
a badly scaled 1-D one) plus a Deterministic; the tuning summary is rebuilt
from the returned DataTree alone.

    ./dev run python examples/pymc_compiled.py [--draws 1000] [--seed 0]
"""

import argparse

import numpy as np
import pymc as pm

from ahmc.adapters.diagnostics import history_from_datatree
from ahmc.adapters.pymc import sample_numpyro_ahmc
from ahmc.core.diagnostics import tuning_summary


def main(draws=1000, seed=0):
    cov = np.array([[1.0, 0.9], [0.9, 1.0]])
    with pm.Model():
        x = pm.MvNormal("x", mu=np.zeros(2), cov=cov)
        pm.Normal("scale", 0.0, 100.0)
        pm.Deterministic("x_sum", x.sum())
        idata = sample_numpyro_ahmc(draws=draws, tune=draws, chains=4, random_seed=seed, progressbar=False,
                                    discard_tuned_samples=False)

    x = idata.posterior["x"].values.reshape(-1, 2)
    print(f"x mean {x.mean(0).round(2)}, corr {np.corrcoef(x.T)[0, 1]:.2f} (exact 0, 0.90)")
    print(f"scale sd {idata.posterior['scale'].values.std():.1f} (exact 100); "
          f"x_sum sd {idata.posterior['x_sum'].values.std():.2f} (exact {np.sqrt(cov.sum()):.2f})")
    print(f"sampling time with compilation: {idata.posterior.attrs['sampling_time']:.1f} s")
    summary = tuning_summary(history_from_datatree(idata))
    print(summary)
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    main(**vars(parser.parse_args()))
