"""The engine's warm-up adaptation: pooled dual averaging, the mass-matrix windows, chain checks, the box.

During the metric phase (:class:`ahmc.core.schedule.WarmupPlan`) every iteration advances, pooled
over chains, BlackJAX's dual averaging of the step size and its Welford mass-matrix estimator in
Stan's windows; at the end of Stan's initial fast window and of every slow window a chain whose
mean log density over the window is far below the median chain's, still is at the check, and did
not climb (trapped in a region of negligible mass) restarts from another chain's position
(``restart_lost_chains``; 3+ chains), since the pooled dual averaging would otherwise follow it
down to a useless step size.  At the metric phase's last iteration the search box is set from the
dual-averaging step size (:func:`ahmc.core.schedule.automatic_box`).  Dual averaging starts where the
phase's first iterations' step-size search (:func:`search_step_size`) stopped.

:func:`build_warmup` returns the adaptation as ``init`` (its state for the chains' start) and
``update`` (one iteration, after the transition); the sampling phase does not trace it.
"""

from __future__ import annotations

import logging
import warnings
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from blackjax.adaptation.metric_recipes import REGISTRY
from blackjax.adaptation.step_size import dual_averaging_adaptation

from ahmc.core.mass_matrix import (fisher_misfit, prefers_dense, raise_to_draws, rescale_diagonal,
                                   rescue_unexplored, shrink_correlations)
from ahmc.core.schedule import EARLY_MAX_STEPS, WarmupPlan, automatic_box, metric_phase_max_steps, warmup_num_steps

from ._jax_kernel import inverse_cholesky
from ._jax_sharding import chain_median, replicated

__all__ = ["WindowStats", "WarmupState", "StepSizeSearch", "search_step_size", "Warmup", "build_warmup", "far_below",
           "climbing", "lost_chains", "pooled_acceptance", "EARLY_MAX_STEPS", "ScaleMoments", "MetricAdaptation",
           "rescue_scales"]


class WindowStats(NamedTuple):
    """Per-chain sums over the current check window (reset at every chain check).

    count : int32, ()          iterations in the window (shared by all chains)
    logdensity : float, (C,)   sum of the log density after each transition
    logdensity_sq : float, (C,) sum of its square
    acceptance : float, (C,)   sum of the acceptance probabilities
    logdensity_trend : float, (C,) sum of ``t * logdensity_t`` (t = 1..count), for the trend
    """

    count: Any
    logdensity: Any
    logdensity_sq: Any
    acceptance: Any
    logdensity_trend: Any

LOST_GAP_SDS = 10.0  # a lost chain's mean log density is this many within-chain sds below the median chain's
LOST_GAP_MIN = 10.0  # ... and at least this many nats below
STUCK_ACCEPTANCE = 0.05  # a chain accepting less than this on average over the window is stuck


def _window_moments(window: WindowStats):
    n = jnp.maximum(window.count, 1).astype(window.logdensity.dtype)
    mean = window.logdensity / n
    var = jnp.maximum(window.logdensity_sq / n - mean * mean, 0.0)
    return n, mean, var


def pooled_acceptance(accept, early):
    """The acceptance rate the pooled dual averaging sees: the median over chains before the first
    mass-matrix estimate (``early``), the mean afterwards.

    Early on a chain can sit in a local mode accepting almost nothing until the first chain
    check restarts it; with the mean, that one chain drags every chain's step size down by orders
    of magnitude (measured on posteriordb's gauss_mix: eps 0.0005 instead of 0.01, 120 gradients
    per iteration for 150 iterations).  Later the windows restart the dual averaging and ``eps*``
    comes from the mean, as in Stan.
    """
    return jnp.where(early, chain_median(accept), jnp.mean(accept))


def far_below(window: WindowStats, logdensity=None):
    """(C,) bool: chains whose mean log density over the window is far below the median chain's.

    "Far" is ``LOST_GAP_SDS`` times the typical within-chain standard deviation
    of the log density (``spread``: median over chains) and at least
    ``LOST_GAP_MIN`` nats.  In a d-dimensional Gaussian the log density has sd
    ``sqrt(d / 2)``, and a chain 10 such sds below the others is not in the
    typical set.  The median keeps one chain on a spurious high-density spike
    from condemning the others.  With ``logdensity`` (the chains' current
    values) the chain must also still be that far below now: a chain that
    arrived during the window is not lost.  Needs 2+ chains.
    """
    _, mean, var = _window_moments(window)
    spread = jnp.sqrt(chain_median(var))
    threshold = jnp.maximum(LOST_GAP_SDS * spread, LOST_GAP_MIN)
    far = (chain_median(mean) - mean > threshold) & (window.count > 1)
    if logdensity is not None:
        far &= chain_median(mean) - logdensity > threshold
    return far


