"""How far the tuner's reward misjudges an arm: ``python -m benchmarks.reward_estimate [--model pima]``.

The default reward (``normalized_ess``) estimates a round's strict ESS per draw from the chains' pooled
lag-1 jumps, as if the chain were AR(1). Each arm ``(eps, L)`` of the grid below is run alone
(``run_chains`` with the box fixed to it, 4 chains x (1000 warm-up + 2000 draws)) and three numbers set
side by side, all from the 2000 draws:

* the strict ESS per draw (ArviZ's bulk ESS, min over coordinates of x and (x - mean)^2), the truth;
* the reward's estimate, ``normalized_ess`` of the whole run's sums (so without a round's noise);
* a two-lag estimate: the lag-2 jumps give ``rho_2`` too, and ``tau = 1 + 2 rho_1 + 2 rho_2 / (1 - rho_2 /
  rho_1)`` (a geometric tail after lag 2; equal to the AR(1) value when ``rho_2 = rho_1^2``).

A study, not a benchmark (docs/decisions.md, "A reward estimate with more lags"): prints a Markdown table.
"""

from __future__ import annotations

import argparse

import numpy as np

from ahmc.core.objectives import RoundStats, normalized_ess

from .metrics import strict_ess


def _pooled_rho(values: np.ndarray, variance: float, lag: int) -> float:
    """``1 - E||v_{t+lag} - v_t||^2 / (2 variance)``, pooled over chains and coordinates (as the reward pools)."""
    jumps = np.mean(np.sum((values[:, lag:] - values[:, :-lag]) ** 2, axis=-1))
    return 1.0 - jumps / (2.0 * variance)


def _two_lag_ess(rho1: float, rho2: float) -> float:
    """Effective draws per draw from the first two autocorrelations, with a geometric tail after lag 2."""
    rho1 = min(max(rho1, -0.9), 0.999)
    if rho1 <= 0.0 or rho2 <= 0.0:
        return (1.0 - rho1) / (1.0 + rho1) if rho1 <= 0.0 else 1.0 / (1.0 + 2.0 * rho1)
    ratio = min(rho2 / rho1, 0.999)
    return 1.0 / (1.0 + 2.0 * rho1 + 2.0 * rho2 / (1.0 - ratio))


def estimates(draws: np.ndarray, gradients_per_draw: float) -> dict:
    """The strict ESS per draw of ``draws`` (chains, draws, d) and the reward's two estimates of it."""
    mean, sd = draws.mean(axis=(0, 1)), draws.std(axis=(0, 1))
    z = (draws - mean) / sd  # whitened and centred, as the reward's sums are
    squares = z ** 2
    truth = strict_ess(draws) / (draws.shape[0] * draws.shape[1])
    num = draws.shape[0] * (draws.shape[1] - 1)
    squares_jump = 0.5 * float(np.sum((squares[:, 1:] - squares[:, :-1]) ** 2))
    stats = RoundStats(num_iterations=float(num), num_gradients=gradients_per_draw * num,
                       sum_squared_jump=float(np.sum((z[:, 1:] - z[:, :-1]) ** 2)), sum_acceptance=float(num),
                       num_divergent=0, sum_squared_jump_squares=squares_jump,
                       sum_squares=float(np.sum(squares[:, 1:])))
    lag_one = float(normalized_ess(stats, 1)) * np.sqrt(gradients_per_draw)
    variance = float(np.mean(np.sum(squares, axis=-1)))
    two_lag = min(_two_lag_ess(_pooled_rho(z, variance, 1), _pooled_rho(z, variance, 2)),
                  _two_lag_ess(_pooled_rho(squares, 2 * variance, 1), _pooled_rho(squares, 2 * variance, 2)))
    return {"truth": truth, "lag_one": lag_one, "two_lag": two_lag}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="pima")
    parser.add_argument("--step-sizes", default="0.48,0.6,0.75")
    parser.add_argument("--num-steps", default="1,2,3,4,6")
    args = parser.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    from ahmc.adapters.blackjax import run_chains

    from .models import get_model, initial_positions

    model = get_model(args.model)
    positions = jnp.asarray(initial_positions(model, 4, 0))
    print("| eps | L | gradients/draw | strict ESS/draw | lag-1 estimate | two-lag estimate |")
    print("|---|---|---|---|---|---|")
    rows = []
    for eps in (float(v) for v in args.step_sizes.split(",")):
        for steps in (int(v) for v in args.num_steps.split(",")):
            draws, info = run_chains(jax.random.key(1), model.logdensity_fn, positions, 1000, 2000,
                                     step_size_bounds=(eps, eps), num_steps_bounds=(steps, steps))
            gradients = float(np.mean(np.asarray(info.num_integration_steps)[:, 1000:]))
            row = {"eps": eps, "L": steps, "gradients": gradients, **estimates(np.asarray(draws), gradients)}
            rows.append(row)
            print(f"| {eps:.3g} | {steps} | {gradients:.2f} | {row['truth']:.3f} | {row['lag_one']:.3f} | "
                  f"{row['two_lag']:.3f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
