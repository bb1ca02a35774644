"""Reference posterior of the Pima logistic regression (benchmarks/pymc_models.py) from PyMC NUTS.

Writes ``tests/adapters/data/pima_logistic_reference.json``: per coefficient (Stan-style
names ``x[1]``..``x[8]``) the posterior mean and mean square with their Monte Carlo standard
errors (sd / sqrt(bulk ESS)); ``tests.reference.load_pima_logistic_reference`` reads it into
the form ``tests.reference.zscores_against_reference`` takes.  Run: ``./dev run python -m benchmarks.pima_reference`` (about a minute).
"""

from __future__ import annotations

import json
from pathlib import Path

import arviz_stats
import numpy as np
import pymc as pm

from benchmarks.pymc_models import build

OUT = Path(__file__).resolve().parents[1] / "tests" / "adapters" / "data" / "pima_logistic_reference.json"
SETTINGS = dict(tune=1000, draws=5000, chains=4, cores=1, random_seed=20130616, target_accept=0.9)


def moments(values):
    """Mean and MCSE = sd / sqrt(bulk ESS) per coordinate of (chains, draws, dim) values."""
    ess = np.asarray(arviz_stats.ess(values, method="bulk"), dtype=float)
    return values.mean(axis=(0, 1)), values.std(axis=(0, 1), ddof=1) / np.sqrt(ess), ess


def main():
    with build("pima"):
        idata = pm.sample(progressbar=False, compute_convergence_checks=False, **SETTINGS)
    x = idata.posterior["x"].values
    mean, mean_mcse, ess = moments(x)
    square, square_mcse, _ = moments(x**2)
    rhat = np.asarray(arviz_stats.rhat(x, method="rank"), dtype=float)
    names = [f"x[{i + 1}]" for i in range(x.shape[-1])]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "command": "./dev run python -m benchmarks.pima_reference",
        "sampler": f"pm.sample NUTS (PyMC {pm.__version__}; library: {idata.posterior.attrs.get('inference_library', 'pymc')})",
        "settings": SETTINGS,
        "names": names,
        "mean": mean.tolist(), "mean_mcse": mean_mcse.tolist(),
        "mean_squared": square.tolist(), "mean_squared_mcse": square_mcse.tolist(),
        "bulk_ess": ess.tolist(), "rhat": rhat.tolist(),
    }, indent=1) + "\n")
    print(f"wrote {OUT}: min bulk ESS {ess.min():.0f}, max R-hat {rhat.max():.4f}")


if __name__ == "__main__":
    main()