def climbing(window: WindowStats):
    """(C,) bool: chains whose log density rose over the window by more than 3 typical sds.

    The rise is the least-squares slope of the log density against the
    iteration, times the window length; the typical sd is the median over
    chains of the within-window sd.  A chain still on its way from a far-off
    start rises by many of them; a chain at equilibrium, or trapped in a local
    mode, rises by noise only (about one sd over 75 autocorrelated iterations).
    """
    _, _, var = _window_moments(window)
    return _window_rise(window) > 3.0 * jnp.sqrt(chain_median(var))


def _window_rise(window: WindowStats):
    """(C,): each chain's least-squares slope of the log density against the iteration, times the window length."""
    n, _, _ = _window_moments(window)
    mean_t = (n + 1.0) / 2.0
    return 12.0 * (window.logdensity_trend - mean_t * window.logdensity) / jnp.maximum(n * n - 1.0, 1.0)


def lost_chains(window: WindowStats, logdensity=None, remaining=None):
    """(C,) bool: chains to restart: far below the median chain, now too (:func:`far_below`), and not
    climbing, or climbing too slowly to arrive within ``remaining`` iterations.

    A chain still climbing is left alone: it may be heading for a region the
    others have not found, which the sampling phase's R-hat should get to see.
    A chain that sits far below the others without rising is trapped (e.g. in
    a local mode of negligible mass) and would drag the pooled step size down.
    So would a chain that rises, but at its window's rate would still be below
    the median chain when the metric phase ends (``remaining`` iterations from
    now; ``None``: no deadline): its draws would enter the pooled mass-matrix
    estimate as a transient (measured: earnings with a dense matrix, one chain
    6,700 nats below the others and rising ~5 nats per iteration; the pooled
    estimate, dominated by that chain's offset, shrank the step size to 1e-4
    and the chain never arrived).
    """
    far, trapped = far_below(window, logdensity), ~climbing(window)
    if remaining is None:
        return far & trapped
    n, mean, _ = _window_moments(window)
    gap = chain_median(mean) - (mean if logdensity is None else logdensity)
    late = gap > jnp.maximum(_window_rise(window) / n, 0.0) * remaining
    return far & (trapped | late)


def _warn_if_lost(operand, compare_chains=True):
    """End of warm-up: warn (host callback) about chains far below the others, or stuck, over the last window,
    and about a step size that grew without bound or collapsed."""
    window, logdensity, now, step_size, whitened_step_size = operand
    count = jnp.maximum(window.count, 1).astype(window.logdensity.dtype)
    lost = far_below(window, logdensity) if compare_chains else jnp.zeros(window.logdensity.shape, bool)
    jax.debug.callback(_warn_host, *replicated((lost, window.acceptance / count, window.logdensity / count)),
                       now, step_size, whitened_step_size)


def _step_in_parameter_units(da_state, inverse_mass_matrix):
    """The dual-averaging step size times the mass matrix's largest scale: what grows without bound on a flat
    direction, whether the step size or the (Fisher) matrix takes the growth."""
    variances = jnp.diag(inverse_mass_matrix) if inverse_mass_matrix.ndim == 2 else inverse_mass_matrix
    return jnp.exp(da_state.log_step_size) * jnp.sqrt(jnp.max(variances))


#: A warm-up step size (in the parameters' units) beyond this, or not finite, means the log density is flat
#: along some direction at every scale the search tried: an improper posterior.
FLAT_STEP_SIZE = 1e10

IMPROPER_MESSAGE = (
    "ahmc: the warm-up's step size (in the parameters' units) grew to {eps:.3g}: the log density is flat along some direction at every "
    "scale tried, as in an improper posterior (a flat prior that no likelihood term bounds). The draws then keep "
    "growing without bound, or cannot move once the step overflows, and represent no posterior. Give every "
    "parameter a proper prior, or check that the data enter the likelihood.")


#: A warm-up step size (in the mass matrix's units, where the posterior's scales are about 1) below this
#: moves a chain less than 1e-3 of a standard deviation per iteration even at the largest L: it has collapsed.
COLLAPSED_STEP_SIZE = 1e-6

COLLAPSED_MESSAGE = (
    "ahmc: the warm-up's step size collapsed to {eps:.2g} (in the mass matrix's units, where the posterior's "
    "scales are about 1): the chains barely move, and their draws represent no posterior. A chain may sit where "
    "every step diverges (a funnel's neck: reparametrize, e.g. non-centred) or where the log density or its "
    "gradient is not finite. Check R-hat and the divergences, start the chains elsewhere (init_params / initial "
    "positions), or give step_size_bounds=(lo, hi) and num_steps_bounds=(lo, hi).")


_log = logging.getLogger("ahmc")


def warn_from_compiled(message: str) -> None:
    """``warnings.warn(message)`` from a host callback inside a compiled run.

    A warnings filter that turns the warning into an error (``-W error``, pytest's ``filterwarnings =
    error``) cannot stop the run cleanly from there: the exception aborts the compiled program (JAX reports
    an internal error) and every draw of the run is lost. Under such a filter the message goes to the
    ``ahmc`` logger instead, and the run finishes."""
    try:
        warnings.warn(message, UserWarning, stacklevel=3)
    except Warning:
        _log.warning(message)


