"""Rewards for the tuner, computed from running sums over one round.

The paper's objective (ICML 2013, section 3) is the expected squared jumping
distance normalised by the square root of the number of leapfrog steps,

    f(eps, L) = E ||x_{t+1} - x_t||^2 / sqrt(L),

estimated by the mean over the round's iterations.  ESJD alone favours ever
longer trajectories; dividing by ``sqrt(L)`` charges for computation.  We also
offer plain ESJD and ESJD per gradient evaluation (squared jump summed over
the round divided by the leapfrog steps actually taken).

ESJD rewards moving the position, so the tuner settles on trajectories that
carry each (whitened) coordinate to the far side of its distribution, where
its square, and hence the estimate of a variance, has hardly moved.
``esjd_moments`` (not in the paper) also scores the jumps of the centred
squares, ``(z'^2 - z^2)^2 / 2`` with ``z = (x - center) / scale``, and takes
the geometric mean of the two mean jumps before dividing by ``sqrt(L)``: for
independent standard normal draws both mean jumps are 2, so neither side
dominates.  It needs ``center`` (a posterior mean estimate) in
:func:`round_update`; the adapters pass the mean of the mass-matrix window.

Jumps can be measured in a whitened metric: each coordinate divided by a scale
(e.g. the square root of the diagonal inverse mass matrix, i.e. the estimated
posterior standard deviations), so the reward does not depend on the units of
the parameters.

A divergence penalty (``divergence_penalty = kappa``, default 10 in the
adapters, 0 in the paper preset) multiplies any objective's reward by
``exp(-kappa * f)``, ``f`` the fraction of the round's transitions that
diverged.  A divergent transition already adds a zero jump; the penalty goes
further because divergences mark regions (a funnel's neck, a heavy tail)
where a chain can stay stuck for hundreds of iterations at this step size,
an event a 10-iteration round rarely sees but a whole run's ESS does.
On posteriordb's gp_pois_regr one seed in five had a pooled chain stuck for
143 draws without it; with kappa = 10 none of ten seeds did
(docs/decisions.md, "The divergence penalty").  Rounds without
divergences are unaffected.

Adapters update a :class:`RoundStats` once per iteration; no draws are kept.
A user reward (e.g. the thesis's cross-validation reward) is any callable
``reward_fn(stats, max_num_steps) -> float``, or computed by the adapter and
passed straight to the tuner's ``update``.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

__all__ = [
    "RoundStats",
    "round_init",
    "round_update",
    "round_arrays",
    "StepJumps",
    "step_jumps_init",
    "step_jumps_update",
    "step_jumps_estimate",
    "normalized_esjd",
    "esjd",
    "esjd_per_gradient",
    "esjd_moments",
    "normalized_ess",
    "needs_center",
    "default_objective",
    "OBJECTIVES",
    "get_objective",
    "check_objective",
    "NONFINITE_REWARD_MESSAGE",
    "with_divergence_penalty",
    "DEFAULT_DIVERGENCE_PENALTY",
]

DEFAULT_DIVERGENCE_PENALTY = 10.0


class RoundStats(NamedTuple):
    """Running sums over the iterations of one round: arrays, or Python numbers in an eager loop
    (``round_init(None)``; :func:`round_arrays` turns them into the arrays an objective takes).

    Attributes
    ----------
    num_iterations : int32, ()   iterations so far in the round
    num_gradients : int32, ()    leapfrog steps (gradient evaluations) taken
    sum_squared_jump : float, () sum of ``||(x_{t+1} - x_t) / scale||^2``
    sum_acceptance : float, ()   sum of acceptance probabilities
    num_divergent : int32, ()    divergent transitions
    sum_squared_jump_squares : float, ()  sum of ``||z'^2 - z^2||^2 / 2``, ``z = (x - center) / scale``
                                 (0 unless ``round_update`` gets a ``center``)
    sum_squares : float, ()      sum of ``||z'||^2``, the new position's centred whitened square (with ``center``)
    """

    num_iterations: object
    num_gradients: object
    sum_squared_jump: object
    sum_acceptance: object
    num_divergent: object
    sum_squared_jump_squares: object
    sum_squares: object = 0.0


def round_init(xp=np, dtype=None) -> RoundStats:
    """Empty running sums (call at the start of every round).

    ``xp=None``: Python numbers (float64 and int) for an eager loop that updates once per
    iteration (PyMC): the sums then cost a few Python additions instead of NumPy scalar
    operations (~4 us per iteration).  Convert with :func:`round_arrays` before an objective.
    """
    if xp is None:
        return RoundStats(0, 0, 0.0, 0.0, 0, 0.0, 0.0)
    dtype = xp.asarray(0.0).dtype if dtype is None else dtype
    zero_int = xp.asarray(0, dtype=xp.int32)
    zero = xp.asarray(0.0, dtype=dtype)
    return RoundStats(zero_int, zero_int, zero, zero, zero_int, zero, zero)


def round_arrays(stats: RoundStats, xp=np, dtype=None) -> RoundStats:
    """The sums as 0-d arrays with :func:`round_init`'s dtypes (int32 counts), for an objective."""
    dtype = xp.asarray(0.0).dtype if dtype is None else dtype
    counts = ("num_iterations", "num_gradients", "num_divergent")
    return RoundStats(*(xp.asarray(value, dtype=xp.int32 if name in counts else dtype)
                        for name, value in zip(RoundStats._fields, stats)))


