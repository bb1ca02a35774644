"""shrink_correlations keeps the variances and shrinks the correlations by (d / (n + d))^2;
correlation_excess / prefers_dense decide dense_mass="auto"."""

import numpy as np
import pytest

from ahmc.core.mass_matrix import (FISHER_SPREAD_LIMIT, UNEXPLORED_PRODUCT, correlation_excess, fisher_misfit,
                                   prefers_dense, raise_to_draws, rescale_diagonal,
                                   rescue_unexplored, shrink_correlations)


def test_variances_kept_and_correlations_shrunk_by_the_documented_weight():
    covariance = np.array([[4.0, 1.9, 0.0], [1.9, 1.0, 0.3], [0.0, 0.3, 2.0]])
    out = shrink_correlations(covariance, 6)
    weight = (3 / (6 + 3)) ** 2
    np.testing.assert_allclose(np.diag(out), np.diag(covariance))
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose(out[off], (1 - weight) * covariance[off])
    # A singular window estimate (fewer draws than dimensions) becomes positive definite.
    draws = np.random.default_rng(0).normal(size=(5, 8))
    singular = np.cov(draws, rowvar=False)
    assert np.linalg.matrix_rank(singular) < 8
    assert np.all(np.linalg.eigvalsh(shrink_correlations(singular, 5)) > 0)


def test_jax_matches_numpy():
    jnp = pytest.importorskip("jax.numpy")
    covariance = np.array([[1.0, 0.99], [0.99, 1.0]])
    np.testing.assert_allclose(np.asarray(shrink_correlations(jnp.asarray(covariance), jnp.asarray(400), jnp)),
                               shrink_correlations(covariance, 400), rtol=1e-6)


# ---- correlation_excess / prefers_dense: dense_mass="auto"'s choice -------------------------------

def test_independent_coordinates_stay_near_the_noise_level_whatever_their_scales():
    # Sample correlations of independent draws: condition number ~ the Marchenko-Pastur level, so the
    # excess is ~1 (0.64-1.09 over 300 seeds each of these shapes); "auto" must keep the diagonal.
    for seed in range(50):
        rng = np.random.default_rng(seed)
        for dim, n in ((3, 200), (10, 800), (31, 800), (100, 400)):
            draws = rng.normal(size=(n, dim)) * np.geomspace(0.01, 100.0, dim)
            covariance = np.cov(draws, rowvar=False)
            assert correlation_excess(covariance, n) < 1.5
            assert not prefers_dense(covariance, n)


def test_correlated_coordinates_stand_out_and_the_excess_is_scale_free():
    dim = 8
    ar1 = 0.5 ** np.abs(np.subtract.outer(np.arange(dim), np.arange(dim)))  # condition number ~ 8.4
    draws = np.random.default_rng(1).multivariate_normal(np.zeros(dim), ar1, size=800)
    covariance = np.cov(draws, rowvar=False)
    assert 4.0 < correlation_excess(covariance, 800) < 7.0
    assert prefers_dense(covariance, 800)
    scales = np.geomspace(1e-3, 1e3, dim)
    np.testing.assert_allclose(correlation_excess(covariance * np.outer(scales, scales), 800),
                               correlation_excess(covariance, 800), rtol=1e-8)
    # Weak correlation is not worth a dense matrix; the same matrix with more draws is.
    weak = 0.2 ** np.abs(np.subtract.outer(np.arange(dim), np.arange(dim)))
    assert not prefers_dense(weak, 100)
    assert correlation_excess(weak, 100) < correlation_excess(weak, 10_000)


def test_no_estimate_possible_gives_zero():
    covariance = np.array([[1.0, 0.9], [0.9, 1.0]])
    assert correlation_excess(covariance, 2) == 0.0  # n <= d
    assert correlation_excess(np.array([[0.0, 0.0], [0.0, 1.0]]), 100) == 0.0  # a zero variance
    assert correlation_excess(np.array([[np.nan, 0.0], [0.0, 1.0]]), 100) == 0.0
    assert correlation_excess(np.array([[2.0]]), 100) == 0.0  # one dimension: nothing to correlate
    with pytest.raises(ValueError, match="threshold"):
        prefers_dense(covariance, 100, threshold=-1.0)


