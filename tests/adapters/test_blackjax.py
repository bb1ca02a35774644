"""The JAX engine and the BlackJAX adapter: correctness within Monte Carlo error, API contracts.

Statistical tests follow STYLE.md: 4 chains, fixed seeds, ESS-based z-scores
for the mean and the second central moment (|z| < 4.5), bulk ESS >= 200 and
split R-hat < 1.01 (``tests/reference.py``).
"""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("blackjax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from ahmc.adapters.blackjax import (  # noqa: E402
    adaptive_hmc,
    pooled_adaptive_hmc,
    gpucb_adaptation,
    run_chains,
    uniform_steps_hmc,
)
from ahmc.core.space import NUM_STEPS_CAP, WARMUP_MAX_STEPS, grid_num_steps  # noqa: E402

from ..reference import assert_moments_match, assert_reference_match, load_reference, time_major  # noqa: E402

NUM_CHAINS = 4
ROOT = Path(__file__).resolve().parents[2]


ILL_SCALES = jnp.asarray(np.logspace(-2, 2, 10))  # sds from 0.01 to 100: the diagonal metric must adapt


def ill_scaled_gaussian(x):
    return -0.5 * jnp.sum((x / ILL_SCALES) ** 2)


def standard_normal(x):
    return -0.5 * jnp.sum(x**2)


def initial_positions(seed, dim, scale=1.0):
    return scale * jax.random.normal(jax.random.key(seed), (NUM_CHAINS, dim))


# --------------------------------------------------------------------------- #
# Correctness: Gaussians
# --------------------------------------------------------------------------- #


def test_standard_normal_10d_and_the_pooled_tuner_shares_one_arm():
    samples, info = run_chains(jax.random.key(0), standard_normal, initial_positions(1, 10), 1000, 2000)
    info = time_major(info)  # run_chains: (chains, iterations)
    assert samples.shape == (NUM_CHAINS, 2000, 10)
    assert_moments_match(np.asarray(samples), np.zeros(10), np.ones(10))
    # Pooled (the default): every chain runs the same arm and sees the same reward at every iteration.
    for field in (info.step_size, info.num_steps, info.reward):
        values = np.asarray(field)
        np.testing.assert_array_equal(values, np.broadcast_to(values[:, :1], values.shape))
    assert len(np.unique(np.asarray(info.step_size))) > 1  # the values vary: the equality is not vacuous


def test_correlated_gaussian_2d():
    """The paper's 2-d Gaussian with correlation 0.99: the diagonal metric cannot whiten it."""
    covariance = jnp.array([[1.0, 0.99], [0.99, 1.0]])
    precision = jnp.linalg.inv(covariance)

    def logdensity(x):
        return -0.5 * x @ precision @ x

    samples, info = run_chains(jax.random.key(2), logdensity, initial_positions(3, 2), 1000, 2000,
                               metric_recipe="welford_diag")  # the default low-rank matrix would whiten it
    info = time_major(info)  # run_chains: (chains, iterations)
    assert_moments_match(np.asarray(samples), np.zeros(2), np.ones(2))
    # The tuner found long trajectories (the narrow direction forces a small step).
    sampling = ~np.asarray(info.is_warmup[:, 0])
    assert np.asarray(info.num_steps)[sampling].mean() > 5


@pytest.mark.parametrize("objective", ["normalized_esjd", pytest.param("esjd_moments", marks=pytest.mark.slow)])
def test_dense_mass_whitens_a_correlated_gaussian(objective):
    """dense_mass=True: the warm-up learns the full covariance, so a posterior with correlations up to
    0.99 and scales from 0.1 to 10 is sampled with a whitened-scale step size; draws agree with the truth."""
    from ahmc.adapters import _jax_run

    rng = np.random.default_rng(7)
    correlation = 0.99 ** np.abs(np.subtract.outer(np.arange(5), np.arange(5)))
    scales = np.logspace(-1, 1, 5)
    covariance = correlation * np.outer(scales, scales)
    mean = rng.normal(0, 3, 5)
    precision = jnp.asarray(np.linalg.inv(covariance))

    def logdensity(x):
        centred = x - mean
        return -0.5 * centred @ precision @ centred

    samples, info, state = _jax_run.sample(jax.random.key(60), logdensity, initial_positions(61, 5), 1000,
                                              2000, dense_mass=True, objective=objective)
    assert_moments_match(np.asarray(samples), mean, scales)
    learned = np.asarray(state.inverse_mass_matrix)
    assert learned.shape == (5, 5)
    # In the learned metric the true covariance is near the identity (a few hundred pooled draws).
    whitened = np.linalg.solve(np.linalg.cholesky(learned), np.linalg.cholesky(covariance))
    assert np.all(np.abs(np.linalg.eigvalsh(whitened @ whitened.T) - 1) < 0.5)
    # The diagonal metric needs eps ~ 0.1 here (sd of the narrow direction ~ sqrt(1 - 0.99)); whitened, ~1.
    sampling = ~np.asarray(info.is_warmup[:, 0])
    assert np.median(np.asarray(info.step_size)[sampling]) > 0.4


@pytest.mark.slow  # ~20 s; default run under 15 min (2026-11-28)
def test_dense_mass_with_more_dimensions_than_the_first_window_has_draws():
    """120 dimensions, 4 chains: the first mass-matrix window pools 100 draws, a singular estimate. Its
    missed directions must not freeze (with BlackJAX's shrinkage alone they did: the 16 x 16 LGCP had
    R-hat 1.5)."""
    scales = jnp.asarray(np.logspace(-1, 1, 120))

    def logdensity(x):
        return -0.5 * jnp.sum((x / scales) ** 2)

    samples, _ = run_chains(jax.random.key(62), logdensity, initial_positions(63, 120), 1000, 1000, dense_mass=True)
    assert_moments_match(np.asarray(samples), np.zeros(120), np.asarray(scales))


