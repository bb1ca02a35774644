"""Regularising a dense mass-matrix estimate from a short window of draws.

A window of ``n`` draws cannot estimate a ``d x d`` covariance when ``n`` is not
well above ``d``: with ``n < d`` the sample covariance is singular, and Stan's
shrinkage towards ``1e-3 I`` then gives the missed directions a tiny variance.
The chain barely moves along them in the next window, so they stay missed
(measured: the 16 x 16 LGCP, d = 256, 4 pooled chains; breast cancer, d = 31,
one chain). Shrinking the correlations towards zero keeps every direction at
its own marginal variance. With weight ``(d / (n + d))^2`` the shrinkage is
about 0.5 for a 25-draw window in 31 dimensions and under 0.02 for 200 draws
in 30, so a long window keeps strong correlations (0.99 in the tests).
"""

from __future__ import annotations

import numpy as np

__all__ = ["shrink_correlations"]


def shrink_correlations(covariance, num_draws, xp=np):
    """``(1 - w) C + w diag(C)`` with ``w = (d / (n + d))^2``, ``n = num_draws``.

    ``covariance`` is ``(d, d)``; ``num_draws`` may be a traced scalar (``xp = jax.numpy``).
    """
    dim = covariance.shape[-1]
    weight = (dim / (xp.asarray(num_draws, dtype=covariance.dtype) + dim)) ** 2
    return (1 - weight) * covariance + weight * xp.diag(xp.diag(covariance))
