"""Gaussian-process surrogate over the grid of arms, with a fixed-size buffer.

Model (ICML paper, section 3): ``f ~ GP(0, k)``, with the squared-exponential
ARD kernel on the unit box

    k(g, g') = exp(-|g_eps - g'_eps|^2 / (2 l^2)) * exp(-|g_L - g'_L|^2 / (2 l^2)),

``l = kappa`` (kappa times the box width, in unit coordinates), and Gaussian
observation noise of variance ``noise_variance``.  The paper's printed kernel
reads like an exponential of an inner product; we use the standard kernel of
the *distance*, as GP-UCB (Srinivas et al. 2010) defines it.

Two facts make this cheap and exact:

* Every arm lies on the grid, and the kernel is a product over the two
  coordinates, so all kernel values are gathers from two small 1-D kernel
  matrices (``G x G`` and ``H x H``), and the posterior mean on the whole grid
  is one ``(G x n) @ (n x H)`` product.
* Repeated rewards at one arm are pooled: ``c`` rewards with mean ``ybar`` and
  noise ``s^2`` each carry exactly the information of one observation
  ``ybar`` with noise ``s^2 / c``.  The buffer therefore stores one row per
  *distinct* arm.

The posterior variance on the grid needs a quadratic form per grid point
(``G*H*n^2`` flops), too slow to redo every round.  Variance does not depend on
the rewards, only on where and how often we observed, so we keep it in the
state and change it by exact rank-one steps: adding an observation at ``x``
with noise ``t^2`` gives

    v'(g) = v(g) - c(g, x)^2 / (v(x) + t^2),

with ``c`` the current posterior covariance (one ``(G x n) @ (n x H)``
product), and removing one is the inverse step.  Tests check the result
against the dense textbook formula.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .space import SearchSpace

__all__ = ["ArmBuffer", "GridKernel", "grid_kernel", "empty_buffer", "compact", "posterior_mean",
           "posterior_covariance_column"]


class ArmBuffer(NamedTuple):
    """Fixed-capacity record of the distinct arms observed so far.

    Empty slots have ``arm == -1`` and ``count == 0``; they enter the Gram
    matrix as identity rows with zero target, so they have no effect.

    Attributes
    ----------
    arm : array, shape (capacity,), int32
        Flat grid index of the arm in each slot, or -1.
    count : array, shape (capacity,), float
        Total weight of the rewards pooled in each slot.
    mean_reward : array, shape (capacity,), float
        Weighted mean of the (cleaned) rewards of each slot.
    last_round : array, shape (capacity,), int32
        Round at which each slot last received a reward.
    """

    arm: object
    count: object
    mean_reward: object
    last_round: object


class GridKernel(NamedTuple):
    """Static 1-D kernel matrices over the grid's two coordinates (NumPy)."""

    step_size: np.ndarray  # (G, G)
    num_steps: np.ndarray  # (H, H)


def grid_kernel(space: SearchSpace, lengthscale: float) -> GridKernel:
    """Precompute the per-coordinate kernel matrices on the unit grid."""

    def k1(u):
        d = (u[:, None] - u[None, :]) / lengthscale
        return np.exp(-0.5 * d * d)

    return GridKernel(k1(space.step_size_unit), k1(space.num_steps_unit))


def empty_buffer(capacity: int, xp, dtype) -> ArmBuffer:
    return ArmBuffer(
        arm=xp.full((capacity,), -1, dtype=xp.int32),
        count=xp.zeros((capacity,), dtype=dtype),
        mean_reward=xp.zeros((capacity,), dtype=dtype),
        last_round=xp.zeros((capacity,), dtype=xp.int32),
    )


def _coordinates(arm, num_l: int, xp):
    """Row (step-size) and column (L) grid indices of flat arm indices; -1 -> 0."""
    safe = xp.where(arm >= 0, arm, 0)
    return safe // num_l, safe % num_l


def _arm_features(buffer: ArmBuffer, kernel: GridKernel, xp, dtype):
    """Kernel columns of the buffered arms and the regularised Gram matrix.

    Returns ``(k_eps, k_L, gram)`` with ``k_eps`` (G, n), ``k_L`` (H, n) and
    ``gram = K + diag(noise / count)`` (n, n) restricted to occupied slots.
    """
    num_l = kernel.num_steps.shape[0]
    rows, cols = _coordinates(buffer.arm, num_l, xp)
    k_eps = xp.asarray(kernel.step_size, dtype=dtype)[:, rows]
    k_l = xp.asarray(kernel.num_steps, dtype=dtype)[:, cols]
    occupied = buffer.count > 0
    both = occupied[:, None] & occupied[None, :]
    gram = k_eps[rows, :] * k_l[cols, :]
    gram = xp.where(both, gram, xp.zeros_like(gram))
    return k_eps, k_l, occupied, gram


def _system(buffer: ArmBuffer, kernel: GridKernel, noise_variance: float, xp, dtype):
    k_eps, k_l, occupied, gram = _arm_features(buffer, kernel, xp, dtype)
    safe_count = xp.where(occupied, buffer.count, xp.ones_like(buffer.count))
    # Occupied slots: pooled noise s^2 / count.  Empty slots: identity rows.
    diagonal = xp.where(occupied, noise_variance / safe_count, xp.ones_like(buffer.count))
    eye = xp.eye(gram.shape[0], dtype=dtype)
    return k_eps, k_l, occupied, gram + eye * diagonal[None, :]


def compact(buffer: ArmBuffer) -> ArmBuffer:
    """The occupied slots only (eager NumPy: a data-dependent shape).

    Empty slots add identity rows that change nothing, so every function here
    gives the same result on ``compact(buffer)``, with solves of the size of
    the data instead of the capacity.
    """
    keep = buffer.count > 0
    return ArmBuffer(*(field[keep] for field in buffer))


def posterior_mean(buffer: ArmBuffer, kernel: GridKernel, noise_variance: float, xp, dtype):
    """Posterior mean of the raw reward on the grid, shape (G, H).

    ``mu(g) = k(g, X)^T (K + N)^{-1} y`` with ``N = diag(noise / count)``.
    """
    k_eps, k_l, occupied, system = _system(buffer, kernel, noise_variance, xp, dtype)
    target = xp.where(occupied, buffer.mean_reward, xp.zeros_like(buffer.mean_reward))
    weights = xp.linalg.solve(system, target[:, None])[:, 0]
    return (k_eps * weights[None, :]) @ k_l.T


def posterior_covariance_column(buffer: ArmBuffer, kernel: GridKernel, noise_variance: float, arm, xp, dtype):
    """Posterior covariance between every grid arm and one arm ``arm``.

    Returns ``(cov, var_at_arm)``: ``cov`` of shape (G, H) and the posterior
    variance at ``arm`` (a scalar), computed from the data directly.
    """
    k_eps, k_l, occupied, system = _system(buffer, kernel, noise_variance, xp, dtype)
    num_l = kernel.num_steps.shape[0]
    row, col = _coordinates(arm, num_l, xp)
    prior_eps = xp.asarray(kernel.step_size, dtype=dtype)[:, row]  # (G,)
    prior_l = xp.asarray(kernel.num_steps, dtype=dtype)[:, col]  # (H,)
    k_data = xp.where(occupied, k_eps[row, :] * k_l[col, :], xp.zeros_like(buffer.count))  # (n,)
    alpha = xp.linalg.solve(system, k_data[:, None])[:, 0]
    cov = prior_eps[:, None] * prior_l[None, :] - (k_eps * alpha[None, :]) @ k_l.T
    var_at_arm = 1.0 - xp.sum(k_data * alpha)
    return cov, var_at_arm