def test_dense_mass_checks_the_inverse_mass_matrix_shape():
    with pytest.raises(ValueError, match=r"\(3, 3\) matrix with dense_mass=True"):
        run_chains(jax.random.key(0), standard_normal, initial_positions(1, 3), 10, 10, dense_mass=True,
                   inverse_mass_matrix=jnp.ones(3))
    with pytest.raises(ValueError, match="needs dense_mass=True"):
        run_chains(jax.random.key(0), standard_normal, initial_positions(1, 3), 10, 10,
                   inverse_mass_matrix=jnp.eye(3), metric_recipe="welford_diag")
    with pytest.raises(ValueError, match="dense_mass must be True, False or 'auto'"):
        adaptive_hmc(standard_normal, dense_mass=[("x",)])
    # A given dense matrix is used as is (no adaptation) and reaches the sampling kernel.
    (state, parameters), _ = gpucb_adaptation(standard_normal, dense_mass=True, adapt_mass_matrix=False,
                                              inverse_mass_matrix=2 * jnp.eye(3)).run(
        jax.random.key(2), initial_positions(3, 3), 200)
    np.testing.assert_array_equal(np.asarray(parameters["inverse_mass_matrix"]), 2 * np.eye(3))
    kernel = uniform_steps_hmc(standard_normal, **parameters)
    new, _ = jax.vmap(kernel.step)(jax.random.split(jax.random.key(4), NUM_CHAINS), state)
    assert np.all(np.isfinite(np.asarray(new.position)))


@pytest.mark.slow  # ~26 s; PyMC's dense_mass='auto' test stays; default run under 15 min (2026-11-28)
def test_dense_mass_auto_keeps_the_dense_matrix_only_for_correlated_posteriors():
    """dense_mass="auto": a posterior with correlations 0.9^|i-j| keeps the dense estimate; independent
    coordinates of very different scales get its diagonal (held as a (d, d) matrix). Draws agree with the
    truth either way."""
    from ahmc.adapters import _jax_run

    dim = 5
    scales = np.logspace(-1, 1, dim)
    correlation = 0.9 ** np.abs(np.subtract.outer(np.arange(dim), np.arange(dim)))
    for name, covariance, seed in (("correlated", correlation * np.outer(scales, scales), 64),
                                   ("independent", np.diag(scales**2), 66)):
        precision = jnp.asarray(np.linalg.inv(covariance))
        samples, _, state = _jax_run.sample(jax.random.key(seed), lambda x, p=precision: -0.5 * x @ p @ x,
                                               initial_positions(seed + 1, dim), 1000, 1000, dense_mass="auto")
        assert_moments_match(np.asarray(samples), np.zeros(dim), scales)
        learned = np.asarray(state.inverse_mass_matrix)
        assert learned.shape == (dim, dim), name
        off_diagonal = np.abs(learned[~np.eye(dim, dtype=bool)]).max() / np.diag(learned).max()
        if name == "correlated":
            assert off_diagonal > 0.1  # the estimate's correlations are kept
            np.testing.assert_allclose(learned, covariance, rtol=0.5, atol=0.15 * scales.max() ** 2)
        else:
            assert off_diagonal == 0.0
            np.testing.assert_allclose(np.diag(learned), scales**2, rtol=0.3)


def test_dense_mass_auto_shapes():
    """Above DENSE_AUTO_MAX_DIM "auto" is diagonal from the start; a given matrix's shape decides."""
    from ahmc.adapters import _jax_engine
    from ahmc.core.mass_matrix import DENSE_AUTO_MAX_DIM

    engine = _jax_engine.build_engine(standard_normal, num_warmup=100, dense_mass="auto")
    big = engine.init(initial_positions(1, DENSE_AUTO_MAX_DIM + 1))
    assert big.inverse_mass_matrix.shape == (DENSE_AUTO_MAX_DIM + 1,) and big.whitening is None
    small = engine.init(initial_positions(1, 3))
    assert small.inverse_mass_matrix.shape == (3, 3) and small.whitening.shape == (3, 3)
    for matrix in (jnp.ones(3), jnp.eye(3)):
        given = _jax_engine.build_engine(standard_normal, num_warmup=100, dense_mass="auto",
                                         inverse_mass_matrix=matrix).init(initial_positions(1, 3))
        assert given.inverse_mass_matrix.shape == matrix.shape
    with pytest.raises(ValueError, match=r"\(3,\) or \(3, 3\) with dense_mass='auto'"):
        _jax_engine.build_engine(standard_normal, num_warmup=100, dense_mass="auto",
                                 inverse_mass_matrix=jnp.ones(4)).init(initial_positions(1, 3))
    with pytest.raises(ValueError, match="dense_mass must be True, False or 'auto'"):
        adaptive_hmc(standard_normal, dense_mass="yes")


def test_ill_scaled_diagonal_gaussian():
    """Scales from 0.01 to 100: the warm-up mass matrix makes AHMC scale-free."""
    scales, logdensity = ILL_SCALES, ill_scaled_gaussian
    samples, info = run_chains(jax.random.key(4), logdensity, initial_positions(5, 10), 1000, 2000)
    info = time_major(info)  # run_chains: (chains, iterations)
    assert_moments_match(np.asarray(samples), np.zeros(10), np.asarray(scales))


def test_shared_num_steps_samples_the_target():
    """The default (shared_num_steps=True): one L_t for all chains each iteration, uniform on {1..L}; exact."""
    scales, logdensity = ILL_SCALES, ill_scaled_gaussian
    samples, info = run_chains(jax.random.key(40), logdensity, initial_positions(41, 10), 1000, 2000)
    info = time_major(info)  # run_chains: (chains, iterations)
    assert_moments_match(np.asarray(samples), np.zeros(10), np.asarray(scales))
    taken, arm = np.asarray(info.num_integration_steps), np.asarray(info.num_steps)
    np.testing.assert_array_equal(taken, np.broadcast_to(taken[:, :1], taken.shape))  # common to the chains
    assert np.all((taken >= 1) & (taken <= arm))
    sampling = ~np.asarray(info.is_warmup[:, 0])
    # L_t ~ U{1..L}: its mean over the sampling phase is (L + 1) / 2 (sd of the mean < 2% here).
    assert abs(taken[sampling, 0].mean() / ((arm[sampling, 0] + 1) / 2).mean() - 1) < 0.1


def test_an_initial_design_samples_the_target():
    """initial_design=3 moves the warm-up's first GP arms only: the draws still agree with the truth."""
    samples, info = run_chains(jax.random.key(46), ill_scaled_gaussian, initial_positions(47, 10), 1000, 2000,
                               initial_design=3)
    assert_moments_match(np.asarray(samples), np.zeros(10), np.asarray(ILL_SCALES))


