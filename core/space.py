"""The search box Gamma of (step size, number of leapfrog steps) and its grid.

The paper (Wang, Mohamed & de Freitas 2013, section 3) tunes ``eps`` in
``[eps_lo, eps_hi]``, discretised on a fine grid, and the integer ``L`` in
``[L_lo, L_hi]``.  The Gaussian process sees both coordinates rescaled to the
unit square.  With a log-spaced ``eps`` grid (the default here) the unit
coordinate is linear in ``log(eps)``, which suits a quantity that may range
over several orders of magnitude; ``log_step_size=False`` gives the paper's
linear grid.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["NUM_STEPS_CAP", "RMHMC_NUM_STEPS_CAP", "WARMUP_MAX_STEPS", "SearchSpace", "check_min_steps_fraction",
           "grid_num_steps", "min_num_steps", "search_space", "unit_of_num_steps"]

# Default upper end of the automatic box's L (``num_steps_cap``): the longest trajectory NUTS takes by
# default (tree depth 10, 1023 steps).  With the box at ``L <= ceil(4 pi / eps*)`` it binds only where
# the diagonal metric leaves eps* below ~0.012 (posteriordb's diamonds: a cap of 256 held its L there,
# and its R-hat at 1.02).
NUM_STEPS_CAP = 1024
# Riemann-manifold HMC with a position-dependent metric keeps the former 256: each of its steps costs an
# O(d^3) metric evaluation and fixed-point solves, and its metric already follows the local scale.
RMHMC_NUM_STEPS_CAP = 256
# Leapfrog cap of the warm-up's metric phase, where L = ceil(T_w / eps) only moves the chains while the
# metric is learned: a step size that small there is often transient (the metric not yet estimated),
# and paying up to NUM_STEPS_CAP steps for it buys nothing the GP phase does not redo.
WARMUP_MAX_STEPS = 256


class SearchSpace(NamedTuple):
    """A rectangular grid of arms ``(step_size, num_steps)``.

    Arms are numbered in row-major order: arm ``a`` has step size
    ``step_sizes[a // num_L]`` and ``num_steps[a % num_L]`` leapfrog steps,
    where ``num_L = len(num_steps)``.

    Attributes
    ----------
    step_sizes : ndarray, shape (G,), float64
        Candidate step sizes, increasing.
    num_steps : ndarray, shape (H,), int32
        Candidate maximum numbers of leapfrog steps: every integer in the box,
        or an automatic box's ``num_num_steps`` columns.
    step_size_unit : ndarray, shape (G,), float64
        Step-size coordinate of each candidate in [0, 1] (0 when G == 1).
    num_steps_unit : ndarray, shape (H,), float64
        Leapfrog coordinate of each candidate in [0, 1] (0 when H == 1).
    log_step_size : bool
        Whether the step-size grid is log-spaced.
    """

    step_sizes: np.ndarray
    num_steps: np.ndarray
    step_size_unit: np.ndarray
    num_steps_unit: np.ndarray
    log_step_size: bool

    @property
    def shape(self) -> tuple[int, int]:
        """``(G, H)``: grid points along step size and along ``L``."""
        return (len(self.step_sizes), len(self.num_steps))

    @property
    def num_arms(self) -> int:
        """Total number of arms ``G * H``."""
        return len(self.step_sizes) * len(self.num_steps)

    def arm_index(self, step_size: float, num_steps: int) -> int:
        """Index of the grid arm nearest to ``(step_size, num_steps)``.

        Nearness in step size is measured on the grid's own scale (log or
        linear).  Values outside the box are clipped to it.
        """
        to_scale = np.log if self.log_step_size else (lambda v: v)
        i = int(np.argmin(np.abs(to_scale(self.step_sizes) - to_scale(float(step_size)))))
        j = int(np.argmin(np.abs(self.num_steps - int(num_steps))))
        return i * len(self.num_steps) + j

    def center_arm(self) -> int:
        """Index of the arm at the middle of the box (the default first arm)."""
        g, h = self.shape
        return (g // 2) * h + (h - 1) // 2


def check_min_steps_fraction(value) -> float:
    """Validate ``min_steps_fraction`` (a number in [0, 1]) and return it as a float."""
    try:
        number = None if isinstance(value, bool) else float(value)  # also a concrete 0-d array
    except (TypeError, ValueError):
        number = None
    if number is None or not 0.0 <= number <= 1.0:
        raise ValueError(
            f"min_steps_fraction must be a number in [0, 1] (0: the paper's L_t ~ U{{1..L}}; 0.5: "
            f"U{{ceil(L/2)..L}}; a static Python number); got {value!r}.")
    return number


def min_num_steps(max_num_steps, fraction: float, xp=np):
    """Lowest leapfrog count of an iteration: ``L_t ~ U{min_num_steps..L}``.

    ``max(1, ceil(fraction * L))``: ``fraction = 0`` is the paper's ``U{1..L}``,
    ``0.5`` gives ``U{ceil(L/2)..L}`` and ``1`` a fixed ``L``.  ``max_num_steps``
    may be a traced integer array (``xp = jax.numpy``); ``fraction`` is static.
    The small offset keeps ``ceil`` from rounding up float noise (0.3 * 10).
    """
    lowest = xp.ceil(fraction * max_num_steps - 1e-9)
    return xp.maximum(lowest, 1).astype(xp.asarray(max_num_steps).dtype)


def grid_num_steps(unit, lo, hi, *, log: bool, xp=np):
    """The ``L`` a grid column of unit coordinate ``unit`` runs in the box ``[lo, hi]`` of an automatic box,
    whose grid has a fixed number of columns whatever ``hi`` turns out to be.

    ``log=False``: ``round(lo + unit (hi - lo))``, evenly spaced.  ``log=True``: evenly spaced in ``log L``,
    ``round(lo (hi / lo) ** unit)``: the columns resolve short trajectories (``L`` of 1 to 5, where the
    reward changes fastest on a cheap model) as finely as long ones relative to their length, instead of
    one column per ``(hi - lo) / (columns - 1)`` steps (docs/decisions.md, "Log-spaced `L`").  ``lo``,
    ``hi`` may be traced (``xp = jax.numpy``); the result is an integer array, at least 1."""
    if log:
        unit = xp.asarray(unit)  # floating: the grid's unit coordinates
        low, high = xp.asarray(lo).astype(unit.dtype), xp.asarray(hi).astype(unit.dtype)
        steps = xp.round(xp.exp(xp.log(low) + unit * (xp.log(high) - xp.log(low))))
    else:
        steps = xp.round(lo + unit * (hi - lo))
    return xp.maximum(steps, 1).astype(xp.int32 if xp is not np else np.int64)


def unit_of_num_steps(num_steps, lo, hi, *, log: bool) -> float:
    """The unit coordinate at which :func:`grid_num_steps` runs ``num_steps`` (before rounding)."""
    if hi <= lo:
        return 0.0
    if log:
        return math.log(max(num_steps, 1) / lo) / math.log(hi / lo)
    return (num_steps - lo) / (hi - lo)


def _check_bounds(name: str, bounds, *, integer: bool) -> tuple[float, float]:
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (lower, upper); got {bounds!r}.") from None
    for label, value in (("lower", lo), ("upper", hi)):
        if not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
            raise ValueError(f"{name} {label} bound must be a finite number; got {value!r}.")
    if integer and (int(lo) != lo or int(hi) != hi):
        raise ValueError(f"{name} bounds must be integers; got {bounds!r}.")
    if lo > hi:
        raise ValueError(
            f"{name} bounds are reversed: lower {lo!r} > upper {hi!r}. Pass ({hi!r}, {lo!r})."
        )
    return lo, hi


def search_space(
    step_size: tuple[float, float],
    num_steps: tuple[int, int],
    *,
    num_step_sizes: int = 200,
    log_step_size: bool = True,
    num_num_steps: int | None = None,
    log_num_steps: bool = False,
) -> SearchSpace:
    """Build the grid of arms over a box of step sizes and leapfrog counts.

    Parameters
    ----------
    step_size
        ``(lower, upper)`` bounds on the step size, both > 0.  Equal bounds fix
        the step size and leave only ``L`` to tune.
    num_steps
        ``(lower, upper)`` integer bounds on the maximum number of leapfrog
        steps ``L``; ``lower >= 1``.  Every integer in between is a candidate.
    num_step_sizes
        Number of grid points along the step size (the paper's "very fine
        grid"); ignored when the bounds are equal.
    log_step_size
        Space the step sizes evenly in ``log`` (default) or linearly (paper).
    num_num_steps, log_num_steps
        An automatic box's ``L`` axis: ``num_num_steps`` columns at unit
        coordinates ``linspace(0, 1, num_num_steps)``, each running
        :func:`grid_num_steps` (log-spaced if ``log_num_steps``; neighbouring
        columns may run the same ``L``).  ``None`` (default): every integer.

    Examples
    --------
    >>> space = search_space((1e-3, 1.0), (1, 100))
    >>> space.shape
    (200, 100)
    """
    eps_lo, eps_hi = _check_bounds("step_size", step_size, integer=False)
    if eps_lo <= 0:
        raise ValueError(f"step_size bounds must be > 0; got lower bound {eps_lo!r}.")
    l_lo, l_hi = _check_bounds("num_steps", num_steps, integer=True)
    if l_lo < 1:
        raise ValueError(f"num_steps lower bound must be >= 1; got {l_lo!r}.")
    if not isinstance(num_step_sizes, (int, np.integer)) or num_step_sizes < 1:
        raise ValueError(f"num_step_sizes must be a positive integer; got {num_step_sizes!r}.")

    num_eps = 1 if eps_lo == eps_hi else int(num_step_sizes)
    if log_step_size:
        eps = np.exp(np.linspace(math.log(eps_lo), math.log(eps_hi), num_eps))
    else:
        eps = np.linspace(eps_lo, eps_hi, num_eps)
    eps[0], eps[-1] = eps_lo, eps_hi  # exact end points despite exp/log rounding
    if num_num_steps:
        if not isinstance(num_num_steps, (int, np.integer)) or num_num_steps < 1:
            raise ValueError(f"num_num_steps must be a whole number > 0 (None: every integer); got {num_num_steps!r}.")
        steps_unit = _unit(int(num_num_steps))
        steps = grid_num_steps(steps_unit, int(l_lo), int(l_hi), log=bool(log_num_steps)).astype(np.int32)
    else:
        steps = np.arange(int(l_lo), int(l_hi) + 1, dtype=np.int32)
        steps_unit = _unit(len(steps))
    return SearchSpace(
        step_sizes=eps.astype(np.float64),
        num_steps=steps,
        step_size_unit=_unit(num_eps),
        num_steps_unit=steps_unit,
        log_step_size=bool(log_step_size),
    )


def _unit(n: int) -> np.ndarray:
    return np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(1)