def _warn_host(lost, acceptance, mean_logdensity, now=True, step_size=1.0, whitened_step_size=1.0):
    if not np.all(now):  # a vmapped cond runs this branch at every iteration: only the last one counts
        return
    eps = np.asarray(step_size, dtype=float).reshape(-1)
    if np.any(~np.isfinite(eps) | (eps > FLAT_STEP_SIZE)):
        warn_from_compiled(IMPROPER_MESSAGE.format(eps=float(np.nanmax(np.where(np.isfinite(eps), eps, np.inf)))))
        return
    whitened = np.asarray(whitened_step_size, dtype=float).reshape(-1)
    if np.any(whitened < COLLAPSED_STEP_SIZE):
        warn_from_compiled(COLLAPSED_MESSAGE.format(eps=float(np.min(whitened))))
    lost, acceptance = np.asarray(lost, bool).reshape(-1), np.asarray(acceptance).reshape(-1)
    mean_logdensity = np.asarray(mean_logdensity).reshape(-1)
    stuck = acceptance < STUCK_ACCEPTANCE
    if not (lost.any() or stuck.any()):
        return
    parts = []
    if lost.any():
        parts.append(f"chain(s) {np.flatnonzero(lost).tolist()} have a mean log density far below the other "
                     f"chains' ({np.round(np.asarray(mean_logdensity), 1).tolist()})")
    if stuck.any():
        parts.append(f"chain(s) {np.flatnonzero(stuck).tolist()} accepted almost no proposals "
                     f"(mean acceptance {np.round(acceptance, 3).tolist()})")
    warn_from_compiled(
        "ahmc: at the end of warm-up " + "; ".join(parts) + ". Such a chain is stuck (e.g. in a "
        "negligible-mass local mode) and its draws do not represent the posterior: check R-hat, start the "
        "chains elsewhere (init_params / initial positions), run more warm-up, or use 3+ chains so that "
        "the warm-up can restart lost chains.")


class SearchBox(NamedTuple):
    """The box the tuner searches (arrays; traced when chosen automatically).

    step_size : float, (2,)   ``(lower, upper)`` step size
    num_steps : int32, (2,)   ``(lower, upper)`` maximum number of leapfrog steps ``L``
    """

    step_size: Any
    num_steps: Any


class StepSizeSearch(NamedTuple):
    """The initial step-size search's progress (:func:`search_step_size`).

    active : bool, ()        the search still runs (its iterations take one leapfrog step)
    direction : int32, ()    +1 while the step size doubles, -1 while it halves, 0 before the first result
    """

    active: Any
    direction: Any


class WarmupState(NamedTuple):
    """What one warm-up iteration changes besides the chains (the engine state's fields of the same names)."""

    step_size_adaptation: Any
    mass_matrix_adaptation: Any
    inverse_mass_matrix: Any
    whitening: Any
    center: Any
    box: SearchBox
    window: WindowStats
    step_size_search: Any = None


class Warmup(NamedTuple):
    """The warm-up adaptation (:func:`build_warmup`).

    ``step_size_state(eps)``, ``mass_matrix_state(dim, dtype, dense, num_chains)`` and ``window_state(C, dtype)``: initial
    states; ``parameters(state)``: ``(step size, L, early)`` of a metric-phase iteration;
    ``update(rng_key, state, new, acceptance, early) -> (new, WarmupState, restarted, flat)``: after the
    chains' transition (``new``: their ``HMCState``), restarts lost chains, advances the adapters and, at
    the metric phase's last iteration, sets the search box; ``flat``: the chains' flattened positions.
    """

    step_size_state: Callable
    mass_matrix_state: Callable
    window_state: Callable
    parameters: Callable
    update: Callable
    accumulate: Callable


def _is_dense(matrix) -> bool:
    """Static: a (d, d) inverse mass matrix (dense_mass=True, or "auto" up to DENSE_AUTO_MAX_DIM)."""
    return matrix.ndim == 2


def _fixed_dtypes(tree, dtype):
    """Floats in ``dtype``, integers (BlackJAX's counters, some Python ints) in JAX's default integer type
    (BlackJAX indexes with them next to literals): scan carries and cond branches then agree."""
    int_dtype = jnp.asarray(0).dtype

    def fix(x):
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x.astype(int_dtype) if jnp.issubdtype(x.dtype, jnp.integer) else x
    return jax.tree.map(fix, tree)


#: Rows of the low-rank estimator's draw buffer at most (pooled over chains; the latest draws are kept).
LOW_RANK_MAX_BUFFER = 2048


def _longest_window(plan: WarmupPlan) -> int:
    """The most slow-window iterations between two window ends (the low-rank buffer's length per chain)."""
    longest = run = 0
    for slow, end in zip(plan.is_slow, plan.is_window_end):
        run = run + 1 if slow else run
        longest = max(longest, run)
        run = 0 if end else run
    return max(longest, 1)