def test_correlation_excess_under_jit_matches_numpy():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    covariance = np.array([[1.0, 0.6, 0.1], [0.6, 2.0, 0.3], [0.1, 0.3, 0.5]])
    fn = jax.jit(lambda c, n: correlation_excess(c, n, jnp))
    for n in (2, 50, 800):
        np.testing.assert_allclose(float(fn(jnp.asarray(covariance), jnp.asarray(n))),
                                   correlation_excess(covariance, n), rtol=1e-5)


def test_rescue_unexplored_reads_a_gaussian_scale_from_a_small_spread():
    """Draws that moved 1e-3 of a Gaussian's sd 1e6: var x * E[g^2] is 1e-12, far below the bound of 1,
    and sqrt(var x / var g) is the variance itself; an explored coordinate keeps its estimate."""
    rng = np.random.default_rng(0)
    sds = np.array([1e6, 1.0])
    x = rng.normal(size=(200, 2)) * np.array([1e3, 1.0])  # the second coordinate explored at its scale
    g = -x / sds ** 2  # grad log p of N(0, sds^2)
    var_x, var_g, mean_sq = x.var(axis=0), g.var(axis=0), (g ** 2).mean(axis=0)
    assert var_x[0] * mean_sq[0] < UNEXPLORED_PRODUCT < var_x[1] * mean_sq[1]
    rescued = rescue_unexplored(var_x, var_x, var_g, mean_sq)
    np.testing.assert_allclose(rescued[0], 1e12, rtol=1e-9)
    assert rescued[1] == var_x[1]


def test_rescue_unexplored_leaves_constant_gradients_and_stuck_draws():
    variance = np.array([2.0, 3.0])
    rescued = rescue_unexplored(variance, np.array([1e-8, 0.0]), np.array([0.0, 1.0]), np.array([1e-6, 1.0]))
    np.testing.assert_array_equal(rescued, variance)


def test_rescale_diagonal_sets_variances_and_keeps_correlations():
    covariance = np.array([[4.0, 1.2], [1.2, 1.0]])
    variance = np.array([1e12, 1.0])
    out = rescale_diagonal(covariance, variance)
    np.testing.assert_allclose(np.diag(out), variance)
    correlation = lambda c: c[0, 1] / np.sqrt(c[0, 0] * c[1, 1])  # noqa: E731
    np.testing.assert_allclose(correlation(out), correlation(covariance))
    np.testing.assert_allclose(rescale_diagonal(np.array([2.0, 0.0]), variance), [1e12, 0.0])


def test_raise_to_draws_lifts_every_coordinate_once_one_spreads_past_the_limit():
    """gp_pois_regr's last window (seed 1): draws 4.8x the Fisher variance on one hyperparameter, 1.0-1.7x
    elsewhere; every coordinate goes to the larger of the two, and one below the limit changes nothing."""
    variance = np.array([1.0, 2.0, 0.5, 3.0])
    draws = np.array([4.8, 2.2, 0.4, 3.3])
    np.testing.assert_array_equal(raise_to_draws(variance, draws), [4.8, 2.2, 0.5, 3.3])
    near = np.array([0.99 * FISHER_SPREAD_LIMIT, 2.2, 0.4, 3.3])  # breast cancer's largest ratio was 2.07
    np.testing.assert_array_equal(raise_to_draws(variance, near), variance)
    np.testing.assert_array_equal(raise_to_draws(variance, np.array([4.8, np.inf, 0.4, 3.3])), variance)
    np.testing.assert_array_equal(raise_to_draws(variance, draws, limit=5.0), variance)
    assert fisher_misfit(variance, draws) and not fisher_misfit(variance, near)
    assert not fisher_misfit(variance, np.array([4.8, np.inf, 0.4, 3.3]))
    assert not fisher_misfit(np.array([1.0, 0.0, 0.5, 3.0]), draws)  # an estimate that is not positive
