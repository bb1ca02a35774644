"""Regularising a dense mass-matrix estimate from a short window of draws, and deciding
whether a dense one is worth it.

A window of ``n`` draws cannot estimate a ``d x d`` covariance when ``n`` is not
well above ``d``: with ``n < d`` the sample covariance is singular, and Stan's
shrinkage towards ``1e-3 I`` then gives the missed directions a tiny variance.
The chain barely moves along them in the next window, so they stay missed
(measured: the 16 x 16 LGCP, d = 256, 4 pooled chains; breast cancer, d = 31,
one chain). Shrinking the correlations towards zero keeps every direction at
its own marginal variance. With weight ``(d / (n + d))^2`` the shrinkage is
about 0.5 for a 25-draw window in 31 dimensions and under 0.02 for 200 draws
in 30, so a long window keeps strong correlations (0.99 in the tests).

A dense estimate only pays when the posterior's correlations are stronger than
the noise of estimating them: where a diagonal already whitens the posterior,
``d (d - 1) / 2`` noisy correlations make the preconditioned posterior worse
conditioned than the diagonal leaves it (measured: 0.71x-0.85x the diagonal's
ESS per gradient on the 10-d Gaussians, eight schools, sblrc, GARCH).
:func:`correlation_excess` measures the window's correlation matrix against that
noise: the condition number of the sample correlation matrix of ``n`` independent
draws in ``d`` dimensions is about ``((1 + sqrt(d/n)) / (1 - sqrt(d/n)))^2``
(the Marchenko-Pastur edges).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DENSE_AUTO_MAX_DIM", "DENSE_AUTO_THRESHOLD", "FISHER_SPREAD_LIMIT", "METRIC_RECIPES", "correlation_excess",
           "prefers_dense", "fisher_diagonal", "fisher_misfit", "raise_to_draws", "rescale_diagonal", "rescue_unexplored",
           "recipe_for_dimension", "resolve_metric_recipe", "shrink_correlations"]

#: The mass-matrix estimators the metric phase can run, by their names in BlackJAX 1.7's
#: ``blackjax.adaptation.metric_recipes``: Stan's Welford diagonal and dense covariance, and nutpie's
#: Fisher-divergence diagonal and low-rank estimates (Seyboldt et al. 2026), which use the gradients too.
METRIC_RECIPES = ("welford_diag", "welford_dense", "fisher_diag", "fisher_low_rank")

#: ``dense_mass="auto"`` keeps the dense estimate when :func:`correlation_excess` is at least this.
#: On 15 benchmark models (d = 2-31, 800 pooled draws; docs/decisions.md, "dense_mass='auto'") the
#: excess was 0.99-1.5 on four of the five where the dense matrix had lost to the diagonal (7.1 on
#: the fifth, GARCH, where it later won 1.18x over two seeds) and 2.3-1570 on the ten where it won.
DENSE_AUTO_THRESHOLD = 2.0

#: ``dense_mass="auto"`` above this dimension is diagonal from the start: a dense matrix costs
#: O(d^2) per leapfrog step and memory, and a warm-up window rarely holds enough draws to estimate it.
DENSE_AUTO_MAX_DIM = 200


def shrink_correlations(covariance, num_draws, xp=np):
    """``(1 - w) C + w diag(C)`` with ``w = (d / (n + d))^2``, ``n = num_draws``.

    ``covariance`` is ``(d, d)``; ``num_draws`` may be a traced scalar (``xp = jax.numpy``).
    """
    dim = covariance.shape[-1]
    weight = (dim / (xp.asarray(num_draws, dtype=covariance.dtype) + dim)) ** 2
    return (1 - weight) * covariance + weight * xp.diag(xp.diag(covariance))


def correlation_excess(covariance, num_draws, xp=np):
    """Condition number of the correlation matrix of ``covariance`` over its noise level.

    The noise level is the condition number that ``num_draws`` independent draws of
    uncorrelated coordinates would give (``((1 + q) / (1 - q))^2``, ``q = sqrt(d / n)``), so
    about 1 means "no correlation the window can tell from noise".  Returns 0 when
    ``num_draws <= d`` (no dense estimate is possible) or when a variance is not positive.
    ``num_draws`` may be a traced scalar (``xp = jax.numpy``).
    """
    dim = covariance.shape[-1]
    if dim < 2:
        return xp.asarray(0.0, dtype=covariance.dtype)
    variances = xp.diag(covariance)
    scale = xp.sqrt(xp.where(variances > 0, variances, 1.0))
    correlation = covariance / (scale[:, None] * scale[None, :])
    eigenvalues = xp.linalg.eigvalsh(correlation)
    n = xp.asarray(num_draws, dtype=covariance.dtype)
    q = xp.sqrt(dim / xp.maximum(n, 1.0))
    noise = ((1 + q) / xp.maximum(1 - q, 1e-12)) ** 2
    kappa = eigenvalues[-1] / xp.maximum(eigenvalues[0], xp.finfo(covariance.dtype).tiny)
    valid = (n > dim) & xp.all(variances > 0) & xp.all(xp.isfinite(covariance))
    return xp.where(valid, kappa / noise, 0.0)


def prefers_dense(covariance, num_draws, threshold=DENSE_AUTO_THRESHOLD, xp=np):
    """``dense_mass="auto"``'s choice: keep the dense estimate when its correlations stand out."""
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a finite number > 0; got {threshold!r}.")
    return correlation_excess(covariance, num_draws, xp) >= threshold