def test_independent_num_steps_samples_the_target():
    """shared_num_steps=False (the paper's setting): each chain draws its own L_t from {1..L}; exact."""
    scales, logdensity = ILL_SCALES, ill_scaled_gaussian
    samples, info = run_chains(jax.random.key(44), logdensity, initial_positions(45, 10), 1000, 2000,
                               shared_num_steps=False)
    info = time_major(info)  # run_chains: (chains, iterations)
    assert_moments_match(np.asarray(samples), np.zeros(10), np.asarray(scales))
    taken, arm = np.asarray(info.num_integration_steps), np.asarray(info.num_steps)
    assert np.all((taken >= 1) & (taken <= arm))
    sampling = ~np.asarray(info.is_warmup[:, 0])
    differs = (taken != taken[:, :1]).any(axis=1)
    # With L > 1 four independent draws from {1..L} all agree with probability <= 1/8.
    assert differs[sampling & (arm[:, 0] > 1)].mean() > 0.5

@pytest.mark.slow  # the same engine at f = 0.5: test_numpyro.py::test_upper_half_jitter_agrees_with_the_truth
def test_upper_half_jitter_samples_the_target_and_stays_in_range():
    """min_steps_fraction=0.5: L_t ~ U{ceil(L/2)..L} in warm-up and sampling; means and variances exact."""
    scales, logdensity = ILL_SCALES, ill_scaled_gaussian
    samples, info = run_chains(jax.random.key(42), logdensity, initial_positions(43, 10), 1000, 2000,
                               min_steps_fraction=0.5)
    info = time_major(info)  # run_chains: (chains, iterations)
    assert_moments_match(np.asarray(samples), np.zeros(10), np.asarray(scales))
    taken, arm = np.asarray(info.num_integration_steps), np.asarray(info.num_steps)
    lowest = np.ceil(arm / 2)
    assert np.all((taken >= lowest) & (taken <= arm))
    assert np.any(taken == lowest) and np.any((taken == arm) & (arm > 1))  # both ends drawn: a jitter, not fixed L
    # Its mean is (ceil(L/2) + L) / 2 (the paper's jitter would give (1 + L) / 2).
    assert abs(taken.mean() / ((lowest + arm) / 2).mean() - 1) < 0.05


def test_min_steps_fraction_reaches_the_sampling_kernel_and_is_checked():
    positions = initial_positions(44, 3)
    warmup = gpucb_adaptation(standard_normal, min_steps_fraction=1.0)  # fixed L: every L_t = L
    (state, parameters), info = warmup.run(jax.random.key(45), positions, 300)
    assert parameters["min_steps_fraction"] == 1.0
    np.testing.assert_array_equal(np.asarray(info.info.num_integration_steps), np.asarray(info.info.num_steps))
    kernel = uniform_steps_hmc(standard_normal, **parameters)
    _, step_info = jax.vmap(kernel.step)(jax.random.split(jax.random.key(46), NUM_CHAINS), state)
    np.testing.assert_array_equal(np.asarray(step_info.num_integration_steps),
                                  int(parameters["num_integration_steps"]))
    with pytest.raises(ValueError, match="min_steps_fraction"):
        adaptive_hmc(standard_normal, min_steps_fraction=2.0)
    with pytest.raises(ValueError, match="min_steps_fraction"):
        uniform_steps_hmc(standard_normal, 0.1, jnp.ones(3), 5, min_steps_fraction=-1)


# ~17-21 s; NumPyro's test_esjd_moments_objective_reaches_the_engine keeps the objective in the default run.
@pytest.mark.slow
def test_esjd_moments_measures_squares_about_the_window_mean_and_samples_the_target():
    """objective="esjd_moments": the squares are centred on the last mass-matrix window's mean (near the
    true mean after warm-up), every round's reward is finite, and the draws agree with the target."""
    from ahmc.adapters import _jax_run

    means, scales = jnp.linspace(-20.0, 20.0, 6), jnp.asarray(np.logspace(-1, 1, 6))

    def logdensity(x):
        return -0.5 * jnp.sum(((x - means) / scales) ** 2)

    samples, info, state = _jax_run.sample(jax.random.key(47), logdensity, initial_positions(48, 6), 1000,
                                              2000, objective="esjd_moments")
    assert_moments_match(np.asarray(samples), np.asarray(means), np.asarray(scales))
    # The window mean is an estimate from a few hundred pooled draws: within a few sd of the truth.
    assert np.all(np.abs(np.asarray(state.center) - np.asarray(means)) < 0.5 * np.asarray(scales))
    rewards = np.asarray(info.reward)[np.asarray(info.round) > 0]
    ended = ~np.isnan(rewards)
    assert ended.sum() > 100 and np.all(rewards[ended] > 0)
    with pytest.raises(ValueError, match="needs adapt_mass_matrix=True"):
        adaptive_hmc(logdensity, objective="esjd_moments", adapt_mass_matrix=False)
    with pytest.raises(ValueError, match="needs a metric phase"):
        adaptive_hmc(logdensity, objective="esjd_moments", step_size_bounds=(0.1, 1.0), num_steps_bounds=(1, 10),
                     metric_fraction=0.0)


# --------------------------------------------------------------------------- #
# Correctness: posteriordb references
# --------------------------------------------------------------------------- #


def eight_schools_noncentered():
    data = load_reference("eight_schools-eight_schools_noncentered")["data"]
    y, sigma = jnp.asarray(data["y"], jnp.float32), jnp.asarray(data["sigma"], jnp.float32)

    def logdensity(params):
        tau = jnp.exp(params["log_tau"])
        theta = params["mu"] + tau * params["theta_trans"]
        log_prior = (
            -0.5 * jnp.sum(params["theta_trans"] ** 2)
            - 0.5 * (params["mu"] / 5.0) ** 2
            - jnp.log1p((tau / 5.0) ** 2)  # half-Cauchy(0, 5)
            + params["log_tau"]  # Jacobian of tau = exp(log_tau)
        )
        return log_prior - 0.5 * jnp.sum(((y - theta) / sigma) ** 2)

    return logdensity


