"""The metric phase's mass-matrix estimators (``metric_recipe``: BlackJAX's ``metric_recipes``).

Each recipe must leave the draws exact (moments within Monte Carlo error), estimate what it claims
(the Fisher diagonal the scales, the low-rank matrix a strong correlation), and refuse what it cannot do
before anything compiles.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from ahmc.adapters.blackjax import gpucb_adaptation, run_chains, uniform_steps_hmc  # noqa: E402

from ..reference import assert_moments_match  # noqa: E402

SCALES = np.array([0.05, 0.3, 1.0, 3.0, 10.0, 1.0])
RHO = 0.95  # coordinates 2 and 5: correlated


def _covariance():
    cov = np.diag(SCALES**2)
    cov[2, 5] = cov[5, 2] = RHO * SCALES[2] * SCALES[5]
    return cov


PRECISION = np.linalg.inv(_covariance())


def logdensity(x):
    return -0.5 * x @ jnp.asarray(PRECISION, x.dtype) @ x


# welford_dense is the dense_mass=True path, whose draws test_blackjax.py and test_numpyro.py check by default
@pytest.mark.parametrize("recipe", ["fisher_diag", "fisher_low_rank", pytest.param("welford_dense", marks=pytest.mark.slow)])
def test_recipe_draws_match_the_target(recipe):
    samples, info, state = run_chains(jax.random.key(3), logdensity, jnp.full((4, 6), 0.5), num_warmup=600,
                                      num_samples=1000, metric_recipe=recipe, return_state=True)
    assert_moments_match(np.asarray(samples), np.zeros(6), SCALES)
    imm = np.asarray(state.inverse_mass_matrix)
    assert imm.shape == ((6,) if recipe == "fisher_diag" else (6, 6))
    assert np.all(np.isfinite(imm))


def test_fisher_diagonal_estimates_the_scales():
    # On independent Gaussian coordinates the Fisher diagonal sqrt(Var x / Var grad) is the variance itself.
    _, _, state = run_chains(jax.random.key(0), lambda x: -0.5 * jnp.sum((x / SCALES[:5]) ** 2),
                             jnp.full((4, 5), 0.5), num_warmup=600, num_samples=10, metric_recipe="fisher_diag",
                             return_state=True)
    ratio = np.asarray(state.inverse_mass_matrix) / SCALES[:5] ** 2
    assert np.all((ratio > 0.6) & (ratio < 1.6)), ratio


def test_low_rank_metric_finds_the_correlation():
    _, _, state = run_chains(jax.random.key(1), logdensity, jnp.full((4, 6), 0.5), num_warmup=600, num_samples=10,
                             metric_recipe="fisher_low_rank", return_state=True)
    imm = np.asarray(state.inverse_mass_matrix)
    correlation = imm[2, 5] / np.sqrt(imm[2, 2] * imm[5, 5])
    assert correlation > 0.8, correlation  # a diagonal estimate would give 0
    np.testing.assert_allclose(np.diag(imm)[[0, 1, 3, 4]] / SCALES[[0, 1, 3, 4]] ** 2, 1.0, rtol=0.5)


@pytest.mark.slow  # 2026-12-05: the default suite took 18-22 min on this host; a default test covers most of it
def test_the_default_is_low_rank_up_to_200_dimensions_and_welford_diagonal_above():
    def run(dim, **options):
        return run_chains(jax.random.key(2), lambda x: -0.5 * jnp.sum(x * x), jnp.full((2, dim), 0.5),
                          num_warmup=200, num_samples=20, return_state=True, **options)

    small, _, state = run(6)
    np.testing.assert_array_equal(np.asarray(small), np.asarray(run(6, metric_recipe="fisher_low_rank")[0]))
    assert state.inverse_mass_matrix.shape == (6, 6)
    big, _, state = run(201)
    np.testing.assert_array_equal(np.asarray(big), np.asarray(run(201, metric_recipe="welford_diag")[0]))
    assert state.inverse_mass_matrix.shape == (201,)
    # a fixed matrix (nothing estimated) stays diagonal
    _, _, state = run(6, adapt_mass_matrix=False, step_size_bounds=(0.1, 1.0), num_steps_bounds=(1, 10))
    assert state.inverse_mass_matrix.shape == (6,)


def test_adaptation_then_plain_blackjax_loop_with_low_rank():
    """BlackJAX's usage: the adaptation's parameters (a dense matrix from the low-rank estimate) drive
    uniform_steps_hmc's one-chain kernel, jax.vmap-ed over chains."""
    adaptation = gpucb_adaptation(logdensity, metric_recipe="fisher_low_rank")
    (state, parameters), _ = adaptation.run(jax.random.key(4), jnp.full((4, 6), 0.5), num_steps=600)
    assert np.asarray(parameters["inverse_mass_matrix"]).shape == (6, 6)
    step = jax.jit(jax.vmap(uniform_steps_hmc(logdensity, **parameters).step))

    def one_step(state, key):
        state, _ = step(jax.random.split(key, 4), state)
        return state, state.position

    _, draws = jax.lax.scan(one_step, state, jax.random.split(jax.random.key(6), 1000))
    assert_moments_match(np.swapaxes(np.asarray(draws), 0, 1), np.zeros(6), SCALES)