def _recipe_cores(recipe: str) -> dict:
    """``{dense: MetricCore}``: BlackJAX's estimator(s) for ``recipe``; ``"auto"`` holds both Welford ones
    and the state's shape picks one.  The low-rank core's buffer length is set by its state (init)."""
    if recipe == "auto":
        return {False: REGISTRY["welford_diag"].build_core(), True: REGISTRY["welford_dense"].build_core()}
    if recipe == "default":  # low-rank where the matrix is (d, d) (d <= DENSE_AUTO_MAX_DIM), Welford's diagonal above
        return {False: REGISTRY["welford_diag"].build_core(), True: _recipe_cores("fisher_low_rank")[True]}
    built = REGISTRY[recipe].build_core(buffer_size=1) if recipe == "fisher_low_rank" else REGISTRY[recipe].build_core()
    return {recipe in ("welford_dense", "fisher_low_rank"): built}


def _low_rank_as_dense(low_rank):
    """``diag(sigma) (I + U (diag(lam) - I) U^T) diag(sigma)``, the low-rank inverse mass matrix as a ``(d, d)``
    matrix: the engine's dense path (one Cholesky factor per window, BlackJAX's dense metric) runs it."""
    sigma, U, lam = low_rank
    body = jnp.eye(sigma.shape[0], dtype=sigma.dtype) + (U * (lam - 1.0)) @ U.T
    matrix = sigma[:, None] * body * sigma[None, :]
    return 0.5 * (matrix + matrix.T)