@pytest.mark.slow  # ~23 s; the engine's eight schools stays in test_pymc_jax.py; default run under 15 min (2026-11-29)
def test_eight_schools_noncentered_reference():
    key = jax.random.key(6)
    positions = {
        "mu": jax.random.normal(key, (NUM_CHAINS,)),
        "log_tau": jax.random.normal(jax.random.fold_in(key, 1), (NUM_CHAINS,)),
        "theta_trans": jax.random.normal(jax.random.fold_in(key, 2), (NUM_CHAINS, 8)),
    }
    samples, info = run_chains(jax.random.key(7), eight_schools_noncentered(), positions, 1000, 2000)
    info = time_major(info)  # run_chains: (chains, iterations)
    tau = np.exp(np.asarray(samples["log_tau"]))
    mu = np.asarray(samples["mu"])
    draws = {"mu": mu, "tau": tau, "theta": mu[..., None] + tau[..., None] * np.asarray(samples["theta_trans"])}
    assert_reference_match(draws, "eight_schools-eight_schools_noncentered")


@pytest.mark.slow  # ~20 s; PyMC's sblrc test stays; default run under 15 min (2026-11-29)
def test_sblrc_blr_reference():
    """Linear regression with predictors of scale ~100: posterior sds differ by 10^4."""
    data = load_reference("sblrc-blr")["data"]
    x, y = jnp.asarray(data["X"], jnp.float32), jnp.asarray(data["y"], jnp.float32)

    def logdensity(params):
        sigma = jnp.exp(params["log_sigma"])
        residual = (y - x @ params["beta"]) / sigma
        return (
            -0.5 * jnp.sum((params["beta"] / 10.0) ** 2)
            - 0.5 * (sigma / 10.0) ** 2
            + params["log_sigma"]  # Jacobian
            - 0.5 * jnp.sum(residual**2)
            - y.shape[0] * params["log_sigma"]
        )

    key = jax.random.key(8)
    positions = {
        "beta": 1.0 + 0.01 * jax.random.normal(key, (NUM_CHAINS, 5)),
        "log_sigma": 0.1 * jax.random.normal(jax.random.fold_in(key, 1), (NUM_CHAINS,)),
    }
    samples, info = run_chains(jax.random.key(9), logdensity, positions, 1000, 1000)
    info = time_major(info)  # run_chains: (chains, iterations)
    draws = {"beta": np.asarray(samples["beta"], np.float64), "sigma": np.exp(np.asarray(samples["log_sigma"], np.float64))}
    assert_reference_match(draws, "sblrc-blr")


# --------------------------------------------------------------------------- #
# The BlackJAX API
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def warmed_up():
    warmup = gpucb_adaptation(standard_normal)
    (state, parameters), info = warmup.run(jax.random.key(10), initial_positions(11, 5), 600)
    return state, parameters, info


def test_adaptation_returns_blackjax_results(warmed_up):
    state, parameters, info = warmed_up
    assert set(parameters) == {"step_size", "inverse_mass_matrix", "num_integration_steps", "min_steps_fraction"}
    assert parameters["min_steps_fraction"] == 0.0  # the paper's U{1..L}
    assert state.position.shape == (NUM_CHAINS, 5)
    assert info.info.step_size.shape == (600, NUM_CHAINS)
    lo, hi = np.asarray(info.search_box.step_size)
    assert 0 < lo <= float(parameters["step_size"]) <= hi
    l_lo, l_hi = np.asarray(info.search_box.num_steps)
    assert l_lo <= int(parameters["num_integration_steps"]) <= l_hi
    imm = np.asarray(parameters["inverse_mass_matrix"])  # the default low-rank estimate, as a (d, d) matrix
    assert imm.shape == (5, 5)
    np.testing.assert_allclose(imm, np.eye(5), atol=0.5)
    # Rewards only at round ends, each round m = 10 iterations, all in the GP phase.
    reward = np.asarray(info.info.reward[:, 0])
    ends = np.flatnonzero(np.isfinite(reward))
    assert len(ends) == 30 and np.all(np.diff(ends) == 10)
    assert np.all(np.asarray(info.info.adapt_probability) == 1.0)  # p_i = 1 throughout warm-up
    assert np.asarray(info.info.arm_changed).any()
    assert int(info.tuner_state.round) == 30


def test_automatic_box_reaches_long_trajectories():
    """Correlation 0.9999 under a diagonal metric forces eps* ~ 0.01: the automatic box still offers
    L up to ceil(4 pi / eps*) (beyond the former cap of 256; NUTS's default allows 1023), while the
    metric phase's L stays within WARMUP_MAX_STEPS."""
    precision = jnp.linalg.inv(jnp.array([[1.0, 0.9999], [0.9999, 1.0]]))

    def logdensity(x):
        return -0.5 * x @ precision @ x

    _, info = gpucb_adaptation(logdensity, metric_recipe="welford_diag").run(
        jax.random.key(12), initial_positions(13, 2), 300)
    eps_lo, _ = np.asarray(info.search_box.step_size)
    eps_star = 2 * eps_lo  # the box is eps* x (0.5, 2)
    _, l_hi = np.asarray(info.search_box.num_steps)
    assert l_hi == min(math.ceil(4 * math.pi / eps_star), NUM_STEPS_CAP) and l_hi > 256
    metric_phase = np.asarray(info.info.num_steps)[:150]
    assert metric_phase.max() <= WARMUP_MAX_STEPS
    # the GP's arms are the box's log-spaced columns of L (1, 2, 3, ... as well as the longest)
    columns = set(grid_num_steps(np.linspace(0.0, 1.0, 32), 1, int(l_hi), log=True).tolist())
    assert set(np.unique(np.asarray(info.info.num_steps)[150:]).tolist()) <= columns and {1, 2, 3} <= columns