@pytest.mark.parametrize("options, words", [
    ({"metric_recipe": "fisher"}, ["metric_recipe", "'fisher_diag'", "'fisher_low_rank'"]),
    ({"metric_recipe": "fisher_diag", "dense_mass": True}, ["metric_recipe='fisher_diag'", "dense_mass=True"]),
    ({"metric_recipe": "welford_diag", "dense_mass": "auto"}, ["dense_mass='auto'"]),
])
def test_bad_recipe_is_refused_before_compiling(options, words):
    with pytest.raises(ValueError) as error:
        run_chains(jax.random.key(0), logdensity, jnp.zeros((2, 6)), num_warmup=10, num_samples=10, **options)
    for word in words:
        assert word in str(error.value)


def test_numpyro_kernel_state_holds_the_recipe_matrix():
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist
    from numpyro.infer import MCMC

    from ahmc.adapters.numpyro import AdaptiveHMC

    def model():
        numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(6), jnp.asarray(_covariance(), jnp.float32)))

    mcmc = MCMC(AdaptiveHMC(model, metric_recipe="fisher_low_rank"), num_warmup=600, num_samples=1000,
                num_chains=4, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(5))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    assert_moments_match(draws, np.zeros(6), SCALES)
    imm = np.asarray(mcmc.last_state.engine.inverse_mass_matrix)
    assert imm.shape[-2:] == (6, 6)


def test_rmhmc_refuses_a_recipe():
    from ahmc.adapters.blackjax import adaptive_hmc

    with pytest.raises(ValueError, match="metric_recipe='fisher_diag' does not apply to RMHMC"):
        adaptive_hmc(logdensity, num_warmup=100, metric="softabs", metric_recipe="fisher_diag")


def test_one_chain_kernel_under_vmap_estimates_the_low_rank_matrix():
    """BlackJAX's one-chain usage (init on one position, jax.vmap over chains): each chain's own low-rank
    estimate must see its whole window of draws (the state's chain axis is stripped and restored per step)."""
    from ahmc.adapters.blackjax import adaptive_hmc

    scales = jnp.asarray(np.logspace(-1, 1, 6))
    sampler = adaptive_hmc(lambda x: -0.5 * jnp.sum((x / scales) ** 2), num_warmup=300)
    starts = scales * jax.random.normal(jax.random.key(9), (2, 6))
    states = jax.vmap(sampler.init)(starts, jax.random.split(jax.random.key(7), 2))
    step = jax.vmap(sampler.step)

    def one_step(states, key):
        return step(jax.random.split(key, 2), states)[0], None

    states, _ = jax.lax.scan(one_step, states, jax.random.split(jax.random.key(8), 300))
    imm = np.asarray(states.inverse_mass_matrix)
    assert imm.shape == (2, 6, 6)
    ratio = np.diagonal(imm, axis1=1, axis2=2) / np.asarray(scales) ** 2
    assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio


def test_window_rescue_undoes_blackjax_grad_floor_and_finds_unexplored_scales():
    """``rescue_scales`` on one window of draws from N(0, diag(1e12, 1)) (float64): the wide coordinate
    moved 1e-3 of its sd (unexplored), and a Fisher estimate's floored var(grad) is undone; the
    explored coordinate keeps the estimator's value."""
    from ahmc.adapters._jax_warmup import _accumulate_moments, _fresh_moments, rescue_scales

    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        sds = np.array([1e6, 1.0])
        moments = _fresh_moments(2, jnp.float64)
        for _ in range(50):  # 50 iterations of 4 chains
            x = rng.normal(size=(4, 2)) * np.array([1e3, 1.0])
            moments = _accumulate_moments(moments, jnp.asarray(x), jnp.asarray(-x / sds ** 2))
        estimate = jnp.array([1e6, 0.9])  # e.g. the window's Welford variance, or a floored Fisher one
        for undo in (False, True):
            out = np.asarray(rescue_scales(estimate, moments, fisher=undo))
            np.testing.assert_allclose(out, [1e12, 0.9], rtol=1e-6)
            dense = np.asarray(rescue_scales(jnp.diag(estimate), moments, fisher=undo))
            np.testing.assert_allclose(np.diag(dense), [1e12, 0.9], rtol=1e-6)
        # Explored at its scale, a Fisher estimate floored at var(grad) = 1e-10 gives 1e11: undone to 1e12.
        moments = _fresh_moments(2, jnp.float64)
        for _ in range(200):
            x = rng.normal(size=(4, 2)) * sds
            moments = _accumulate_moments(moments, jnp.asarray(x), jnp.asarray(-x / sds ** 2))
        floored = jnp.array([1e11, 1.0])
        out = np.asarray(rescue_scales(floored, moments, fisher=True))
        assert 0.8e12 < out[0] < 1.25e12 and out[1] == 1.0, out
        assert np.asarray(rescue_scales(floored, moments, fisher=False))[0] == 1e11