def _per_chain_buffers(low_rank_state, num_chains):
    """BlackJAX's ``(chains x rows, d)`` draw and gradient buffers as ``(chains, rows, d)``."""
    def split(buffer):
        return buffer.reshape((num_chains, buffer.shape[0] // num_chains, buffer.shape[1]))
    return low_rank_state._replace(draws_buffer=split(low_rank_state.draws_buffer),
                                   grads_buffer=split(low_rank_state.grads_buffer))


def _pooled_buffers(low_rank_state):
    """The engine's ``(chains, rows, d)`` buffers as BlackJAX's ``(chains x rows, d)``: rows of every chain, in
    any order (the estimate does not depend on it)."""
    def join(buffer):
        return buffer.reshape((-1, buffer.shape[-1]))
    return low_rank_state._replace(draws_buffer=join(low_rank_state.draws_buffer),
                                   grads_buffer=join(low_rank_state.grads_buffer))


def _window_mean(mm_state):
    """The estimator's mean of the window's draws (where the ``normalized_ess`` and ``esjd_moments``
    rewards centre the squares)."""
    if hasattr(mm_state, "wc_state"):
        return mm_state.wc_state.mean
    if hasattr(mm_state, "fisher_block"):
        return mm_state.fisher_block.mean_x
    draws = _pooled_buffers(mm_state).draws_buffer
    rows = jnp.minimum(mm_state.buffer_idx, draws.shape[0])
    valid = jnp.arange(draws.shape[0]) < rows
    total = jnp.sum(jnp.where(valid[:, None], draws, 0.0), axis=0)
    return total / jnp.maximum(rows, 1).astype(total.dtype)


class ScaleMoments(NamedTuple):
    """Per-coordinate moments of a slow window's draws and gradients, pooled over chains (Chan's
    parallel Welford update, so a far-off mean costs no precision).

    count : float, ()   draws pooled so far in the window
    mean_x, m2_x : float, (D,)   mean and sum of squared deviations of the draws
    mean_g, m2_g : float, (D,)   the same for the log density's gradients
    """

    count: Any
    mean_x: Any
    m2_x: Any
    mean_g: Any
    m2_g: Any


class MetricAdaptation(NamedTuple):
    """The metric phase's state: BlackJAX's estimator, the window's :class:`ScaleMoments` and the last closed
    window's sample variances of the draws (zeros before one closes): a warm start's check compares with them,
    since a Fisher estimate's diagonal sits below the posterior's variances where it is not Gaussian."""

    estimator: Any
    moments: ScaleMoments
    draw_variance: Any


def _fresh_moments(dim: int, dtype) -> ScaleMoments:
    zeros = jnp.zeros((dim,), dtype)
    return ScaleMoments(jnp.asarray(0.0, dtype), zeros, zeros, zeros, zeros)


def _add_batch(count, mean, m2, batch):
    """Chan's update of ``(count, mean, m2)`` with the ``(C, D)`` rows of ``batch``."""
    n_b = jnp.asarray(batch.shape[0], mean.dtype)
    mean_b = jnp.mean(batch, axis=0)
    m2_b = jnp.sum((batch - mean_b) ** 2, axis=0)
    total = count + n_b
    delta = mean_b - mean
    return mean + delta * n_b / total, m2 + m2_b + delta * delta * count * n_b / total


def _accumulate_moments(moments: ScaleMoments, flat_x, flat_g) -> ScaleMoments:
    mean_x, m2_x = _add_batch(moments.count, moments.mean_x, moments.m2_x, flat_x.astype(moments.mean_x.dtype))
    mean_g, m2_g = _add_batch(moments.count, moments.mean_g, moments.m2_g, flat_g.astype(moments.mean_x.dtype))
    return ScaleMoments(moments.count + flat_x.shape[0], mean_x, m2_x, mean_g, m2_g)


#: BlackJAX's Fisher estimators (``metric_recipes``) floor the gradients' variance at this, so a coordinate with
#: sd above about 1e5 gets ``sqrt(var x / 1e-10)`` instead of ``sqrt(var x / var g)``: too small a variance.
BLACKJAX_GRAD_VARIANCE_FLOOR = 1e-10


def rescue_scales(inverse_mass_matrix, moments: ScaleMoments, fisher: bool, last_window=False):
    """The window's matrix with each coordinate's variance corrected where the estimator cannot see its scale.

    Three cases, all from the window's own draws and gradients: a coordinate the draws have not explored
    (:func:`ahmc.core.mass_matrix.rescue_unexplored`: far start, or sds 1e-6 and 1e6 under an identity
    metric), and, for the Fisher recipes (``fisher``), one whose gradient variance is under BlackJAX's
    floor, and, at the ``last_window``'s end (traced bool), draws spread far beyond the estimate
    (:func:`ahmc.core.mass_matrix.fisher_misfit`; only there: an earlier window's draws still hold the
    chains' approach): the matrix becomes diagonal, each variance raised to at least the draws'. Otherwise a
    dense matrix is rescaled by rows and columns, so its correlations stay.
    """
    variance = jnp.diag(inverse_mass_matrix) if _is_dense(inverse_mass_matrix) else inverse_mass_matrix
    n = jnp.maximum(moments.count, 2.0)
    var_x, var_g = moments.m2_x / (n - 1.0), moments.m2_g / (n - 1.0)
    corrected = variance
    if fisher:
        floored = (var_g > 0) & (var_g < BLACKJAX_GRAD_VARIANCE_FLOOR)
        corrected = variance * jnp.sqrt(BLACKJAX_GRAD_VARIANCE_FLOOR / jnp.where(floored, var_g, BLACKJAX_GRAD_VARIANCE_FLOOR))
    corrected = rescue_unexplored(corrected, var_x, var_g, moments.m2_g / n + moments.mean_g ** 2, xp=jnp)
    misfit = jnp.asarray(False)
    if fisher:
        misfit = jnp.asarray(last_window) & fisher_misfit(corrected, var_x, xp=jnp)
        corrected = jnp.where(last_window, raise_to_draws(corrected, var_x, xp=jnp), corrected)
    ok = (moments.count >= 2) & jnp.all(jnp.isfinite(corrected)) & jnp.all(corrected > 0)
    kept = jnp.where(ok, corrected, variance)
    rescaled = rescale_diagonal(inverse_mass_matrix, kept, xp=jnp)
    if not _is_dense(inverse_mass_matrix):
        return rescaled
    # A misfit estimate's correlations come from the same gradients: a diagonal of the draws' spread instead
    # (docs/decisions.md, "A misfit Fisher estimate gives way to a diagonal").
    return jnp.where(misfit & ok, jnp.diag(kept).astype(rescaled.dtype), rescaled)


def _build_metric(plan: WarmupPlan, *, recipe: str, use_center: bool, step_size_state: Callable, one_posterior: bool):
    """``(mass_matrix_state, adapt_metric)``: BlackJAX's estimator for ``recipe`` (its ``metric_recipes``),
    pooled over chains, in Stan's windows; a window's end restarts the dual averaging with ``step_size_state``.
    ``one_posterior``: every chain targets one posterior, so the pooled draws' variance is its variance (with
    per-chain data it also holds the spread between the chains' posteriors: no raise to the draws there)."""
    cores = _recipe_cores(recipe)
    auto_dense = recipe == "auto"
    low_rank_recipe = recipe in ("fisher_low_rank", "default")
    is_slow, is_window_end = jnp.asarray(plan.is_slow), jnp.asarray(plan.is_window_end)
    buffer_per_chain = _longest_window(plan)
    window_ends = np.flatnonzero(plan.is_window_end)
    last_window_end = int(window_ends[-1]) if window_ends.size and one_posterior else -1

    def is_low_rank(mm_state):  # static: the state's type says which estimator runs
        return hasattr(mm_state, "draws_buffer")

    def core_of(mm_state):
        return cores[True] if is_low_rank(mm_state) else cores[_is_dense(mm_state.inverse_mass_matrix)]

    def estimator_state(dim, dtype, dense, num_chains):
        if low_rank_recipe and dense:
            rows = max(min(buffer_per_chain, LOW_RANK_MAX_BUFFER // num_chains), 1)
            core = REGISTRY["fisher_low_rank"].build_core(buffer_size=rows * num_chains)
            return _per_chain_buffers(_fixed_dtypes(core.init(dim), dtype), num_chains)
        return _fixed_dtypes(cores[dense].init(dim), dtype)

    def mass_matrix_state(dim, dtype, dense, num_chains=1):
        return MetricAdaptation(estimator_state(dim, dtype, dense, num_chains), _fresh_moments(dim, dtype),
                                jnp.zeros((dim,), dtype))

    def uses_fisher(mm_state):  # static: BlackJAX's Fisher estimators floor var(grad)
        return is_low_rank(mm_state) or recipe == "fisher_diag"

    def estimator_step(mm_state, step):
        """``step`` (BlackJAX's update or final) on the estimator's state; a low-rank state's buffers are kept
        ``(chains, rows, d)`` in the engine (a chain axis, which the one-chain BlackJAX kernel strips and
        restores) and are BlackJAX's ``(chains x rows, d)`` for the step."""
        if not is_low_rank(mm_state):
            return step(mm_state)
        num_chains = mm_state.draws_buffer.shape[0]
        return _per_chain_buffers(step(_pooled_buffers(mm_state)), num_chains)

    def close_window(operand):
        """A mass-matrix window's end: its estimate (shrunk if dense Welford), the dual averaging restarted."""
        metric_state, imm, da_state, _, phase_it = operand
        mm_state, moments = metric_state.estimator, metric_state.moments
        dtype = imm.dtype
        window_mean = _window_mean(mm_state).astype(dtype) if use_center else None
        num_draws = mm_state.wc_state.sample_size if hasattr(mm_state, "wc_state") else None
        mm_state = _fixed_dtypes(estimator_step(mm_state, core_of(mm_state).final), dtype)
        if is_low_rank(mm_state):
            # An estimate without a Cholesky factor (indefinite in float32, as BlackJAX notes; all zeros where the
            # gradients vanish, as on a flat posterior) keeps the previous window's matrix.
            dense = _low_rank_as_dense(mm_state.inverse_mass_matrix)
            positive = jnp.all(jnp.isfinite(jnp.linalg.cholesky(dense))) & jnp.all(jnp.diag(dense) > 0)
            new_imm = jnp.where(positive, dense, imm)
        elif _is_dense(imm):  # a short window's missed directions must not freeze (ahmc.core.mass_matrix)
            raw = mm_state.inverse_mass_matrix
            covariance = shrink_correlations(raw, num_draws, jnp)
            if auto_dense:  # correlations no stronger than their noise: the diagonal does better
                covariance = jnp.where(prefers_dense(raw, num_draws, xp=jnp), covariance,
                                       jnp.diag(jnp.diag(covariance)))
            mm_state = mm_state._replace(inverse_mass_matrix=covariance)
            new_imm = covariance
        else:
            new_imm = mm_state.inverse_mass_matrix
        new_imm = rescue_scales(new_imm.astype(dtype), moments, uses_fisher(mm_state), phase_it == last_window_end)
        restart = step_size_state(jnp.exp(da_state.log_step_size))
        fresh = _fresh_moments(moments.mean_x.shape[0], dtype)
        draw_variance = (moments.m2_x / jnp.maximum(moments.count - 1.0, 1.0)).astype(dtype)
        return MetricAdaptation(mm_state, fresh, draw_variance), new_imm, restart, window_mean, phase_it

    def adapt_metric(state, flat_new, flat_grad, da_state, in_metric_phase, phase_it):
        """The pooled estimator takes the chains' positions (and gradients) in a slow window and closes at its end."""
        dense = _is_dense(state.inverse_mass_matrix)

        def pool_draws(metric_state):
            def one(s, xg):
                return _fixed_dtypes(estimator_step(s, lambda t: core_of(s).update(t, *xg)), flat_new.dtype), None
            estimator = jax.lax.scan(one, metric_state.estimator, (flat_new, flat_grad))[0]
            return metric_state._replace(estimator=estimator,
                                         moments=_accumulate_moments(metric_state.moments, flat_new, flat_grad))

        mm_state = jax.lax.cond(in_metric_phase & is_slow[phase_it], pool_draws, lambda s: s,
                                state.mass_matrix_adaptation)
        window_end = in_metric_phase & is_window_end[phase_it]
        mm_state, imm, da_state, center, _ = jax.lax.cond(
            window_end, close_window, lambda x: x,
            (mm_state, state.inverse_mass_matrix, da_state, state.center, phase_it))
        whitening = jax.lax.cond(window_end, inverse_cholesky, lambda _: state.whitening, imm) if dense else None
        return mm_state, imm, da_state, center, whitening

    return mass_matrix_state, adapt_metric


def search_step_size(search: StepSizeSearch, da_state, acceptance, target, step_size_state):
    """One iteration of the initial step-size search: ``(dual-averaging state, StepSizeSearch)``.

    Hoffman and Gelman's heuristic (BlackJAX's ``find_reasonable_step_size``), run by the warm-up's own
    one-leapfrog-step transitions instead of a separate compiled search: the step size doubles while the
    chains' acceptance is above ``target`` and halves while it is below; when it crosses, the search ends and
    dual averaging starts from the step size just tried. The search's transitions are the chains' first
    moves (Metropolis-corrected), which bring them toward the posterior's bulk. A step size beyond
    ``FLAT_STEP_SIZE`` ends the search at ``inf``, where BlackJAX's search ends on a flat density (every step
    accepted): no chain moves from then on, and the end-of-warm-up check names the cause (doubling on to the
    float range's end moved the chains by 1e38 and overflowed the rewards). Halving ends at the float
    range's smallest normal number.
    """
    eps = jnp.exp(da_state.log_step_size)
    direction = jnp.where(acceptance > target, 1, -1).astype(search.direction.dtype)
    crossed = (search.direction != 0) & (direction != search.direction)
    next_eps = jnp.where(crossed, eps, eps * jnp.where(direction > 0, 2.0, 0.5).astype(eps.dtype))
    flat = (direction > 0) & (next_eps > FLAT_STEP_SIZE)
    next_eps = jnp.where(flat, jnp.inf, next_eps)
    extreme = flat | ((direction < 0) & (next_eps <= jnp.finfo(eps.dtype).tiny))
    go_on = ~crossed & ~extreme
    return step_size_state(next_eps), StepSizeSearch(go_on, jnp.where(go_on, direction, 0).astype(direction.dtype))


def _step_size_adaptation(metric_phase: int, target_acceptance_rate: float, step_size_state: Callable):
    """``(searching, adapt)``: whether an iteration is the initial step-size search's, and the step size's update
    after an iteration (the search while it runs, then BlackJAX's dual averaging, in the metric phase)."""
    _, da_update, _ = dual_averaging_adaptation(target_acceptance_rate)

    def searching(state):
        """This iteration is the step-size search's (a one-leapfrog-step transition at the search's step size)."""
        if state.step_size_search is None:
            return jnp.asarray(False)
        return state.step_size_search.active & (state.iteration < metric_phase)

    def adapt(state, acceptance, in_metric_phase):
        """Dual averaging in the metric phase, after the initial step-size search (while it runs, the search)."""
        da_state, search = state.step_size_adaptation, state.step_size_search
        averaged = jax.tree.map(lambda a, b: jnp.where(in_metric_phase, a, b), da_update(da_state, acceptance),
                                da_state)
        if search is None:  # a warm start's step size, or no metric phase
            return averaged, None
        now = searching(state)
        searched, next_search = search_step_size(search, da_state, acceptance, target_acceptance_rate,
                                                 step_size_state)
        da_state = jax.tree.map(lambda a, b: jnp.where(now, a, b), searched, averaged)
        return da_state, jax.tree.map(lambda a, b: jnp.where(now, a, b), next_search,
                                      StepSizeSearch(jnp.asarray(False), jnp.zeros_like(search.direction)))

    return searching, adapt


def build_warmup(plan: WarmupPlan, *, target_acceptance_rate: float, warmup_integration_time: float,
                 warmup_max_steps: int, recipe: str, use_center: bool, restart_lost_chains: bool,
                 compare_chains: bool, auto_box: bool, user_num_steps: bool, step_size_factors: tuple,
                 max_integration_time: float, num_steps_cap: int, box_max_steps: int | None) -> Warmup:
    """The warm-up adaptation for ``plan`` (BlackJAX's dual averaging and Welford estimators, pooled over chains).

    ``compare_chains=False`` (per-chain targets) turns off restarts, the "far below" warning and the last
    window's raise of a Fisher estimate to its draws' variance;
    ``user_num_steps``: the box's ``L`` range is the user's (only ``eps`` follows ``eps*``);
    ``box_max_steps``: a cap on the automatic ``L`` (a super-transition's budget).
    """
    da_init_raw = dual_averaging_adaptation(target_acceptance_rate)[0]
    metric_phase = plan.metric_phase_length
    is_check = jnp.asarray(plan.is_check)

    def step_size_state(eps):
        # BlackJAX's init returns Python scalars in places: fixed dtypes, so that loop carries agree
        eps = jnp.asarray(eps)
        s = da_init_raw(eps)
        return type(s)(*(jnp.asarray(v, jnp.int32 if i == 2 else eps.dtype) for i, v in enumerate(s)))

    searching, adapt_step_size = _step_size_adaptation(metric_phase, target_acceptance_rate, step_size_state)
    mass_matrix_state, adapt_metric = _build_metric(plan, recipe=recipe, use_center=use_center,
                                                    step_size_state=step_size_state, one_posterior=compare_chains)

    def window_state(num_chains, dtype):
        zeros = jnp.zeros((num_chains,), dtype)
        return WindowStats(jnp.asarray(0, jnp.int32), zeros, zeros, zeros, zeros)

    def parameters(state):
        """The metric phase's step size (dual averaging's) and L (capped until the first window closes)."""
        dtype = state.inverse_mass_matrix.dtype
        warm_eps = jnp.exp(state.step_size_adaptation.log_step_size).astype(dtype)
        early = state.iteration <= plan.first_window_end
        cap = metric_phase_max_steps(plan, state.iteration, warmup_max_steps, jnp)
        num_steps = warmup_num_steps(warm_eps, warmup_integration_time, cap, jnp)
        return warm_eps, jnp.where(searching(state), 1, num_steps), early  # the search's: one leapfrog step

    def accumulate(window, logdensity, accept):
        """Per-chain window sums for the chain checks and the end-of-warm-up warning."""
        count = window.count + 1
        return WindowStats(count, window.logdensity + logdensity, window.logdensity_sq + logdensity * logdensity,
                           window.acceptance + accept, window.logdensity_trend + count.astype(logdensity.dtype) * logdensity)

    def restart_lost(rng_key, new, ld, window, da_state, iteration, is_check_now):
        """Chains lost at a check restart from a healthy chain's position; the dual averaging restarts."""
        num_chains = window.logdensity.shape[0]
        if not (compare_chains and restart_lost_chains and num_chains >= 3):
            return new, da_state, jnp.zeros((num_chains,), bool)
        far = far_below(window)  # at most half the chains (median): donors always exist
        lost = lost_chains(window, ld, remaining=metric_phase - iteration) & is_check_now
        donors = jax.random.categorical(rng_key, jnp.where(far, -jnp.inf, 0.0), shape=(num_chains,))

        def take(x):
            return jnp.where(lost.reshape((-1,) + (1,) * (x.ndim - 1)), x[donors], x)

        restarted = step_size_state(jnp.exp(da_state.log_step_size))
        da_state = jax.tree.map(lambda a, b: jnp.where(jnp.any(lost), a, b), restarted, da_state)
        return jax.tree.map(take, new), da_state, lost

    def search_box(state, da_state):
        """At the metric phase's last iteration: the automatic box around eps* (the user's box otherwise)."""
        if not auto_box:
            return state.box
        dtype = state.inverse_mass_matrix.dtype
        eps_star = jnp.exp(da_state.log_step_size_avg).astype(dtype)
        eps_box, l_hi = automatic_box(eps_star, step_size_factors, max_integration_time, num_steps_cap, jnp,
                                      max_num_steps=box_max_steps)
        l_range = state.box.num_steps if user_num_steps else jnp.stack([jnp.asarray(1, jnp.int32), l_hi])
        starts_gp = state.iteration == metric_phase - 1
        return jax.tree.map(lambda a, b: jnp.where(starts_gp, a, b), SearchBox(eps_box, l_range), state.box)

    def update(rng_key, state, new, accept, early):
        """One warm-up iteration after the transition: ``(new, WarmupState, restarted, flat positions)``."""
        it = state.iteration
        dtype = state.inverse_mass_matrix.dtype
        in_metric_phase = it < metric_phase
        ld = new.logdensity.astype(dtype)
        window = accumulate(state.window, ld, accept)
        da_state, search = adapt_step_size(state, pooled_acceptance(accept, early), in_metric_phase)
        phase_it = jnp.minimum(it, is_check.shape[0] - 1)
        is_check_now = in_metric_phase & is_check[phase_it]
        new, da_state, lost = restart_lost(rng_key, new, ld, window, da_state, it, is_check_now)
        warmup_ends = it == plan.num_warmup - 1
        if plan.num_warmup > 0:
            jax.lax.cond(warmup_ends, partial(_warn_if_lost, compare_chains=compare_chains), lambda operand: None,
                         (window, ld, warmup_ends, _step_in_parameter_units(da_state, state.inverse_mass_matrix),
                          jnp.exp(da_state.log_step_size_avg)))
        window = jax.tree.map(lambda fresh, w: jnp.where(is_check_now | warmup_ends, fresh, w),
                              window_state(window.logdensity.shape[0], dtype), window)
        # after warm-up the window is read by nothing: it stays as warm-up left it (as the sampling phase does)
        window = jax.tree.map(lambda w, old: jnp.where(it < plan.num_warmup, w, old), window, state.window)
        flat_new = jax.vmap(lambda p: ravel_pytree(p)[0])(new.position)
        flat_grad = jax.vmap(lambda g: ravel_pytree(g)[0])(new.logdensity_grad)
        mm_state, imm, da_state, center, whitening = adapt_metric(state, flat_new, flat_grad, da_state,
                                                                  in_metric_phase, phase_it)
        box = search_box(state, da_state)
        return new, WarmupState(da_state, mm_state, imm, whitening, center, box, window, search), lost, flat_new

    return Warmup(step_size_state, mass_matrix_state, window_state, parameters, update, accumulate)