def test_num_steps_bounds_alone_keeps_the_automatic_step_size_box():
    """A user L range with the automatic step sizes: every GP arm's L in (2, 6), the step sizes
    spread over eps* x (0.5, 2) around the warm-up's step size (a target of scale 0.1 without a
    mass matrix puts eps* near 0.1, far from any fixed box), and the draws still match the target.
    A step-size box alone is an error that names the missing argument."""
    scale = 0.1

    def logdensity(x):
        return -0.5 * jnp.sum((x / scale) ** 2)

    samples, info = run_chains(jax.random.key(31), logdensity, initial_positions(32, 3, scale), 1000, 2000,
                               num_steps_bounds=(2, 6), adapt_mass_matrix=False)
    info = time_major(info)  # run_chains: (chains, iterations)
    rounds = np.asarray(info.round)
    arm_steps, step_sizes = np.asarray(info.num_steps)[rounds > 0], np.asarray(info.step_size)[rounds > 0]
    assert arm_steps.min() == 2 and arm_steps.max() <= 6 and len(np.unique(arm_steps)) >= 3
    eps_star = np.sqrt(step_sizes.min() * step_sizes.max())  # the log grid's middle, if both edges were tried
    assert 0.03 < step_sizes.min() < step_sizes.max() < 0.5 and step_sizes.max() / step_sizes.min() <= 4 + 1e-6
    assert 0.03 < eps_star < 0.3
    assert_moments_match(np.asarray(samples), np.zeros(3), np.full(3, scale))
    with pytest.raises(ValueError, match="step_size_bounds needs num_steps_bounds"):
        run_chains(jax.random.key(31), logdensity, initial_positions(32, 3, scale), 100, 10,
                   step_size_bounds=(0.05, 0.2))


def test_parameters_work_in_plain_blackjax_loop(warmed_up):
    state, parameters, _ = warmed_up
    kernel = uniform_steps_hmc(standard_normal, **parameters)
    step = jax.jit(jax.vmap(kernel.step))

    def one_step(state, key):
        state, info = step(jax.random.split(key, NUM_CHAINS), state)
        return state, (state.position, info.num_integration_steps)

    _, (draws, num_steps) = jax.lax.scan(one_step, state, jax.random.split(jax.random.key(12), 1000))
    num_steps = np.asarray(num_steps)
    assert num_steps.min() >= 1 and num_steps.max() <= int(parameters["num_integration_steps"])
    assert_moments_match(np.swapaxes(np.asarray(draws), 0, 1), np.zeros(5), np.ones(5))


@pytest.mark.slow  # the same engine is checked by test_numpyro.py::test_same_key_same_draws_different_key_different_draws_and_continuation
def test_same_key_same_draws():
    positions = initial_positions(13, 3)
    first, info = run_chains(jax.random.key(14), standard_normal, positions, 200, 100)
    info = time_major(info)  # run_chains: (chains, iterations)
    again, _ = run_chains(jax.random.key(14), standard_normal, positions, 200, 100)
    other, _ = run_chains(jax.random.key(15), standard_normal, positions, 200, 100)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
    assert not np.array_equal(np.asarray(first), np.asarray(other))


def test_independent_tuners_run_and_differ():
    samples, info = run_chains(
        jax.random.key(16), standard_normal, initial_positions(17, 5), 1000, 2000, pooled=False
    )
    info = time_major(info)  # run_chains: (chains, iterations)
    step_sizes = np.asarray(info.step_size)[-1]
    assert len(set(step_sizes.tolist())) > 1  # each chain has its own arm
    rewards = np.asarray(info.reward)
    ends = np.isfinite(rewards[:, 0])
    assert not np.allclose(rewards[ends, 0], rewards[ends, 1])  # one reward per chain
    assert_moments_match(np.asarray(samples), np.zeros(5), np.ones(5))


def test_adaptation_runs_under_jit():
    run = jax.jit(gpucb_adaptation(standard_normal).run, static_argnums=2)
    (state, parameters), info = run(jax.random.key(31), initial_positions(32, 3), 300)
    assert np.isfinite(float(parameters["step_size"])) and int(parameters["num_integration_steps"]) >= 1
    assert state.position.shape == (NUM_CHAINS, 3)


def test_adaptive_hmc_continues_the_warmup_and_freezes():
    options = {"freeze_after": "warmup"}
    warmup = gpucb_adaptation(standard_normal, **options)
    _, warm_info = warmup.run(jax.random.key(20), initial_positions(21, 5), 400)
    sampler = pooled_adaptive_hmc(standard_normal, NUM_CHAINS, num_warmup=400, **options)
    step = jax.jit(sampler.step)
    state = warm_info.adaptation_state
    arms = []
    for key in jax.random.split(jax.random.key(22), 300):
        state, info = step(key, state)
        arms.append((float(info.step_size[0]), int(info.num_steps[0])))
        assert not bool(info.is_warmup[0])
    assert len(set(arms)) == 1  # frozen after warm-up
    assert int(state.tuner.round) == 20 + 30  # rewards still recorded (GP keeps learning)


@pytest.mark.slow  # ~20 s; the schedule: tests/core, PyMC's stats tests; default run under 15 min (2026-11-29)
def test_infinite_adaptation_probability_decays():
    _, info = run_chains(jax.random.key(23), standard_normal, initial_positions(24, 3), 400, 2000)
    info = time_major(info)  # run_chains: (chains, iterations)
    p = np.asarray(info.adapt_probability[:, 0])
    warm = np.asarray(info.is_warmup[:, 0])
    assert np.all(p[warm] == 1.0)
    k = 20  # GP rounds in warm-up: (400 - 200) / 10
    rounds_after = 200
    np.testing.assert_allclose(p[-1], (k + rounds_after - k + 1) ** -0.5, rtol=1e-5)


def test_paper_preset():
    """Identity metric, user box, GP from the first round, k = 100, linear eps grid."""
    _, info = run_chains(
        jax.random.key(25), standard_normal, initial_positions(26, 5), 500, 100,
        paper_preset=True, step_size_bounds=(0.05, 1.5), num_steps_bounds=(1, 20),
    )
    info = time_major(info)  # run_chains: (chains, iterations)
    rounds = np.asarray(info.round[:, 0])
    assert rounds[0] == 1 and rounds[9] == 1 and rounds[10] == 2
    assert np.all(np.asarray(info.adapt_probability) == 1.0)  # 60 rounds < k = 100
    eps = np.asarray(info.step_size[:, 0])
    assert eps.min() >= 0.05 - 1e-6 and eps.max() <= 1.5 + 1e-6
    assert len(np.unique(eps)) > 3
    taken = np.asarray(info.num_integration_steps)
    assert np.any(taken != taken[:, :1])  # the published jitter: each chain draws its own L_t


