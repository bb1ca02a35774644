"""The warm-up plan and the round schedule, shared by every adapter (NumPy, or any array namespace).

A run of ``num_warmup`` warm-up iterations is planned once, before anything compiles:

    |<---------- metric phase ---------->|<-------- GP rounds -------->|  sampling: rounds, p_i -> 0
    | fast | slow windows (mass matrix) | fast |  round_length its. each  |

* the metric phase (``metric_fraction`` of warm-up) adapts the step size by dual averaging, with
  ``L = ceil(warmup_integration_time / eps)`` (:func:`warmup_num_steps`), and the mass matrix in
  Stan's windows (:func:`stan_schedule`);
* at its end the automatic search box is set from the dual-averaging step size ``eps*``
  (:func:`automatic_box`);
* ``k``, the annealing constant of the adaptation probability, is the number of GP rounds in
  warm-up unless given, so ``p_i = 1`` through warm-up; ``freeze_after="warmup"`` freezes the arm
  after them.

:func:`plan_warmup` computes all of this from the options; the JAX engine and the PyMC step both
read their schedule from it, so no adapter computes any of it itself.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["WarmupPlan", "plan_warmup", "metric_phase_length", "stan_schedule", "warmup_num_steps",
           "metric_phase_max_steps", "automatic_box", "first_unit_num_steps", "EARLY_MAX_STEPS"]

# Leapfrog cap of the metric phase before the first mass-matrix estimate.  L = ceil(T_w / eps) assumes
# a metric that roughly whitens the posterior; with the initial identity and a posterior sd of 0.01 it
# asks for 200 steps (measured before this cap: 80-130 gradients per iteration over the first 100
# iterations on kidiq, earnings, sblrc, arK, gauss_mix and the 10-d diagonal Gaussian, most of their
# warm-up).  32 steps still cross a typical set at that scale; the chains only need to reach it.
EARLY_MAX_STEPS = 32


class WarmupPlan(NamedTuple):
    """The static schedule of a run (Python and NumPy values).

    num_warmup           warm-up iterations
    metric_phase_length  iterations before the GP starts (0: GP rounds from the first iteration)
    round_length         iterations per GP round (``m``)
    num_warmup_rounds    GP rounds that end within warm-up
    k                    annealing constant: ``p_i`` decays from round ``k`` on
    freeze_rounds        the first round whose end cannot move the arm (None: never)
    is_slow              (metric_phase_length,) bool: iteration feeds the mass-matrix window
    is_window_end        (metric_phase_length,) bool: a mass-matrix window closes after it
    is_check             (metric_phase_length,) bool: the chains are checked after it (end of the
                         initial fast window and of every slow window)
    first_window_end     last iteration before the first mass-matrix estimate (-1: none)
    """

    num_warmup: int
    metric_phase_length: int
    round_length: int
    num_warmup_rounds: int
    k: int
    freeze_rounds: int | None
    is_slow: np.ndarray
    is_window_end: np.ndarray
    is_check: np.ndarray
    first_window_end: int


def stan_schedule(num_iterations: int, initial_buffer: int = 75, final_buffer: int = 50,
                  first_window: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Stan's warm-up windows: per iteration ``(is_slow, is_window_end)``, as BlackJAX's ``build_schedule``.

    An initial fast buffer (step size only), slow windows of 25, 50, 100, ... iterations that
    estimate the mass matrix afresh (the last one stretched to the final buffer), and a final fast
    buffer; warm-ups too short for the default sizes use 15% / 75% / 10%, and under 20 iterations
    there are no windows.
    """
    is_slow = np.zeros(num_iterations, bool)
    is_end = np.zeros(num_iterations, bool)
    if num_iterations < 20:
        return is_slow, is_end
    if initial_buffer + first_window + final_buffer > num_iterations:
        initial_buffer, final_buffer = int(0.15 * num_iterations), int(0.1 * num_iterations)
        first_window = num_iterations - initial_buffer - final_buffer
    final_start = num_iterations - final_buffer
    start, size = initial_buffer, first_window
    while start < final_start:
        if 3 * size <= final_start - start:
            current, size = size, 2 * size
        else:  # the next window would not fit: stretch this one to the final buffer
            current = final_start - start
        is_slow[start:start + current] = True
        is_end[start + current - 1] = True
        start += current
    return is_slow, is_end


def metric_phase_length(num_warmup: int, metric_fraction: float, *, auto_box: bool, adapt_mass_matrix: bool) -> int:
    """Warm-up iterations before the GP rounds: none with a user box and a fixed mass matrix (nothing to
    learn first, the paper's setting), else ``round(metric_fraction * num_warmup)``."""
    return int(round(metric_fraction * num_warmup)) if (auto_box or adapt_mass_matrix) else 0