def resolve_metric_recipe(metric_recipe, dense_mass, adapt_mass_matrix=True):
    """``(recipe, dense_state)``: the estimator the metric phase runs and the matrix's form.

    ``recipe`` is one of :data:`METRIC_RECIPES`, ``"auto"`` (Welford, dense where the correlations
    stand out: ``dense_mass="auto"``) or ``"default"``: ``"fisher_low_rank"`` up to
    :data:`DENSE_AUTO_MAX_DIM` dimensions and ``"welford_diag"`` above (the JAX routes' default,
    ``metric_recipe=None`` with ``dense_mass=False``; docs/decisions.md, "The mass-matrix estimator").
    ``dense_state`` is ``dense_mass``'s value for the inverse mass matrix's shape (``True``: ``(d, d)``;
    ``"auto"``: chosen by the dimension, or by the shape of a given matrix).
    ``"fisher_low_rank"`` is carried as a ``(d, d)`` matrix, so its leapfrog costs a dense one's.
    With ``adapt_mass_matrix=False`` nothing is estimated and the default's fixed matrix stays diagonal.
    """
    if metric_recipe is None and not dense_mass and not adapt_mass_matrix:
        return "welford_diag", False
    if metric_recipe is None:
        if isinstance(dense_mass, str):
            return "auto", dense_mass
        return ("welford_dense", True) if dense_mass else ("default", "auto")
    if metric_recipe not in METRIC_RECIPES:
        raise ValueError(f"metric_recipe must be one of {', '.join(map(repr, METRIC_RECIPES))} or None; "
                         f"got {metric_recipe!r}.")
    dense = metric_recipe in ("welford_dense", "fisher_low_rank")
    if dense_mass not in (False, dense):
        raise ValueError(f"metric_recipe={metric_recipe!r} sets the matrix's form itself; dense_mass={dense_mass!r} "
                         "contradicts it. Give one of the two (dense_mass=True is metric_recipe='welford_dense').")
    return metric_recipe, dense


def recipe_for_dimension(recipe, dim):
    """:func:`resolve_metric_recipe`'s ``"default"`` made concrete for ``dim`` coordinates: ``"fisher_low_rank"``
    up to :data:`DENSE_AUTO_MAX_DIM`, ``"welford_diag"`` above; any other recipe as it is."""
    if recipe != "default":
        return recipe
    return "fisher_low_rank" if dim <= DENSE_AUTO_MAX_DIM else "welford_diag"