def test_last_window_raises_a_fisher_estimate_its_draws_outspread():
    """At the last window's end only, and only for a Fisher recipe: a window whose draws spread 4x the
    estimate's variance in one coordinate (sds 2 and 1 against an estimate of 1 and 0.9) lifts both
    coordinates to the draws' variances, and a dense (low-rank) estimate loses its correlations; the earlier
    windows, and Welford's estimate, stay as estimated."""
    from ahmc.adapters._jax_warmup import _accumulate_moments, _fresh_moments, rescue_scales

    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        sds = np.array([2.0, 1.0])
        moments = _fresh_moments(2, jnp.float64)
        for _ in range(200):
            x = rng.normal(size=(4, 2)) * sds
            moments = _accumulate_moments(moments, jnp.asarray(x), jnp.asarray(-x / sds ** 2))
        draws = np.asarray(moments.m2_x / (moments.count - 1.0))
        estimate = jnp.array([1.0, 0.9])
        correlated = jnp.array([[1.0, 0.3], [0.3, 0.9]])
        for matrix in (estimate, correlated):
            raised = np.asarray(rescue_scales(matrix, moments, fisher=True, last_window=jnp.asarray(True)))
            if raised.ndim == 2:
                np.testing.assert_array_equal(raised, np.diag(np.diag(raised)))  # no correlation left
                raised = np.diag(raised)
            np.testing.assert_allclose(raised, np.maximum(draws, [1.0, 0.9]), rtol=1e-12)
            for fisher, last in ((True, False), (False, True)):
                kept = np.asarray(rescue_scales(matrix, moments, fisher=fisher, last_window=jnp.asarray(last)))
                np.testing.assert_array_equal(kept, np.asarray(matrix))
        # Draws that fit the estimate: the last window keeps a dense estimate's correlations to the bit.
        fitting = jnp.array([[draws[0], 0.3], [0.3, draws[1]]])
        kept = np.asarray(rescue_scales(fitting, moments, fisher=True, last_window=jnp.asarray(True)))
        np.testing.assert_array_equal(kept, np.asarray(fitting))


def test_run_chains_ends_warmup_with_a_metric_no_narrower_than_the_draws():
    """End to end: x[0] from an equal mixture of N(0, 0.2^2) and N(0, 2^2) has variance 2.02, but its
    gradient's variance is about 12.6 (the narrow part's), so the Fisher estimate sqrt(var x / var g) is
    about 0.4, 5x too narrow; the other coordinates are Gaussian. The last window's draws outspread the
    estimate, so the metric ends diagonal, at least at the draws' variances (the snapshot's
    ``draw_variances`` are that window's); on the Gaussian alone it keeps the Fisher estimate, below
    some coordinate's draws."""
    from ahmc.adapters.blackjax import run_chains, tuning_snapshot

    scales = jnp.array([1.0, 3.0, 0.5])

    def gaussian(z):  # z[0] and z[1] correlated 0.95, so the low-rank estimate has correlations to drop
        u = jnp.array([z[0] + z[1] / 3.0, z[0] - z[1] / 3.0]) / jnp.sqrt(2.0)
        return -0.5 * (u[0] ** 2 / 1.95 + u[1] ** 2 / 0.05) - 0.5 * (z[2] / scales[2]) ** 2

    def scale_mixture(x):
        parts = jnp.array([-0.5 * (x[0] / 0.2) ** 2 - jnp.log(0.2), -0.5 * (x[0] / 2.0) ** 2 - jnp.log(2.0)])
        return jax.scipy.special.logsumexp(parts) + gaussian(x[1:])

    for logdensity, starts, raised in ((scale_mixture, jnp.zeros((4, 4)), True),
                                       (gaussian, jnp.zeros((4, 3)), False)):
        _, info, state = run_chains(jax.random.key(3), logdensity, starts, 600, 20, return_state=True)
        snapshot = tuning_snapshot(info, state)
        matrix = np.asarray(snapshot.inverse_mass_matrix)
        diagonal = np.diag(matrix)
        below = diagonal < np.asarray(snapshot.draw_variances) * (1 - 1e-6)
        assert not below.any() if raised else below.any(), (diagonal, snapshot.draw_variances)
        off_diagonal = matrix - np.diag(diagonal)
        if raised:  # the low-rank estimate's correlations are dropped with it
            np.testing.assert_array_equal(off_diagonal, 0.0)
        else:
            assert np.abs(off_diagonal).max() > 0.1 * diagonal.max(), matrix