def round_update(
    stats: RoundStats,
    previous_position,
    position,
    num_gradients,
    acceptance=0.0,
    is_divergent=False,
    scale=None,
    center=None,
) -> RoundStats:
    """Add one iteration to the round's sums.

    Parameters
    ----------
    previous_position, position : array, shape (dim,)
        The chain's state before and after the iteration (flattened).
    num_gradients : int
        Leapfrog steps taken in this iteration.
    acceptance : float
        Metropolis acceptance probability of the iteration.
    is_divergent : bool
        Whether the trajectory diverged.
    scale : array, shape (dim,), optional
        Per-coordinate scale for the whitened jump; ``None`` = identity.
    center : array, shape (dim,), optional
        Posterior mean estimate: with it the round also sums the jumps of the
        centred, whitened squares (for ``esjd_moments``); ``None`` skips them.
    """
    if _in_python(stats):  # round_init(None): Python numbers
        return _round_update_python(stats, previous_position, position, num_gradients, acceptance, is_divergent,
                                    scale, center)
    xp = stats.sum_squared_jump.__array_namespace__()
    dtype = stats.sum_squared_jump.dtype
    old = xp.asarray(previous_position, dtype=dtype)
    new = xp.asarray(position, dtype=dtype)
    jump = new - old
    if scale is not None:
        jump = jump / xp.asarray(scale, dtype=dtype)
    squares_jump, squares = stats.sum_squared_jump_squares, stats.sum_squares
    if center is not None:
        center = xp.asarray(center, dtype=dtype)
        scale = xp.ones_like(center) if scale is None else xp.asarray(scale, dtype=dtype)
        new_squares = ((new - center) / scale) ** 2
        change = new_squares - ((old - center) / scale) ** 2
        squares_jump = squares_jump + 0.5 * xp.sum(change * change)
        squares = squares + xp.sum(new_squares)
    return RoundStats(
        num_iterations=stats.num_iterations + 1,
        num_gradients=stats.num_gradients + xp.asarray(num_gradients, dtype=xp.int32),
        sum_squared_jump=stats.sum_squared_jump + xp.sum(jump * jump),
        sum_acceptance=stats.sum_acceptance + xp.asarray(acceptance, dtype=dtype),
        num_divergent=stats.num_divergent + xp.asarray(is_divergent, dtype=xp.int32),
        sum_squared_jump_squares=squares_jump,
        sum_squares=squares,
    )


def _round_update_python(stats, previous_position, position, num_gradients, acceptance, is_divergent, scale,
                         center):
    """round_update on Python-number sums (``round_init(None)``): NumPy for the vectors, Python for the rest."""
    jump = np.subtract(position, previous_position, dtype=np.float64)
    if scale is not None:
        jump /= np.asarray(scale, dtype=np.float64)
    squares_jump, squares = stats.sum_squared_jump_squares, stats.sum_squares
    if center is not None:
        scale = 1.0 if scale is None else np.asarray(scale, dtype=np.float64)
        old = (np.subtract(previous_position, center, dtype=np.float64) / scale) ** 2
        new = (np.subtract(position, center, dtype=np.float64) / scale) ** 2
        change = new - old
        squares_jump = squares_jump + 0.5 * float(change @ change)
        squares = squares + float(new.sum())
    return RoundStats(stats.num_iterations + 1, stats.num_gradients + int(num_gradients),
                      stats.sum_squared_jump + float(jump @ jump), stats.sum_acceptance + float(acceptance),
                      stats.num_divergent + int(bool(is_divergent)), squares_jump, squares)


