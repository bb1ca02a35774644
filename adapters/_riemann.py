"""Riemann-manifold HMC in NumPy: the geometry at a point, SoftAbs, the generalized leapfrog.

Framework-free (NumPy and SciPy only); the PyMC step (:class:`ahmc.adapters.pymc.AdaptiveRMHMC`)
supplies the model's log density, its gradient, the metric ``G(x)`` and ``dG/dx``
from one compiled PyTensor function.

The Hamiltonian (Girolami & Calderhead 2011, up to the constant ``d/2 log 2 pi``)::

    H(x, p) = -log pi(x) + 1/2 log det G(x) + 1/2 p^T G(x)^{-1} p

is not separable, so the leapfrog becomes implicit (the generalized leapfrog):

1. ``p' = p - eps/2 dH/dx(x, p')``               (fixed point in p, the geometry at x fixed)
2. ``x' = x + eps/2 [G(x)^-1 + G(x')^-1] p'``    (fixed point in x: one evaluation per iteration)
3. ``p'' = p' - eps/2 dH/dx(x', p')``            (explicit)

Solved exactly, the map is reversible and volume-preserving; a fixed point that does
not converge within ``max_iterations`` is reported (``converged=False``), and the caller
rejects the proposal.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

__all__ = ["Geometry", "LeapfrogResult", "NotPositiveDefiniteError", "diagonal_softabs", "geometry", "softabs",
           "hamiltonian", "velocity", "velocity_derivative", "position_force", "generalized_leapfrog", "sample_momentum"]


class NotPositiveDefiniteError(np.linalg.LinAlgError):
    """The metric at a point is not a finite symmetric positive-definite matrix."""


class Geometry(NamedTuple):
    """Everything the generalized leapfrog needs at one position."""

    position: np.ndarray  # x, (d,)
    logp: float  # log pi(x)
    grad: np.ndarray  # d log pi / dx, (d,)
    metric: np.ndarray  # G(x), (d, d)
    chol: np.ndarray  # lower Cholesky factor of G(x)
    inverse: np.ndarray  # G(x)^-1 (d is small: a product is cheaper than a triangular solve)
    metric_grad: np.ndarray  # dG/dx_k stacked on axis 0, (d, d, d)
    log_det: float  # log det G(x)
    log_det_grad: np.ndarray  # 1/2 d log det G / dx_k = 1/2 tr(G^-1 dG_k), (d,)


class LeapfrogResult(NamedTuple):
    geometry: Geometry  # at the new position
    momentum: np.ndarray
    converged: bool  # both fixed points met the tolerance
    num_evaluations: int  # geometry evaluations (model gradient + metric + its derivatives)


def geometry(position, logp, grad, metric, metric_grad) -> Geometry:
    """Assemble a :class:`Geometry`; raises :class:`NotPositiveDefiniteError` if ``G`` is not SPD."""
    metric = np.asarray(metric, dtype=np.float64)
    if not (np.isfinite(logp) and np.all(np.isfinite(grad)) and np.all(np.isfinite(metric))):
        raise NotPositiveDefiniteError("non-finite log density, gradient or metric")
    try:
        chol = np.linalg.cholesky(metric)
    except np.linalg.LinAlgError as error:
        raise NotPositiveDefiniteError(str(error)) from None
    size = len(metric)
    chol_inverse = np.linalg.inv(chol)
    inverse = chol_inverse.T @ chol_inverse
    metric_grad = np.asarray(metric_grad, dtype=np.float64)
    # tr(G^-1 dG_k) = sum_ij (G^-1)_ji (dG_k)_ij, as one matrix-vector product
    trace = metric_grad.reshape(size, size * size) @ inverse.T.ravel()
    return Geometry(np.asarray(position, dtype=np.float64), float(logp), np.asarray(grad, dtype=np.float64),
                    metric, chol, inverse, metric_grad, 2.0 * float(np.sum(np.log(np.diag(chol)))), 0.5 * trace)


# ---- SoftAbs (Betancourt 2013) ---------------------------------------------------------------

def _softabs_value_slope(lam, alpha):
    """``f(lam) = lam coth(alpha lam)`` (``|lam|`` far from 0, ``1/alpha`` at 0) and ``f'(lam)``.

    ``f' = coth(a) - a / sinh(a)^2`` with ``a = alpha lam``; ``a / sinh(a)^2`` is written as
    ``4 a e^{-2|a|} / (1 - e^{-2|a|})^2``, which cannot overflow.  Series near ``a = 0``.
    """
    a = alpha * lam
    small = np.abs(a) < 1e-4
    safe = np.where(small, 1.0, a)
    coth = 1.0 / np.tanh(safe)
    decay = np.exp(-2.0 * np.abs(safe))
    value = np.where(small, (1.0 + a * a / 3.0) / alpha, lam * coth)
    slope = np.where(small, 2.0 * a / 3.0, coth - 4.0 * safe * decay / (1.0 - decay) ** 2)
    return value, slope


def softabs(hessian, hessian_grad, alpha):
    """SoftAbs metric of a Hessian and its derivative.

    ``G = Q diag(lam coth(alpha lam)) Q^T`` for ``hessian = Q diag(lam) Q^T``: positive
    definite everywhere, ``|lam|`` for ``|lam| >> 1/alpha``.  ``dG_k = Q (J o Q^T dH_k Q) Q^T``
    with ``J`` the divided differences of the softened eigenvalues.

    Parameters
    ----------
    hessian : (d, d) array
        Hessian of ``-log pi`` at the point.
    hessian_grad : (d, d, d) array
        ``dH/dx_k`` on axis 0.
    alpha : float
        Softness; larger is closer to ``|lam|`` (and less smooth near ``lam = 0``).

    Returns
    -------
    (metric, metric_grad) : (d, d) and (d, d, d) arrays
    """
    if not (np.all(np.isfinite(hessian)) and np.all(np.isfinite(hessian_grad))):
        raise NotPositiveDefiniteError("non-finite Hessian or third derivatives")
    hessian = 0.5 * (hessian + hessian.T)
    try:
        lam, q = np.linalg.eigh(hessian)
    except np.linalg.LinAlgError as error:
        raise NotPositiveDefiniteError(str(error)) from None
    value, slope = _softabs_value_slope(lam, alpha)
    gap = lam[:, None] - lam[None, :]
    close = np.abs(gap) <= 1e-8 * np.maximum(1.0, np.maximum(np.abs(lam[:, None]), np.abs(lam[None, :])))
    with np.errstate(divide="ignore", invalid="ignore"):
        divided = np.where(close, 0.5 * (slope[:, None] + slope[None, :]),
                           (value[:, None] - value[None, :]) / np.where(close, 1.0, gap))
    metric = (q * value) @ q.T
    rotated = q.T @ hessian_grad @ q  # Q^T dH_k Q for every k (batched matmul)
    metric_grad = q @ (divided * rotated) @ q.T
    return 0.5 * (metric + metric.T), metric_grad


def diagonal_softabs(hessian, hessian_grad, alpha):
    """SoftAbs of the Hessian's diagonal alone: ``G = diag(h_ii coth(alpha h_ii))``, and its derivative.

    Same arguments and returns as :func:`softabs` (dense arrays, so the rest of the step is shared).
    """
    if not (np.all(np.isfinite(hessian)) and np.all(np.isfinite(hessian_grad))):
        raise NotPositiveDefiniteError("non-finite Hessian or third derivatives")
    value, slope = _softabs_value_slope(np.diagonal(hessian), alpha)
    diagonal_grad = slope * np.diagonal(hessian_grad, axis1=1, axis2=2)  # [k, i] = d g_i / d x_k
    size = len(value)
    metric_grad = np.zeros((size, size, size))
    metric_grad[:, np.arange(size), np.arange(size)] = diagonal_grad
    return np.diag(value), metric_grad


# ---- the Hamiltonian and its derivatives -----------------------------------------------------

def velocity(geom: Geometry, momentum) -> np.ndarray:
    """``dH/dp = G^-1 p``."""
    return geom.inverse @ momentum


def velocity_derivative(geom: Geometry, u, direction) -> np.ndarray:
    """``d/dt G(x + t r)^-1 p`` at ``t = 0`` for ``u = G^-1 p``: ``-G^-1 (sum_k r_k dG_k) u``."""
    return -geom.inverse @ (np.tensordot(direction, geom.metric_grad, axes=1) @ u)


def hamiltonian(geom: Geometry, momentum) -> float:
    """``-log pi + 1/2 log det G + 1/2 p^T G^-1 p``."""
    return -geom.logp + 0.5 * geom.log_det + 0.5 * float(momentum @ velocity(geom, momentum))


def position_force(geom: Geometry, momentum) -> np.ndarray:
    """``dH/dx_k = -d log pi/dx_k + 1/2 tr(G^-1 dG_k) - 1/2 v^T dG_k v``, ``v = G^-1 p``."""
    v = velocity(geom, momentum)
    return -geom.grad + geom.log_det_grad - 0.5 * ((geom.metric_grad @ v) @ v)


def sample_momentum(geom: Geometry, rng: np.random.Generator) -> np.ndarray:
    """``p ~ N(0, G(x))``."""
    return geom.chol @ rng.standard_normal(len(geom.position))


def _close(new, old, tolerance) -> bool:
    """Fixed-point stopping rule: every change within ``tolerance * (1 + |value|)``."""
    return bool(np.all(np.abs(new - old) <= tolerance * (1.0 + np.abs(new))))


def generalized_leapfrog(evaluate: Callable[[np.ndarray], Geometry], geom: Geometry, momentum, step_size,
                         tolerance, max_iterations) -> LeapfrogResult:
    """One generalized leapfrog step from ``(geom.position, momentum)``.

    ``evaluate(x)`` returns the :class:`Geometry` at ``x`` (it may raise
    :class:`NotPositiveDefiniteError`); each call is counted in ``num_evaluations``.
    The position returned is the last fixed-point iterate at which the geometry was
    evaluated, so the returned geometry belongs to it exactly.
    """
    half = 0.5 * step_size
    # 1. implicit half step in p; the geometry at x is fixed, so no evaluations here
    p_half, p_converged = momentum, False
    for _ in range(max_iterations):
        update = momentum - half * position_force(geom, p_half)
        if not np.all(np.isfinite(update)):
            break
        p_converged, p_half = _close(update, p_half, tolerance), update
        if p_converged:
            break
    # 2. implicit full step in x: x' = x + eps/2 (G(x)^-1 + G(x')^-1) p'. A chord (simplified
    # Newton) iteration: each residual is corrected by ~(I - eps/2 J)^-1 with J = d(G^-1 p')/dx at
    # the old x (from its metric_grad, no evaluation), so the error shrinks at O(eps^2) per
    # evaluation instead of O(eps); the start is the explicit step corrected the same way.
    x, v_start = geom.position, velocity(geom, p_half)

    def correct(residual):
        first = half * velocity_derivative(geom, v_start, residual)
        return residual + first + half * velocity_derivative(geom, v_start, first)

    explicit = step_size * v_start
    guess = x + explicit + half * velocity_derivative(geom, v_start, explicit)
    x_converged, evaluations, new = False, 0, geom
    for _ in range(max_iterations):
        new, evaluations = evaluate(guess), evaluations + 1
        update = guess - correct(guess - (x + half * (v_start + velocity(new, p_half))))
        x_converged = _close(update, guess, tolerance)
        if x_converged:
            break
        guess = update
    # 3. explicit half step in p at the new position
    p_new = p_half - half * position_force(new, p_half)
    converged = p_converged and x_converged and bool(np.all(np.isfinite(p_new)))
    return LeapfrogResult(new, p_new, converged, evaluations)
