"""shrink_correlations: keeps the variances, shrinks the correlations by (d / (n + d))^2."""

import numpy as np
import pytest

from ahmc.core import shrink_correlations


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