def plan_warmup(num_warmup: int, *, metric_fraction: float, round_length: int, adapt_mass_matrix: bool,
                auto_box: bool, k: int | None = None, freeze_after=None) -> WarmupPlan:
    """The schedule for ``num_warmup`` iterations (options as in :class:`ahmc.core.Config`).

    With a user box and a fixed mass matrix there is nothing to learn before the rounds (the
    paper's setting): no metric phase.  ``freeze_rounds`` is the core tuner's ``freeze_after``: round
    ``i`` may move the arm while ``i < freeze_rounds``, so ``"warmup"`` (PyMC: ``"tune"``) lets every
    warm-up round adapt and the arm is fixed from the first round of sampling on.
    """
    metric_phase = metric_phase_length(num_warmup, metric_fraction, auto_box=auto_box,
                                       adapt_mass_matrix=adapt_mass_matrix)
    num_rounds = max(num_warmup - metric_phase, 0) // round_length
    if freeze_after in ("warmup", "tune"):  # every warm-up round may move the arm; none after
        freeze_rounds = num_rounds + 1
    elif freeze_after is None or (isinstance(freeze_after, (int, np.integer)) and not isinstance(freeze_after, bool)):
        freeze_rounds = freeze_after
    else:
        raise ValueError(f"freeze_after must be None, an integer number of rounds or 'warmup'; got {freeze_after!r}.")
    if metric_phase > 0:
        slow, ends = stan_schedule(metric_phase)
        # Chain checks: the end of the initial fast window and of every slow window.
        is_check = ends | np.append(~slow[:-1] & slow[1:], False)
        is_slow, is_window_end = slow & adapt_mass_matrix, ends & adapt_mass_matrix
    else:
        is_slow = is_window_end = is_check = np.zeros(1, bool)
    first_window_end = int(np.argmax(is_window_end)) if np.any(is_window_end) else -1
    return WarmupPlan(
        num_warmup=int(num_warmup), metric_phase_length=metric_phase, round_length=int(round_length),
        num_warmup_rounds=num_rounds, k=int(k) if k is not None else max(num_rounds, 1),
        freeze_rounds=freeze_rounds, is_slow=is_slow, is_window_end=is_window_end, is_check=is_check,
        first_window_end=first_window_end)


def warmup_num_steps(step_size, integration_time: float, max_steps: int, xp=np):
    """The metric phase's ``L``: ``ceil(integration_time / step_size)`` in ``[1, max_steps]`` (1 for NaN)."""
    steps = xp.ceil(integration_time / step_size)
    return xp.clip(xp.nan_to_num(steps, nan=1.0), 1, max_steps).astype(xp.int32)


def metric_phase_max_steps(plan: WarmupPlan, iteration, max_steps: int, xp=np):
    """The cap on the metric phase's ``L`` at ``iteration``: :data:`EARLY_MAX_STEPS` until the plan's first
    mass-matrix window closes (the metric is still the initial identity there), ``max_steps`` afterwards.
    Every route's warm-up reads it (``iteration`` may be traced)."""
    return xp.where(iteration <= plan.first_window_end, min(max_steps, EARLY_MAX_STEPS), max_steps)


def automatic_box(eps_star, step_size_factors, max_integration_time: float, num_steps_cap: int, xp=np,
                  max_num_steps: int | None = None):
    """The automatic search box around the warm-up's step size ``eps*``.

    ``(step_size_bounds, num_steps_upper)``: ``eps* x step_size_factors`` and
    ``L <= ceil(max_integration_time / eps*)`` within ``[2, num_steps_cap]`` (and at most
    ``max_num_steps``, e.g. a super-transition's budget ``2 B - 1``); ``L``'s lower end is 1.
    """
    lo, hi = step_size_factors
    upper = xp.clip(xp.ceil(max_integration_time / eps_star), 2, num_steps_cap).astype(xp.int32)
    if max_num_steps is not None:
        upper = xp.minimum(upper, max(2, int(max_num_steps)))
    return eps_star * xp.asarray((lo, hi), dtype=xp.asarray(eps_star).dtype), upper


def first_unit_num_steps(max_integration_time: float) -> float:
    """Unit coordinate of the first round's ``L`` in the automatic box: a mean integration time of ~1.5."""
    return min(1.0, 3.0 / max_integration_time)


def steps_for(integration_time: float, step_size: float, cap: int) -> int:
    """``ceil(integration_time / step_size)`` in ``[1, cap]``, in Python numbers (1 for a non-finite ratio)."""
    ratio = integration_time / step_size if step_size > 0 else math.inf
    return int(min(max(math.ceil(ratio), 1), cap)) if math.isfinite(ratio) else 1