def test_nonfinite_initial_logdensity_raises():
    def logdensity(x):
        return jnp.sum(jnp.log(x))  # NaN for x < 0

    positions = jnp.abs(initial_positions(27, 3)).at[2, 0].set(-1.0)
    with pytest.raises(ValueError, match=r"not finite at the initial position of chain\(s\) \[2\]"):
        gpucb_adaptation(logdensity).run(jax.random.key(28), positions, 100)
    with pytest.raises(ValueError, match="leading chain axis"):
        pooled_adaptive_hmc(standard_normal, NUM_CHAINS).init(jnp.zeros(()))


def test_divergences_are_counted_not_fatal():
    """Step sizes beyond the stability limit (eps > 2 on a unit Gaussian) diverge."""
    samples, info = run_chains(
        jax.random.key(29), standard_normal, initial_positions(30, 10), 200, 200,
        paper_preset=True, step_size_bounds=(1.0, 4.0), num_steps_bounds=(5, 10),
    )
    info = time_major(info)  # run_chains: (chains, iterations)
    assert int(np.asarray(info.is_divergent).sum()) > 0
    assert np.isfinite(np.asarray(samples)).all()
    assert np.isfinite(np.asarray(info.reward)[np.isfinite(np.asarray(info.reward))]).all()


def test_divergence_penalty_lowers_the_reward_of_rounds_with_divergences():
    """First round (same arm and keys in both runs): reward = paper reward x exp(-10 x divergent fraction)."""
    runs = {}
    for penalty in (0.0, 10.0):
        _, runs[penalty] = run_chains(
            jax.random.key(29), standard_normal, initial_positions(30, 10), 40, 0, pooled=False,
            paper_preset=True, step_size_bounds=(2.2, 2.6), num_steps_bounds=(5, 10), divergence_penalty=penalty,
        )
        runs[penalty] = time_major(runs[penalty])  # run_chains: (chains, iterations)
    divergent = np.asarray(runs[0.0].is_divergent[:10])
    assert 0 < divergent.sum() < divergent.size  # some chains diverged in the round, not all transitions
    np.testing.assert_array_equal(divergent, np.asarray(runs[10.0].is_divergent[:10]))
    paper, penalized = np.asarray(runs[0.0].reward[9]), np.asarray(runs[10.0].reward[9])
    np.testing.assert_allclose(penalized, paper * np.exp(-10.0 * divergent.mean(axis=0)), rtol=1e-5)
    with pytest.raises(ValueError, match="divergence_penalty"):
        adaptive_hmc(standard_normal, divergence_penalty=-1.0)


def test_bad_options_raise_before_tracing():
    with pytest.raises(ValueError, match="step_size_bounds needs num_steps_bounds"):
        adaptive_hmc(standard_normal, step_size_bounds=(0.1, 1.0))
    with pytest.raises(ValueError, match="needs step_size_bounds"):
        adaptive_hmc(standard_normal, paper_preset=True)
    with pytest.raises(ValueError, match="metric"):
        adaptive_hmc(standard_normal, num_warmup=0)