class StepJumps(NamedTuple):
    """One round's jumps by trajectory length, for :func:`step_jumps_estimate` (Python numbers: an
    eager loop updates them once per iteration, where NumPy's per-call cost would dominate).

    ``sums[l - 1]``: summed over the round's trajectories that ran at least ``l`` leapfrog steps,
    the acceptance probability had the trajectory stopped after ``l`` steps times the squared
    (whitened) jump from its start to there; ``counts[l - 1]``: how many such trajectories.
    """

    sums: tuple
    counts: tuple


def step_jumps_init(max_num_steps) -> StepJumps:
    """Empty per-length sums for a round whose arm has ``L = max_num_steps``."""
    return StepJumps((0.0,) * int(max_num_steps), (0,) * int(max_num_steps))


def step_jumps_update(jumps: StepJumps, step_values) -> StepJumps:
    """Add one trajectory: ``step_values[l - 1]`` = acceptance probability at step ``l`` times the
    squared jump to there (0 from a failed or divergent step on), for every step it ran (steps
    beyond ``L`` are ignored)."""
    n = min(len(step_values), len(jumps.sums))
    sums = tuple(total + float(value) for total, value in zip(jumps.sums[:n], step_values)) + jumps.sums[n:]
    counts = tuple(count + 1 for count in jumps.counts[:n]) + jumps.counts[n:]
    return StepJumps(sums, counts)


def step_jumps_estimate(jumps: StepJumps, min_num_steps=1) -> float:
    """The round's mean squared jump estimated from every leapfrog step of its trajectories.

    A transition of ``l`` steps, ``l`` uniform on ``{lo..L}``, jumps ``a_l J_l`` in expectation
    (``a_l`` its acceptance probability, ``J_l`` the squared jump of its proposal).  Each trajectory
    that ran ``n`` steps shows ``a_l J_l`` for every ``l <= n`` from one momentum draw, so the mean
    over ``l`` of the per-length means estimates the realised jump's expectation without the noise
    of the accept/reject coin and of the draw of ``l`` (lengths no trajectory of the round reached
    are left out).  For one chain's 10-transition rounds (PyMC) the tuner then ranks arms better:
    on Pima over 50 seeds its min ESS per gradient rose from 1.16x to 1.26x PyMC's NUTS
    (docs/decisions.md, "AHMC in PyMC").  NaN when no length ``>= lo`` was reached.
    """
    low = max(int(min_num_steps), 1) - 1
    means = [total / count for total, count in zip(jumps.sums[low:], jumps.counts[low:]) if count > 0]
    return sum(means) / len(means) if means else math.nan


# The built-in objectives also take sums kept in Python numbers (``round_init(None)``) and then
# return a Python float: an eager loop (PyMC) evaluates them once per round between leapfrog
# trajectories that evict NumPy's code from the CPU caches, where their dozen 0-d array operations
# cost about twice what a micro-benchmark shows (BENCHMARKS.md@036b7d1, "AHMC in PyMC").  The two helpers
# below carry that choice; the objectives are written once for both.
def _in_python(stats: RoundStats) -> bool:
    return type(stats.sum_squared_jump) is float  # not np.float64, a subclass of float


def _safe_divide(numerator, denominator):
    """``numerator / denominator``, NaN where the denominator is 0 (an empty round)."""
    if type(numerator) is float:
        return numerator / denominator if denominator > 0 else math.nan
    xp = numerator.__array_namespace__()
    denominator = xp.asarray(denominator, dtype=numerator.dtype)
    positive = denominator > 0
    # Double where: no division by zero even in the branch that is not taken.
    safe = xp.where(positive, denominator, xp.ones_like(denominator))
    return xp.where(positive, numerator / safe, xp.asarray(np.nan, dtype=numerator.dtype))


def _sqrt(value, like):
    """``sqrt(value)`` as ``like``: a Python float, or an array of like's namespace and dtype."""
    if type(like) is float:
        return math.sqrt(value)
    xp = like.__array_namespace__()
    return xp.sqrt(xp.asarray(value, dtype=like.dtype))


def normalized_esjd(stats: RoundStats, max_num_steps):
    """Mean squared jump / sqrt(L): the paper's default reward."""
    mean_jump = _safe_divide(stats.sum_squared_jump, stats.num_iterations)
    return mean_jump / _sqrt(max_num_steps, mean_jump)


def esjd(stats: RoundStats, max_num_steps):
    """Mean squared jump per iteration (Pasarica & Gelman 2010)."""
    return _safe_divide(stats.sum_squared_jump, stats.num_iterations)


def esjd_per_gradient(stats: RoundStats, max_num_steps):
    """Squared jump per gradient evaluation, over the round."""
    return _safe_divide(stats.sum_squared_jump, stats.num_gradients)


