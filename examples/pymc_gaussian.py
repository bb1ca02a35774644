"""Sample an ordinary PyMC model with AdaptiveHMC and read the tuning history back.

The target is a correlated 2-D Gaussian next to a badly scaled 1-D one. The
tuner's whole history (arm per draw, reward per round) is in sample_stats.

    ./dev run python examples/pymc_gaussian.py [--draws 1000] [--seed 0]
"""

import argparse

import numpy as np
import pymc as pm

from ahmc.adapters.pymc import AdaptiveHMC


def main(draws=1000, seed=0):
    cov = np.array([[1.0, 0.9], [0.9, 1.0]])
    with pm.Model():
        pm.MvNormal("x", mu=np.zeros(2), cov=cov)
        pm.Normal("scale", 0.0, 100.0)
        idata = pm.sample(draws=draws, tune=draws, chains=2, cores=1, step=AdaptiveHMC(),
                          random_seed=seed, progressbar=False, discard_tuned_samples=False)

    x = idata.posterior["x"].values.reshape(-1, 2)
    scale = idata.posterior["scale"].values.ravel()
    print(f"x mean {x.mean(0).round(2)}, corr {np.corrcoef(x.T)[0, 1]:.2f} (exact 0, 0.90)")
    print(f"scale sd {scale.std():.1f} (exact 100)")

    # Rebuild the tuning history of chain 0 from the stats alone.
    stats = {name: np.concatenate([idata.warmup_sample_stats[name].values[0], idata.sample_stats[name].values[0]])
             for name in ("tuning_round", "reward", "step_size", "max_steps", "adapt_probability", "n_steps")}
    ends = np.flatnonzero(np.isfinite(stats["reward"]))
    print(f"warm-up iterations: {int((stats['tuning_round'] == 0).sum())}, GP rounds: {len(ends)}")
    print(" round   step_size    L    reward   p_adapt")
    for t in ends[:: max(1, len(ends) // 12)]:
        print(f"{stats['tuning_round'][t]:6d}   {stats['step_size'][t]:9.4f}  {stats['max_steps'][t]:3d}  "
              f"{stats['reward'][t]:8.3f}   {stats['adapt_probability'][t]:7.3f}")
    print(f"final arm: eps = {stats['step_size'][-1]:.3f}, L = {stats['max_steps'][-1]}; "
          f"mean gradients per draw: {idata.sample_stats['n_steps'].values.mean():.1f}")
    return idata


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    main(**vars(parser.parse_args()))