@pytest.mark.slow  # devices: test_numpyro.py::test_parallel_chain_method_agrees_with_the_truth runs in the default suite
def test_multi_device_sharded_chains():
    """Chains sharded over two simulated host devices (the flag must precede the jax import)."""
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from ahmc.adapters.blackjax import run_chains
        assert len(jax.devices()) == 2, jax.devices()
        mesh = Mesh(np.array(jax.devices()), ("chains",))
        positions = jax.device_put(jax.random.normal(jax.random.key(0), (4, 3)), NamedSharding(mesh, P("chains")))
        logdensity = lambda x: -0.5 * jnp.sum(x**2)
        samples, info = run_chains(jax.random.key(1), logdensity, positions, 300, 500)
        print(samples.sharding.device_set == set(jax.devices()), samples.shape)
        # Same algorithm as unsharded; reductions may associate differently, so only
        # the first iterations agree to rounding before the chains drift apart.
        _, reference = run_chains(jax.random.key(1), logdensity, np.asarray(positions), 300, 500)
        np.testing.assert_allclose(np.asarray(info.logdensity[:, :10]), np.asarray(reference.logdensity[:, :10]),
                                   rtol=1e-3)
        draws = np.asarray(samples).reshape(-1, 3)
        assert np.all(np.abs(draws.mean(0)) < 0.3) and np.all(np.abs(draws.var(0) - 1) < 0.4), draws.var(0)
        """
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "True (4, 500, 3)" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
def test_gaussians_over_seeds(seed):
    """Guard against seed hacking: the Gaussian checks over 10 seeds (run with -m slow)."""
    scales = jnp.asarray(np.logspace(-2, 2, 10))
    samples, _ = run_chains(jax.random.key(1000 + seed), standard_normal, initial_positions(seed, 10), 1000, 2000)
    assert_moments_match(np.asarray(samples), np.zeros(10), np.ones(10))
    samples, _ = run_chains(
        jax.random.key(2000 + seed), lambda x: -0.5 * jnp.sum((x / scales) ** 2), initial_positions(seed, 10), 1000, 2000
    )
    assert_moments_match(np.asarray(samples), np.zeros(10), np.asarray(scales))


def test_a_non_finite_reward_warns_and_the_run_goes_on():
    """A user reward that is NaN on long arms (finite on the typical round get_objective checks):
    one warning naming the objective, NaN rewards recorded, every draw finite. (Every other test
    checks that a finite reward never warns: pyproject.toml turns the warning into an error.)"""
    from ahmc.core.objectives import normalized_esjd

    def nan_on_long_arms(stats, max_num_steps):
        return jnp.where(max_num_steps > 8, jnp.nan, normalized_esjd(stats, max_num_steps))

    options = dict(step_size_bounds=(0.3, 0.6), num_steps_bounds=(1, 20))
    with pytest.warns(UserWarning, match="reward was not finite.*check the objective"):
        samples, info = run_chains(jax.random.key(5), standard_normal, initial_positions(6, 3), 200, 100,
                                   objective=nan_on_long_arms, **options)
        info = time_major(info)  # run_chains: (chains, iterations)
    rewards, arm_l, rounds = (np.asarray(x)[:, 0] for x in (info.reward, info.num_steps, info.round))
    ends = np.flatnonzero((rounds[:-1] > 0) & (rounds[1:] > rounds[:-1]))  # the last iteration of each GP round
    long_arm = arm_l[ends] > 8
    assert long_arm.any() and (~long_arm).any()
    assert np.isnan(rewards[ends][long_arm]).all() and np.isfinite(rewards[ends][~long_arm]).all()
    assert np.all(np.isfinite(np.asarray(samples)))


# --------------------------------------------------------------------------- #
# jump_estimate="trajectory": the reward's jump from every leapfrog step
# --------------------------------------------------------------------------- #


def test_trajectory_proposal_makes_blackjaxs_transition_and_reports_each_step():
    """Same key: BlackJAX's endpoint transition; per step l, min(1, exp(-energy error)) x the squared jump
    from the start in units of the metric's standard deviations added to the given sums, 1 to the
    given counts; the steps not taken leave both as they were."""
    import blackjax.mcmc.hmc as hmc
    import blackjax.mcmc.integrators as integrators
    import blackjax.mcmc.metrics as metrics

    from ahmc.adapters._jax_kernel import trajectory_proposal

    variances = jnp.asarray([1.0, 0.5, 2.0, 1.0, 4.0, 1.0])  # not the target's: acceptance < 1
    start = hmc.init(jnp.asarray([0.5, -3.0, 0.02, 1.0, -0.4, 0.3]), standard_normal)
    key, step_size, num_steps = jax.random.key(3), 0.9, 3
    plain, plain_info = hmc.build_kernel()(key, start, standard_normal, step_size, variances, num_steps)
    sums_before, counts_before = jnp.asarray([0.5, 0.0, 2.0, 1.0, 3.0]), jnp.asarray([1, 0, 2, 2, 7])
    kernel = hmc.build_kernel(build_proposal=trajectory_proposal(lambda dx: dx / jnp.sqrt(variances),
                                                                 sums_before, counts_before))
    new, info = kernel(key, start, standard_normal, step_size, variances, num_steps)
    np.testing.assert_allclose(np.asarray(new.position), np.asarray(plain.position), rtol=1e-6)
    assert float(info.acceptance_rate) == pytest.approx(float(plain_info.acceptance_rate), rel=1e-6)
    assert bool(info.is_accepted) == bool(plain_info.is_accepted)

    metric = metrics.default_metric(variances)
    step = integrators.velocity_verlet(standard_normal, metric.kinetic_energy)
    state = integrators.IntegratorState(start.position, info.momentum, start.logdensity, start.logdensity_grad)

    def energy(s):
        return -float(s.logdensity) + float(metric.kinetic_energy(s.momentum))

    expected, accepts, moved = [], [], state
    for _ in range(num_steps):
        moved = step(moved, step_size)
        accepts.append(min(1.0, math.exp(-(energy(moved) - energy(state)))))
        jump = np.sum((np.asarray(moved.position) - np.asarray(start.position)) ** 2 / np.asarray(variances))
        expected.append(accepts[-1] * jump)
    values = np.asarray(info.step_sums) - np.asarray(sums_before)
    np.testing.assert_allclose(values[:num_steps], expected, rtol=1e-4)  # float32
    np.testing.assert_array_equal(values[num_steps:], 0.0)
    np.testing.assert_array_equal(np.asarray(info.step_counts) - np.asarray(counts_before), [1, 1, 1, 0, 0])
    assert min(expected) > 0 and min(accepts) < 0.99  # the weights matter here


def test_trajectory_jump_estimate_is_the_cores():
    from ahmc.adapters._jax_rounds import trajectory_jump_estimate
    from ahmc.core.objectives import StepJumps, step_jumps_estimate

    rng = np.random.default_rng(4)
    sums, counts = rng.exponential(size=7), np.array([9, 7, 4, 4, 1, 0, 0])
    sums[counts == 0] = 0.0
    for lowest in (1, 3, 5, 6):
        core = step_jumps_estimate(StepJumps(tuple(sums), tuple(counts)), lowest)
        ours = float(trajectory_jump_estimate(jnp.asarray(sums), jnp.asarray(counts), lowest))
        if lowest == 6:
            assert math.isnan(core) and math.isnan(ours)
        else:
            assert ours == pytest.approx(core, rel=1e-6)


@pytest.mark.parametrize("num_bins, max_steps, min_steps", [(7, 5, 1), (7, 5, 3), (7, 7, 1), (64, 1024, 1),
                                                            (64, 100, 1), (64, 100, 37), (8, 13, 4), (16, 17, 17)])
def test_step_bins_cover_every_length_once(num_bins, max_steps, min_steps):
    """Each length ``min_steps..L`` lies in exactly one bin, the bin :func:`step_bin` puts its step in;
    while ``L`` fits the vector the bins are the lengths themselves."""
    from ahmc.adapters._jax_kernel import step_bin, step_bin_widths

    steps = np.arange(min_steps - 1, max_steps)
    bins = np.asarray([int(step_bin(jnp.asarray(i), jnp.asarray(max_steps), num_bins)) for i in steps])
    assert bins.min() >= 0 and bins.max() < num_bins
    widths = np.asarray(step_bin_widths(num_bins, jnp.asarray(max_steps), jnp.asarray(min_steps)))
    np.testing.assert_array_equal(widths, np.bincount(bins, minlength=num_bins))
    if max_steps <= num_bins:
        np.testing.assert_array_equal(bins, steps)
    else:  # adjacent lengths in each bin, the bins as even as integers allow (the ends may be cut by min_steps)
        assert np.all(np.diff(bins) >= 0)
        inner = widths[widths > 0][1:-1]
        assert inner.size == 0 or np.ptp(inner) <= 1


def test_binned_jump_estimate_is_the_per_length_one_when_lengths_are_reached_alike():
    """Binned sums of a round in which every length was reached equally often give the per-length
    estimate exactly (each bin's mean is then its lengths' mean, weighted by its width); with the
    long lengths reached less often the two differ by little."""
    from ahmc.adapters._jax_kernel import step_bin
    from ahmc.adapters._jax_rounds import trajectory_jump_estimate

    rng = np.random.default_rng(8)
    max_steps, num_bins = 150, 64
    for lowest in (1, 40):
        values = rng.exponential(size=max_steps) * np.linspace(1.0, 3.0, max_steps)
        for counts in (np.full(max_steps, 5), np.arange(max_steps, 0, -1)):
            sums = values * counts
            exact = float(trajectory_jump_estimate(jnp.asarray(sums), jnp.asarray(counts), lowest))
            bins = np.asarray(step_bin(jnp.arange(max_steps), max_steps, num_bins))
            keep = np.arange(1, max_steps + 1) >= lowest  # the proposal adds no step below the lowest
            binned_sums = np.bincount(bins[keep], weights=sums[keep], minlength=num_bins)
            binned_counts = np.bincount(bins[keep], weights=counts[keep], minlength=num_bins).astype(np.int32)
            binned = float(trajectory_jump_estimate(jnp.asarray(binned_sums), jnp.asarray(binned_counts), lowest,
                                                    jnp.asarray(max_steps)))
            if counts[0] == counts[-1]:
                assert binned == pytest.approx(exact, rel=1e-6)  # float32
            else:
                assert binned == pytest.approx(exact, rel=0.02)
        short = float(trajectory_jump_estimate(jnp.asarray(values[:num_bins]), jnp.ones(num_bins, jnp.int32), lowest,
                                               jnp.asarray(num_bins)))
        assert short == pytest.approx(np.mean(values[lowest - 1:num_bins]), rel=1e-6)


def test_trajectory_proposal_bins_the_steps_of_a_long_arm():
    """With an arm longer than the vectors each step's value goes to its bin, and the steps below
    the lowest length of the arm's jitter to none."""
    import blackjax.mcmc.hmc as hmc

    from ahmc.adapters._jax_kernel import step_bin, trajectory_proposal

    start = hmc.init(jnp.asarray([0.5, -1.0, 0.2]), standard_normal)
    key, step_size, num_steps, max_steps, num_bins = jax.random.key(2), 0.3, 9, 12, 4
    per_length = hmc.build_kernel(build_proposal=trajectory_proposal(
        lambda dx: dx, jnp.zeros(max_steps), jnp.zeros(max_steps, jnp.int32)))
    _, exact = per_length(key, start, standard_normal, step_size, jnp.ones(3), num_steps)
    binned_kernel = hmc.build_kernel(build_proposal=trajectory_proposal(
        lambda dx: dx, jnp.zeros(num_bins), jnp.zeros(num_bins, jnp.int32), jnp.asarray(max_steps), 3))
    _, binned = binned_kernel(key, start, standard_normal, step_size, jnp.ones(3), num_steps)
    values, taken = np.asarray(exact.step_sums), np.array(exact.step_counts)
    taken[:2] = 0  # lengths 1 and 2 lie below the lowest, 3
    bins = np.asarray(step_bin(jnp.arange(max_steps), max_steps, num_bins))
    expected_sums = np.bincount(bins, weights=values * taken, minlength=num_bins)
    np.testing.assert_allclose(np.asarray(binned.step_sums), expected_sums, rtol=1e-5)
    expected_counts = np.bincount(bins, weights=taken, minlength=num_bins)
    np.testing.assert_array_equal(np.asarray(binned.step_counts), expected_counts)
    assert np.asarray(binned.step_counts).tolist() == [1, 3, 3, 0]