def esjd_moments(stats: RoundStats, max_num_steps):
    """Geometric mean of the mean squared jump of the whitened position and of its centred
    square, / sqrt(L): a reward for moving both means and variances (needs ``center``)."""
    mean_jump = _safe_divide(stats.sum_squared_jump, stats.num_iterations)
    mean_squares_jump = _safe_divide(stats.sum_squared_jump_squares, stats.num_iterations)
    return _sqrt(mean_jump * mean_squares_jump, mean_jump) / _sqrt(max_num_steps, mean_jump)


esjd_moments.needs_center = True


def _lag_one_ess(mean_jump, variance, like):
    """Effective draws per draw of a chain whose lag-1 autocorrelation is ``1 - mean_jump / (2 variance)``,
    as for an AR(1) chain: ``(1 - rho) / (1 + rho)``.  ``rho`` is kept in ``[-0.9, 1]``: a round's few jumps
    can exceed twice the variance by chance, and the bound keeps such a round from scoring without limit.
    A round that sat at the centre (variance 0, as when a flat density's step size overflowed) scores 0."""
    if type(like) is float:
        rho = min(max(1.0 - mean_jump / (2.0 * variance), -0.9), 1.0) if variance > 0 else 1.0
        return (1.0 - rho) / (1.0 + rho)
    xp = like.__array_namespace__()
    positive = variance > 0
    safe = xp.where(positive, variance, xp.ones_like(variance))
    rho = xp.where(positive, xp.clip(1.0 - mean_jump / (2.0 * safe), -0.9, 1.0), xp.ones_like(variance))
    return (1.0 - rho) / (1.0 + rho)


def _worse_ess_per_draw(stats: RoundStats):
    """The round's effective draws per draw, the worse of the means' and the squares' (:func:`_lag_one_ess`).

    In whitened, centred coordinates ``z`` the jump of ``z`` is set against the variance of ``z``
    (the round's mean ``||z||^2``), the jump of ``z^2`` against a Gaussian's variance of ``z^2``, twice
    that (each whitened ``z_i`` has variance about 1, and ``Var z_i^2 = 2`` for a normal; a round's
    fourth powers would be far noisier).  On a Gaussian target, where HMC turns each coordinate by an
    angle, the chain of ``z`` and that of ``z^2`` are then AR(1) at every lag and this is exact.
    """
    mean_jump = _safe_divide(stats.sum_squared_jump, stats.num_iterations)
    mean_squares_jump = 2.0 * _safe_divide(stats.sum_squared_jump_squares, stats.num_iterations)
    variance = _safe_divide(stats.sum_squares, stats.num_iterations)
    means_ess = _lag_one_ess(mean_jump, variance, mean_jump)
    squares_ess = _lag_one_ess(mean_squares_jump, 2.0 * variance, mean_jump)
    if type(mean_jump) is float:
        worse = math.nan if math.isnan(means_ess) or math.isnan(squares_ess) else min(means_ess, squares_ess)
        return worse, _safe_divide(float(stats.num_gradients), stats.num_iterations)  # NaN for an empty round
    xp = mean_jump.__array_namespace__()
    steps_per_draw = _safe_divide(xp.asarray(stats.num_gradients, dtype=mean_jump.dtype), stats.num_iterations)
    return xp.minimum(means_ess, squares_ess), steps_per_draw


def normalized_ess(stats: RoundStats, max_num_steps):
    """The strict ESS per draw (the worse of the means' and the squares', :func:`_worse_ess_per_draw`)
    over the square root of the leapfrog steps per draw: the paper's charge for computation, on the
    benchmark's headline metric instead of the jump.  Needs ``center``.

    Charging every gradient (ESS per gradient) settles on ``L = 1`` where a lag-1 estimate misses the
    slow directions (eight schools, sblrc, gp_pois_regr): docs/decisions.md, "The reward on the strict
    metric: ESS, not jumps".
    """
    ess, steps_per_draw = _worse_ess_per_draw(stats)
    return ess / _sqrt(steps_per_draw, ess)


normalized_ess.needs_center = True


def default_objective(has_center: bool, one_chain_rounds: bool = False) -> str:
    """The reward when ``objective=None``: ``"normalized_ess"`` where the warm-up estimates the posterior
    mean it needs (an adapted mass matrix with a metric phase) and a round pools the chains, else the
    paper's ``"normalized_esjd"`` (RMHMC, a fixed mass matrix, and the PyMC step, whose rounds hold one
    chain's 10 draws: there the lag-1 estimate lost, 0.25x NUTS on the correlated 2-d Gaussian).
    docs/decisions.md, "The reward on the strict metric: ESS, not jumps"."""
    return "normalized_ess" if has_center and not one_chain_rounds else "normalized_esjd"