# At stationarity var(x_i) * E[g_i^2] >= 1 for every coordinate, g = grad log p (the Cramer-Rao bound
# for a shift of x_i alone).  A window whose product is far below 1 has not explored x_i's scale yet
# (a far start, or sds 1e-6 and 1e6 under an identity metric), so its sample variance is too small.
UNEXPLORED_PRODUCT = 1e-2


def rescue_unexplored(variance, draw_variance, grad_variance, grad_mean_square, xp=np):
    """``variance`` with every coordinate the draws have not explored replaced by ``sqrt(var x / var g)``.

    That is nutpie's estimate from draws and gradients together: exact for a Gaussian however little the
    chain has moved, since there ``var g = var x / sigma^4``.  Coordinates that pass the bound above, or
    whose gradient does not vary, keep ``variance``.
    """
    unexplored = draw_variance * grad_mean_square < UNEXPLORED_PRODUCT
    fisher = fisher_diagonal(variance, draw_variance, grad_variance, xp)
    return xp.where(unexplored, xp.maximum(fisher, variance), variance)


#: A Fisher estimate (nutpie's ``sqrt(var x / var g)``, and its low-rank form) is exact for a Gaussian; away
#: from one it can sit several times below the posterior's variance (a Gaussian process's hyperparameters, a
#: funnel's scales), and trajectories tuned in that metric are then too short for those coordinates. At the
#: last window's end, draws that spread more than this many times the estimate's variance in some coordinate
#: (:func:`fisher_misfit`) make the metric diagonal, each coordinate at least its draws' variance
#: (:func:`raise_to_draws`). The largest ratio over seeds 0-3 (``run_chains``): 2.9-4.8 on posteriordb's
#: gp_pois_regr (R-hat 1.015-1.056 with the estimate kept), at most 2.07 on 12 other models (breast cancer
#: 1.7-2.07, the rest below 1.8). docs/decisions.md, "The Fisher estimate raised to its draws" and "A misfit
#: Fisher estimate gives way to a diagonal".
FISHER_SPREAD_LIMIT = 2.5


def fisher_misfit(variance, draw_variance, limit=FISHER_SPREAD_LIMIT, xp=np):
    """Whether the draws spread more than ``limit`` times ``variance`` in some coordinate (never when a draw
    variance is not finite or an estimate not positive)."""
    usable = xp.all(xp.isfinite(draw_variance)) & xp.all(variance > 0)
    return xp.any(draw_variance > limit * variance) & usable


def raise_to_draws(variance, draw_variance, limit=FISHER_SPREAD_LIMIT, xp=np):
    """``variance`` raised to at least ``draw_variance`` in every coordinate when :func:`fisher_misfit`;
    otherwise ``variance`` itself (so a posterior the estimate fits keeps it to the bit)."""
    misfit = fisher_misfit(variance, draw_variance, limit, xp)
    return xp.where(misfit, xp.maximum(variance, draw_variance), variance)


def fisher_diagonal(variance, draw_variance, grad_variance, xp=np):
    """nutpie's diagonal ``sqrt(var x / var g)`` per coordinate; where the draws or the gradient do not vary,
    ``variance`` (the estimate in force)."""
    usable = (grad_variance > 0) & (draw_variance > 0)
    fisher = xp.sqrt(xp.where(usable, draw_variance, 1.0) / xp.where(usable, grad_variance, 1.0))
    return xp.where(usable, fisher, variance)


def rescale_diagonal(matrix, variance, xp=np):
    """``matrix`` (a ``(d,)`` diagonal or ``(d, d)`` inverse mass matrix) with its variances set to ``variance``.

    A dense matrix is rescaled by rows and columns (``D M D``), so its correlations stay; a coordinate whose
    variance in ``matrix`` is not positive is left alone.
    """
    if matrix.ndim == 1:
        return xp.where(matrix > 0, variance, matrix)
    current = xp.diag(matrix)
    scale = xp.where(current > 0, xp.sqrt(variance / xp.where(current > 0, current, 1.0)), 1.0)
    return matrix * scale[:, None] * scale[None, :]