def test_jump_estimates_make_the_same_first_round_with_different_rewards():
    """The arm has not moved in the first round, so both estimates draw the same chains; the rewards
    differ (the trajectory estimate is not the made jumps)."""
    runs = {estimate: run_chains(jax.random.key(5), ill_scaled_gaussian, initial_positions(6, 10), 0, 10,
                                 paper_preset=True, step_size_bounds=(0.004, 0.006), num_steps_bounds=(2, 8),
                                 jump_estimate=estimate)
            for estimate in ("transition", "trajectory")}
    np.testing.assert_allclose(np.asarray(runs["trajectory"][0]), np.asarray(runs["transition"][0]), rtol=1e-4)
    rewards = {k: np.asarray(info.reward[:, 9]) for k, (_, info) in runs.items()}
    assert np.isfinite(rewards["trajectory"]).all() and not np.allclose(rewards["trajectory"], rewards["transition"])
    with pytest.raises(ValueError, match="jump_estimate"):
        adaptive_hmc(standard_normal, jump_estimate="steps")

    with pytest.raises(ValueError, match="jump_estimate='transition'"):  # RMHMC's own kernel: jumps made only
        adaptive_hmc(standard_normal, metric="softabs", jump_estimate="trajectory")


@pytest.mark.slow  # ~25 s each; the default: every JAX sampling test of the default run samples with it
@pytest.mark.parametrize("dense_mass", [False, True])
def test_trajectory_jump_estimate_samples_the_target(dense_mass):
    samples, info = run_chains(jax.random.key(7), ill_scaled_gaussian, initial_positions(8, 10), 1000, 1000,
                               jump_estimate="trajectory", dense_mass=dense_mass)
    info = time_major(info)  # run_chains: (chains, iterations)
    assert_moments_match(np.asarray(samples), np.zeros(10), np.asarray(ILL_SCALES))
    rewards = np.asarray(info.reward)  # NaN except at round ends: 150 rounds after the 500 metric iterations
    assert np.isfinite(rewards).sum() == 150 * NUM_CHAINS


def test_an_arm_frozen_early_does_not_jump_at_the_end_of_warmup():
    """freeze_after=2: only round 1's update may move the arm; the end-of-warm-up move to the GP's best arm
    (round 10 here) must not move it either (it did: arm_changed at iteration 99)."""
    _, info = run_chains(jax.random.key(41), standard_normal, initial_positions(42, 3), 100, 20,
                         step_size_bounds=(0.05, 1.5), num_steps_bounds=(1, 30), adapt_mass_matrix=False,
                         freeze_after=2, initial_arm=(0.05, 1))
    assert np.isfinite(np.asarray(info.reward)).sum() >= 10  # rounds were scored (the GP learned)
    changed = np.asarray(info.arm_changed)  # (chains, iterations)
    assert changed[:, 9].all() and not changed[:, 10:].any()  # round 1 moved away from the poor first arm
    assert len(np.unique(np.asarray(info.step_size)[:, 10:])) == 1