def needs_center(objective: Callable) -> bool:
    """Whether the adapter must pass a ``center`` to :func:`round_update` for this objective."""
    return bool(getattr(objective, "needs_center", False))


OBJECTIVES: dict[str, Callable] = {
    "normalized_esjd": normalized_esjd,
    "esjd": esjd,
    "esjd_per_gradient": esjd_per_gradient,
    "esjd_moments": esjd_moments,
    "normalized_ess": normalized_ess,
}


def with_divergence_penalty(objective: Callable, penalty: float) -> Callable:
    """``objective``'s reward times ``exp(-penalty * divergent fraction of the round)``."""

    def penalized(stats: RoundStats, max_num_steps):
        reward = objective(stats, max_num_steps)
        if _in_python(stats):
            return float(reward) * math.exp(-penalty * stats.num_divergent / max(stats.num_iterations, 1))
        xp = reward.__array_namespace__() if hasattr(reward, "__array_namespace__") else np
        reward = xp.asarray(reward)
        dtype = reward.dtype
        iterations = xp.asarray(stats.num_iterations, dtype=dtype)
        fraction = xp.asarray(stats.num_divergent, dtype=dtype) / xp.maximum(iterations, xp.asarray(1.0, dtype=dtype))
        return reward * xp.exp(xp.asarray(-penalty, dtype=dtype) * fraction)

    penalized.__name__ = f"{getattr(objective, '__name__', 'objective')}_divergence_penalized"
    penalized.needs_center = needs_center(objective)
    return penalized


def _check_penalty(divergence_penalty) -> float:
    try:
        value = float(divergence_penalty)
    except (TypeError, ValueError):
        value = float("nan")
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(
            f"divergence_penalty must be a finite number >= 0 (0 turns it off; default "
            f"{DEFAULT_DIVERGENCE_PENALTY}); got {divergence_penalty!r}."
        )
    return value


# A round as the adapters see it (10 iterations of L = 8, half the steps on average, 80% acceptance),
# for checking a user's reward before any draw.
_TYPICAL_ROUND = RoundStats(num_iterations=10, num_gradients=45, sum_squared_jump=12.0, sum_acceptance=8.0,
                            num_divergent=0, sum_squared_jump_squares=12.0, sum_squares=30.0)


def check_objective(objective: Callable) -> None:
    """Raise a ValueError naming ``objective`` unless it maps a typical round's sums (0-d NumPy
    arrays, as :func:`round_arrays` gives them) and ``max_num_steps`` to one finite number.

    A reward that fails here would fail or be ignored in every round; one that is sometimes
    non-finite in a run counts as the worst reward so far and the adapters warn about it.
    """
    name = getattr(objective, "__name__", repr(objective))
    fix = ("objective must be a callable (stats: RoundStats, max_num_steps) -> float, finite on every "
           "round (e.g. ahmc.core.objectives.normalized_esjd), or one of " + str(sorted(OBJECTIVES)))
    try:
        reward = objective(round_arrays(_TYPICAL_ROUND), 8)
        value = np.asarray(reward, dtype=float)
    except Exception as err:  # the user's function: report whatever it raised, with the contract
        raise ValueError(f"objective {name} failed on a typical round's sums ({type(err).__name__}: {err}); "
                         f"{fix}.") from err
    if value.shape != () or not np.isfinite(value):
        raise ValueError(f"objective {name} returned {reward!r} on a typical round's sums {tuple(_TYPICAL_ROUND)} "
                         f"with max_num_steps=8; {fix}.")


NONFINITE_REWARD_MESSAGE = (
    "ahmc: a round's reward was not finite (NaN or inf); the tuner counts such a round as the worst "
    "reward so far, so the arm it scored is avoided. If it happens often the tuner learns little: "
    "check the objective (or the predictive reward) for divisions by zero or log of 0."
)


def get_objective(objective: str | Callable, divergence_penalty: float = 0.0) -> Callable:
    """Resolve an objective name or a user callable ``(stats, max_num_steps) -> reward``.

    ``divergence_penalty > 0`` wraps it with :func:`with_divergence_penalty`.
    """
    penalty = _check_penalty(divergence_penalty)
    if callable(objective):
        resolved = objective
        check_objective(objective)
    elif objective not in OBJECTIVES:
        raise ValueError(
            f"objective must be one of {sorted(OBJECTIVES)} or a callable "
            f"(stats, max_num_steps) -> reward; got {objective!r}."
        )
    else:
        resolved = OBJECTIVES[objective]
    return with_divergence_penalty(resolved, penalty) if penalty > 0 else resolved
