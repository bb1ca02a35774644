"""The shared JAX engine of adaptive HMC: BlackJAX transitions + the core GP-UCB tuner.

One engine advances a *batch of chains* (leading chain axis) by one iteration:

1. every chain draws its number of leapfrog steps uniformly from ``{1..L}``
   (``L`` is the arm's maximum, a traced value) and makes one HMC transition
   with BlackJAX's kernel (``blackjax.mcmc.hmc.build_kernel``, ``jax.vmap``-ed
   over chains); no leapfrog is written here;
2. the warm-up adapters (BlackJAX's dual averaging and Welford mass-matrix
   estimator, pooled over chains) advance on their Stan-like schedule;
3. the chains' whitened squared jumps go into the round's running sums
   (:func:`ahmc.core.objectives.round_update`);
4. at the end of a round -- a predicate on the *shared* iteration counter,
   hence unbatched -- ``jax.lax.cond`` runs the GP-UCB update.  Under a
   ``vmap`` that predicate would turn the cond into a select and the GP would
   run on every iteration; keeping the chain axis inside the engine avoids it.

Warm-up (default, ``adapt_mass_matrix=True`` and no user box)::

    |<-------- metric phase (metric_fraction) -------->|<--- GP phase --->|  sampling ...
    | fast | slow windows (diag. mass matrix) | fast   | rounds of m its  |  rounds, p_i -> 0
      dual averaging of eps with L = ceil(T_w / eps)      arm = GP-UCB(eps/eps*, L)

Until the first slow window closes the metric is the initial one, so ``L`` is
capped at ``EARLY_MAX_STEPS`` and the pooled dual averaging follows the median
chain's acceptance (a chain trapped in a local mode cannot drag the shared step
size down before the first check; see :func:`pooled_acceptance`).

At the end of Stan's initial fast window and of every slow window, a chain whose
mean log density over the window is far below the median chain's, still is at
the check, and did not climb (trapped in a region of negligible mass) restarts from another chain's position
(``restart_lost_chains``; 3+ chains): the pooled dual averaging would otherwise
follow it down to a useless step size.

At the end of the metric phase the mass matrix is frozen, ``eps*`` is the
dual-averaging step size, and the search box becomes
``eps in eps* x step_size_factors`` (log grid), ``L in [1, ceil(T_max / eps*)]``.
The schedule's ``k`` is the number of GP rounds in warm-up, so ``p_i = 1``
throughout warm-up and decays as ``(i - k + 1)^(-1/2)`` during sampling
(the paper's ``m = B / k``).  ``paper_preset`` gives Algorithm 2 as published:
identity mass matrix, user box, GP from the first round, ``k = 100``.

Defaults, by measurement (4 chains, 1000 warm-up + 1000 draws, 4 seeds, min
bulk ESS per gradient in the sampling phase relative to BlackJAX NUTS with
``window_adaptation``): logistic regression 532 x 8 (synthetic, standardized
correlated features, N(0, 100) prior) 1.77x (worst seed 1.63x); logistic
regression 1000 x 24 2.49x (2.32x); 10-d Gaussian with scales 0.01..100 1.52x
(1.09x); 10-d standard normal 1.47x (0.91x); 2-d Gaussian with correlation
0.99 3.5x.  Varying one default at a time -- ``round_length`` 5/20,
``metric_fraction`` 0.3/0.7, ``step_size_factors`` (0.25, 2)/(0.5, 1.5),
``max_integration_time`` pi/4 pi, ``target_acceptance_rate`` 0.65,
``noise_variance`` 0.3 -- moved these ratios by less than the seed-to-seed
spread (about +-0.3), so the defaults are the paper's (``m = 10``) or the
middle of the range tried.  ``objective="esjd_per_gradient"`` trades ESS of
the mean for ESS of the variance (1.46x / 2.58x on the small regression).
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import blackjax.mcmc.hmc as hmc
import blackjax.mcmc.integrators as integrators
import blackjax.mcmc.metrics as metrics
from blackjax.adaptation.mass_matrix import mass_matrix_adaptation
from blackjax.adaptation.step_size import dual_averaging_adaptation, find_reasonable_step_size
from blackjax.adaptation.window_adaptation import build_schedule
from blackjax.mcmc.proposal import safe_energy_diff, static_binomial_sampling
from blackjax.mcmc.trajectory import hmc_energy
from blackjax.util import generate_gaussian_noise

from ahmc.core.options import check_option_names, whole_number_pair
from ahmc.core.objectives import (DEFAULT_DIVERGENCE_PENALTY, NONFINITE_REWARD_MESSAGE, get_objective,
                                  needs_center, round_init, round_update)
from ahmc.core.mass_matrix import DENSE_AUTO_MAX_DIM, prefers_dense, shrink_correlations
from ahmc.core.space import NUM_STEPS_CAP, WARMUP_MAX_STEPS, check_min_steps_fraction, min_num_steps
from ahmc.core import Config, RoundStats, TunerState, gp_ucb, search_space
from ahmc.core.config import GPConfig, resolve_options

__all__ = ["EngineConfig", "EngineState", "EngineInfo", "SearchBox", "WindowStats", "Engine", "build_engine",
           "sample", "lost_chains", "far_below", "climbing"]

NEVER = np.iinfo(np.int32).max


class SearchBox(NamedTuple):
    """The box the tuner searches (arrays; traced when chosen automatically).

    step_size : float, (2,)   ``(lower, upper)`` step size
    num_steps : int32, (2,)   ``(lower, upper)`` maximum number of leapfrog steps ``L``
    """

    step_size: Any
    num_steps: Any


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


class EngineState(NamedTuple):
    """State of all chains, the tuner and the warm-up adapters (a pytree).

    Chain-batched fields have a leading axis of size ``num_chains``.

    position : pytree, (C, ...)          current positions
    logdensity : float, (C,)             log density at ``position``
    logdensity_grad : pytree, (C, ...)   its gradient
    iteration : int32, ()                iterations done (shared by all chains)
    tuner : TunerState                   one tuner (pooled) or batched (C,) (independent)
    round_stats : RoundStats, (C,)       running sums of the current round, per chain (a
                                         TrajectoryRoundStats with jump_estimate="trajectory")
    inverse_mass_matrix : float, (D,)    diagonal inverse mass matrix (flattened position)
    box : SearchBox                      the search box in use
    step_size_adaptation : DualAveragingAdaptationState (unbatched, pooled acceptance)
    mass_matrix_adaptation : MassMatrixAdaptationState (pooled Welford)
    adapt_probability : float, ()        p_i of the latest tuner update (1 before any)
    window : WindowStats                 per-chain log density / acceptance sums since the last chain check

    Only with ``round_end_fn`` / ``super_transitions`` (``None`` otherwise):

    round_draws : pytree, (C, M, ...)    positions of the current round (slot j = its j-th iteration)
    round_iteration : int32, ()          iterations done in the current round
    round_target : int32, ()             iterations of the current round (super-transitions)
    round_end_state : pytree             the round-end hook's own state

    Only with ``objective="esjd_moments"`` (``None`` otherwise):

    center : float, (D,)                 mean of the latest mass-matrix window (flattened position)

    Only with a dense inverse mass matrix (``dense_mass=True``, or ``"auto"`` up to d = 200; ``None``
    otherwise):

    whitening : float, (D, D)            inverse Cholesky factor of ``inverse_mass_matrix``: the
                                         reward measures jumps as ``whitening @ x``
    """

    position: Any
    logdensity: Any
    logdensity_grad: Any
    iteration: Any
    tuner: TunerState
    round_stats: RoundStats
    inverse_mass_matrix: Any
    box: SearchBox
    step_size_adaptation: Any
    mass_matrix_adaptation: Any
    adapt_probability: Any
    window: WindowStats
    round_draws: Any = None
    round_iteration: Any = None
    round_target: Any = None
    round_end_state: Any = None
    center: Any = None
    whitening: Any = None


def inverse_cholesky(matrix):
    """``W = C^-1`` for ``matrix = C C^T``, so that ``W x`` is ``x`` in the frame the matrix whitens.

    Computed once per mass-matrix window and carried in the state: whitening is then a matrix
    product, where a triangular solve per iteration cost ~1 ms at d = 256 on XLA's CPU backend
    (BENCHMARKS.md@036b7d1, "Engine cost per iteration").  ``W^T`` is also the factor that draws momenta
    (:func:`carried_metric`); it is computed with the very operations BlackJAX's
    ``gaussian_euclidean`` uses for that factor, so the momenta are BlackJAX's to the bit."""
    factor = jax.scipy.linalg.cholesky(matrix, lower=True)
    identity = jnp.identity(matrix.shape[0], dtype=matrix.dtype)
    return jax.scipy.linalg.solve_triangular(factor, identity, lower=True, trans=True).T


def current_energy(info, position, logdensity, metric):
    """The Hamiltonian of the chain's state after a transition: the proposal's if accepted, else the start's.

    This is what NumPyro's ``HMCState.energy`` and Stan's ``energy__`` hold, and what E-BFMI and ArviZ's
    energy plot need; a rejected proposal's energy (inf after a divergence) would break both."""
    start = -logdensity + metrics.default_metric(metric).kinetic_energy(info.momentum, position)
    return jnp.where(info.is_accepted, info.energy, start.astype(jnp.result_type(info.energy)))


def carried_metric(inverse_mass_matrix, whitening) -> metrics.Metric:
    """BlackJAX's Euclidean metric for a dense matrix, with its momentum factor given.

    ``blackjax.mcmc.metrics.gaussian_euclidean`` factorises the matrix each time it is built, i.e.
    in every transition; when the matrix lives in a loop's state XLA cannot move that out of the
    loop (warm-up, and the NumPyro kernel's every iteration): 0.5 ms per iteration of 4 chains at
    d = 100 and 2 ms at d = 200 on our CPU.  The engine computes ``whitening`` once per mass-matrix
    window, and momenta are ``whitening^T z``.  The kinetic energy and U-turn check are BlackJAX's;
    ``scale`` is not used by HMC and left to BlackJAX's own metric."""
    base = metrics.gaussian_euclidean(inverse_mass_matrix)  # its factorisation is dead code unless scale is called

    def sample_momentum(rng_key, position):
        return generate_gaussian_noise(rng_key, position, sigma=whitening.T)

    return base._replace(sample_momentum=sample_momentum)


class TrajectoryInfo(NamedTuple):
    """BlackJAX's ``HMCInfo`` fields plus the round's per-length sums after this transition
    (``jump_estimate="trajectory"``).

    ``step_sums[l - 1]``: the sums given to :func:`trajectory_proposal` plus this trajectory's
    ``a_l J_l``, the acceptance probability had it stopped after ``l`` leapfrog steps times the
    whitened squared jump from its start to there (0 from a divergent or non-finite step on);
    ``step_counts[l - 1]``: the counts given plus 1 for each step taken (entries are
    :func:`step_bin`'s bins when the arm's ``L`` is longer than the vectors).  Length: the box's
    largest ``L``, at most :data:`MAX_STEP_BINS`."""

    momentum: Any
    acceptance_rate: Any
    is_accepted: Any
    is_divergent: Any
    energy: Any
    proposal: Any
    num_integration_steps: Any
    step_sums: Any
    step_counts: Any


# Per-length sums longer than this are kept in this many bins of adjacent lengths.  The sums ride in
# the leapfrog loop's carry, where XLA's CPU backend rewrites the whole vector at every step: with the
# box's largest L (1024 by default) that took about half of an iteration on a 10-d Gaussian (16 us
# against 8 us with 64 entries; BENCHMARKS.md@036b7d1, "The same estimate in the JAX adapters").
MAX_STEP_BINS = 64


def step_bin(step_index, max_steps, num_bins):
    """Bin of leapfrog step ``step_index + 1`` of a trajectory whose arm is ``L = max_steps``: the
    step itself while ``L <= num_bins``, else ``floor(step_index * num_bins / L)`` (bins of
    ``L / num_bins`` adjacent lengths)."""
    return (step_index * num_bins) // jnp.maximum(max_steps, num_bins)


def step_bin_widths(num_bins, max_steps, min_steps):
    """How many of the lengths ``min_steps..max_steps`` fall in each :func:`step_bin`."""
    span = jnp.maximum(max_steps, num_bins)
    bins = jnp.arange(num_bins)
    first = (bins * span + num_bins - 1) // num_bins  # the smallest step index in bin b: ceil(b span / K)
    after = ((bins + 1) * span + num_bins - 1) // num_bins
    return jnp.maximum(jnp.minimum(after, max_steps) - jnp.maximum(first, min_steps - 1), 0)


def trajectory_proposal(whiten: Callable, step_sums, step_counts, max_steps=None, min_steps=1) -> Callable:
    """A ``build_proposal`` for :func:`blackjax.mcmc.hmc.build_kernel` that also adds every step's
    value to a round's per-length sums.

    The same endpoint proposal as BlackJAX's ``hmc_proposal`` (BlackJAX's integrator, energy and
    ``static_binomial_sampling``), integrated by a loop that at each step ``l >= min_steps`` also
    adds ``a_l J_l`` to the sums and 1 to the counts (returned in :class:`TrajectoryInfo`): what
    :func:`ahmc.core.objectives.step_jumps_estimate` averages.  Entry ``l - 1`` takes step ``l`` when
    ``max_steps`` (the arm's ``L``; ``None``: the vectors' length) fits the vectors, otherwise its
    :func:`step_bin`.  Adding in the loop touches only the steps taken.  ``whiten`` maps a
    flattened position difference to the frame the reward measures jumps in."""

    def build(integrator, kinetic_energy, step_size, num_integration_steps, divergence_threshold):
        energy_of = hmc_energy(kinetic_energy)
        num_bins = step_sums.shape[0]
        arm = num_bins if max_steps is None else max_steps

        def generate(rng_key, state):
            start_energy = energy_of(state)
            start = ravel_pytree(state.position)[0]

            def one_step(i, carry):
                current, sums, counts, failed = carry
                current = integrator(current, step_size)
                delta = safe_energy_diff(start_energy, energy_of(current))  # NaN -> -inf
                failed = failed | (-delta > divergence_threshold) | ~jnp.isfinite(delta)
                accept = jnp.where(failed, 0.0, jnp.exp(jnp.minimum(delta, 0.0)))
                jump = whiten(ravel_pytree(current.position)[0] - start)
                # In place (a dynamic update slice, O(1)): `.at[b].add(mode="drop")` selects the whole
                # vector at every step.  A step beyond the arm's L (only when the caller's L is shorter
                # than the trajectory) adds nothing to the clamped last entry.
                b = step_bin(i, arm, num_bins)
                counted = (b < num_bins) & (i + 1 >= min_steps)
                value = jnp.where(counted, accept * jnp.sum(jump * jump), 0.0).astype(sums.dtype)
                sums = jax.lax.dynamic_update_index_in_dim(
                    sums, jax.lax.dynamic_index_in_dim(sums, b, keepdims=False) + value, b, 0)
                count = jax.lax.dynamic_index_in_dim(counts, b, keepdims=False) + counted.astype(counts.dtype)
                counts = jax.lax.dynamic_update_index_in_dim(counts, count, b, 0)
                return current, sums, counts, failed

            end, sums, counts, _ = jax.lax.fori_loop(0, num_integration_steps, one_step,
                                                     (state, step_sums, step_counts, jnp.asarray(False)))
            end = hmc.flip_momentum(end)
            end_energy = energy_of(end)
            delta_energy = safe_energy_diff(start_energy, end_energy)
            is_diverging = -delta_energy > divergence_threshold
            sampled, (do_accept, p_accept, _) = static_binomial_sampling(rng_key, delta_energy, state, end)
            info = TrajectoryInfo(state.momentum, p_accept, do_accept, is_diverging, end_energy, end,
                                  num_integration_steps, sums, counts)
            return sampled, info, None

        return generate

    return build


class TrajectoryRoundStats(NamedTuple):
    """A round's sums with ``jump_estimate="trajectory"``: the made jumps' (``stats``) and, per
    length ``l``, the sum of ``a_l J_l`` over the trajectories that reached it and their count."""

    stats: RoundStats
    step_sums: Any
    step_counts: Any


def trajectory_jump_estimate(step_sums, step_counts, min_num_steps, max_steps=None):
    """:func:`ahmc.core.objectives.step_jumps_estimate` on arrays: the mean over lengths ``>= min_num_steps``
    that the round reached of the per-length mean of ``a_l J_l`` (NaN when none was reached).
    With ``max_steps`` (the round's ``L``) longer than the vectors, their entries are
    :func:`step_bin`'s bins, each mean weighted by the number of lengths in its bin (``None``: the
    vectors' length, one entry per length)."""
    num_bins = step_sums.shape[-1]
    arm = num_bins if max_steps is None else max_steps
    widths = step_bin_widths(num_bins, arm, min_num_steps).astype(step_sums.dtype)
    reached = (step_counts > 0) & (widths > 0)
    means = jnp.where(reached, step_sums / jnp.maximum(step_counts, 1), 0.0)
    weight = jnp.sum(jnp.where(reached, widths, 0.0))
    return jnp.where(weight > 0, jnp.sum(widths * means) / jnp.maximum(weight, 1), jnp.nan)


class EngineInfo(NamedTuple):
    """Per-iteration information; every field has shape (C,) (one per chain).

    step_size              step size used
    num_steps              the arm's ``L`` (maximum number of leapfrog steps)
    num_integration_steps  leapfrog steps taken (uniform on ``{1..L}``)
    acceptance_rate        Metropolis acceptance probability
    is_accepted            whether the proposal was accepted
    is_divergent           energy error above ``divergence_threshold``
    energy                 total energy (Hamiltonian) of the chain's state after the transition:
                           the proposal's if accepted, else the starting point's, as NumPyro and Stan report it
    logdensity             log density after the transition (minus potential energy)
    reward                 reward fed to the tuner (NaN except at round ends)
    round                  1-based index of the GP round of this iteration (0 before the GP phase)
    arm_changed            the tuner moved the arm at the end of this iteration
    adapt_probability      p_i in effect (the latest update's)
    is_warmup              the iteration belongs to warm-up
    fixed_point_converged  RMHMC: every implicit solve converged (always True for HMC)
    num_gradient_evals     log-density gradients (+ metric evaluations for RMHMC) of the transition
    restarted              the chain was lost and restarted from another chain's position (warm-up checks)
    """

    step_size: Any
    num_steps: Any
    num_integration_steps: Any
    acceptance_rate: Any
    is_accepted: Any
    is_divergent: Any
    energy: Any
    logdensity: Any
    reward: Any
    round: Any
    arm_changed: Any
    adapt_probability: Any
    is_warmup: Any
    fixed_point_converged: Any
    num_gradient_evals: Any
    restarted: Any


class EngineConfig(NamedTuple):
    """Static configuration resolved by :func:`build_engine` (Python values only)."""

    num_warmup: int
    metric_phase_length: int  # iterations before the GP starts (0 = GP from the first round)
    round_length: int
    num_warmup_rounds: int
    k: int
    pooled: bool
    adapt_mass_matrix: bool
    auto_box: bool
    step_size_factors: tuple
    max_integration_time: float
    num_steps_cap: int
    warmup_integration_time: float
    target_acceptance_rate: float
    objective: Callable
    freeze_after: int | None
    restart_lost_chains: bool
    min_steps_fraction: float = 0.0
    jump_estimate: str = "transition"


class Engine(NamedTuple):
    """``init(positions, rng_key) -> EngineState`` and ``step(rng_key, state) -> (EngineState, EngineInfo)``.

    ``step`` advances every chain by one iteration; do not ``vmap`` it (the
    chain axis is already inside).  ``parameters(state)`` gives the current
    ``step_size``, ``inverse_mass_matrix`` (pytree-flattened diagonal) and
    ``num_integration_steps`` (``L``) of chain 0's arm (all chains share it
    when pooled).  ``tuner`` is the core tuner (``tuner.surrogate`` for plots).
    ``scan_draws(rng_key, state, num_samples, first_iteration)`` runs the iterations after
    warm-up: the same draws as scanning ``step``, without per-iteration warm-up work and run-time
    branches (``None``: scan ``step``).
    """

    init: Callable
    step: Callable
    parameters: Callable
    tuner: Any
    config: EngineConfig
    scan_draws: Callable | None = None


def _pair(name, value, *, integer):
    try:
        lo, hi = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (lower, upper); got {value!r}.") from None
    if integer:
        return whole_number_pair(name, value)
    return float(lo), float(hi)


def _check_user_num_steps(num_steps_bounds, super_transitions) -> tuple[int, int]:
    """The user's ``(lower, upper)`` L range, checked against a round's leapfrog budget."""
    l_box = _pair("num_steps_bounds", num_steps_bounds, integer=True)
    if super_transitions and l_box[1] > 2 * super_transitions - 1:
        raise ValueError(
            f"num_steps_bounds upper {l_box[1]} exceeds 2 * super_transitions - 1 = "
            f"{2 * super_transitions - 1}: one transition would overrun the round's budget; lower it.")
    return l_box


_DEFAULT = Config()


def with_config(build, owner: str = "ahmc", extra_names=()):
    """``build`` taking ``config=`` (an :class:`ahmc.core.Config`) and ``paper_preset=`` besides its flat options.

    The tuning options are validated together by the Config and the rest against ``build``'s own
    arguments (and ``extra_names``), before anything is traced: an unknown name fails with the
    nearest valid one. Only the options the user set are passed on, so the route's own defaults
    (which equal the Config's, or resolve its ``None``) apply to the rest.
    """

    @functools.wraps(build)
    def built(logdensity_fn, **options):
        paper = options.get("paper_preset", False) is True
        tuning, execution = resolve_options(options, owner)
        valid = (set(inspect.signature(build).parameters) | set(extra_names)) - {"logdensity_fn"}
        check_option_names(execution, valid | set(Config.option_names()), owner)
        if paper:  # the paper's chains draw their step counts independently
            execution.setdefault("shared_num_steps", False)
        return build(logdensity_fn, **tuning, **execution)

    return built


@functools.partial(with_config, owner="ahmc")
def build_engine(
    logdensity_fn: Callable,
    *,
    num_warmup: int,
    step_size_bounds: tuple[float, float] | None = _DEFAULT.box.step_size_bounds,
    num_steps_bounds: tuple[int, int] | None = _DEFAULT.box.num_steps_bounds,
    adapt_mass_matrix: bool = _DEFAULT.warmup.adapt_mass_matrix,
    inverse_mass_matrix=None,
    dense_mass: bool | str = _DEFAULT.warmup.dense_mass,
    pooled: bool = True,
    round_length: int = _DEFAULT.schedule.round_length,
    metric_fraction: float | None = _DEFAULT.warmup.metric_fraction,
    step_size_factors: tuple[float, float] = _DEFAULT.box.step_size_factors,
    max_integration_time: float = _DEFAULT.box.max_integration_time,
    warmup_integration_time: float = _DEFAULT.warmup.warmup_integration_time,
    num_steps_cap: int = _DEFAULT.box.num_steps_cap,
    num_step_sizes: int = _DEFAULT.box.num_step_sizes,
    num_num_steps: int = _DEFAULT.box.num_num_steps,
    log_step_size: bool = _DEFAULT.box.log_step_size,
    target_acceptance_rate: float = _DEFAULT.warmup.target_acceptance_rate,
    initial_step_size: float | None = _DEFAULT.warmup.initial_step_size,
    objective: str | Callable = _DEFAULT.reward.objective,
    divergence_penalty: float = _DEFAULT.reward.divergence_penalty,
    exploit_after_warmup: bool = _DEFAULT.schedule.exploit_after_warmup,
    schedule: str = _DEFAULT.schedule.schedule,
    k: int | None = _DEFAULT.schedule.k,
    decay: float = _DEFAULT.schedule.decay,
    freeze_after: int | str | None = _DEFAULT.schedule.freeze_after,
    capacity: int = _DEFAULT.gp.capacity,
    lengthscale: float = _DEFAULT.gp.lengthscale,
    noise_variance: float | None = _DEFAULT.gp.noise_variance,
    alpha: float = _DEFAULT.gp.alpha,
    delta: float = _DEFAULT.gp.delta,
    integrator: Callable = integrators.velocity_verlet,
    divergence_threshold: float = 1000.0,
    kernel: Callable | None = None,
    restart_lost_chains: bool = _DEFAULT.warmup.restart_lost_chains,
    initial_arm: tuple[float, int] | None = None,
    chain_data: Any = None,
    round_end_fn: Callable | None = None,
    round_end_state: Any = None,
    super_transitions: int | None = None,
    shared_num_steps: bool = True,
    min_steps_fraction: float = _DEFAULT.box.min_steps_fraction,
    sequential_chains: bool = False,
    jump_estimate: str | None = _DEFAULT.reward.jump_estimate,
) -> Engine:
    """Build the adaptive-HMC engine for a batch of chains.

    Parameters
    ----------
    logdensity_fn
        Log density of one chain's position (any pytree).
    num_warmup
        Number of warm-up iterations (static).  The schedule of the metric
        phase, the GP rounds in warm-up and the annealing ``k`` derive from it.
    step_size_bounds, num_steps_bounds
        Absolute search box ``(lower, upper)``.  ``num_steps_bounds`` alone keeps
        the automatic step-size box and fixes the ``L`` range (e.g. ``(2, 16)`` to
        rule out single-step, MALA-like transitions); ``step_size_bounds`` needs
        ``num_steps_bounds`` too.  When both are omitted
        the box is chosen automatically at the end of the metric phase:
        ``eps* x step_size_factors`` and ``L in [1, ceil(max_integration_time / eps*)]``
        (capped at ``num_steps_cap``, default 1024 as NUTS's tree depth 10; the
        metric phase's ``L`` at ``WARMUP_MAX_STEPS`` = 256), with ``eps*`` the dual-averaging step
        size.  ``L`` up to ``T_max / eps*`` means trajectories of (whitened)
        integration time up to ``T_max = 4 pi``: with the uniform jitter the
        mean time is half that, enough for a half-period of a whitened
        direction with a sd up to ~4.  A diagonal metric leaves correlated
        directions wider than 1: on the stochastic-volatility benchmark
        (d = 1003) the slow direction (log beta against the level of the
        latent path) needs it -- 2 pi capped the GP at a mean time of ~3.
    adapt_mass_matrix
        Estimate a diagonal inverse mass matrix in Stan-like windows during the
        metric phase (pooled over chains, BlackJAX's Welford estimator); the
        reward is then measured in the whitened metric.  ``False`` keeps
        ``inverse_mass_matrix`` (default identity) fixed.
    dense_mass
        ``True``: a dense inverse mass matrix (the window's covariance, BlackJAX's
        estimator with its regularisation, correlations shrunk by
        :func:`ahmc.core.mass_matrix.shrink_correlations`), as NumPyro's ``dense_mass=True``; a
        given ``inverse_mass_matrix`` is then ``(d, d)``.  It whitens correlated
        posteriors a diagonal cannot (the logistic regressions' coefficients), at
        O(d^2) memory and an O(d^3) Cholesky per iteration: for d up to a few
        hundred.  The reward's jumps are measured in the Cholesky-whitened frame
        (the Mahalanobis distance of the jump).  ``"auto"``: estimate the dense
        matrix and keep it at a window's end only where its correlations stand out
        from the noise of estimating them (:func:`ahmc.core.mass_matrix.prefers_dense`),
        otherwise use its diagonal (the diagonal adaptation's matrix, held as a
        ``(d, d)`` matrix); above ``d = 200`` (:data:`ahmc.core.mass_matrix.DENSE_AUTO_MAX_DIM`)
        the diagonal adaptation runs from the start.  A given
        ``inverse_mass_matrix`` may then be ``(d,)`` or ``(d, d)``; its shape decides.
    pooled
        One tuner for all chains: every chain runs the same arm and the
        chain-mean reward enters the GP once with weight ``num_chains`` (its
        noise variance is ``noise_variance / num_chains``).  ``False``: an
        independent tuner per chain.
    round_length
        ``m``, iterations per round.  10 (the paper's ``B / k`` for ``B = 1000``
        and ``k = 100``); with 4 pooled chains a round's reward averages 40
        transitions.
    metric_fraction
        Fraction of warm-up spent in the metric phase (mass matrix + dual
        averaging) before the GP starts; ignored (0) when a box is given and
        ``adapt_mass_matrix=False`` (the paper's setting).
    warmup_integration_time
        During the metric phase ``L = ceil(T_w / eps)`` with jitter, so that
        the chains move while the mass matrix is learned; capped at
        ``EARLY_MAX_STEPS`` (32) until the first mass-matrix window closes, when
        the metric is still the initial one and ``T_w`` is in the wrong units.
    objective
        ``"normalized_esjd"`` (paper), ``"esjd"``, ``"esjd_per_gradient"``,
        ``"esjd_moments"`` (also rewards moving the centred squares, i.e. the
        ESS of variances; measured about the mean of the last mass-matrix
        window, so it needs ``adapt_mass_matrix=True``) or a callable
        ``(RoundStats, max_num_steps) -> reward``.
    divergence_penalty
        The reward is multiplied by ``exp(-divergence_penalty * f)``, ``f`` the
        fraction of the round's transitions that diverged (0: the paper's
        reward; see :mod:`ahmc.core.objectives`).  A ``round_end_fn`` reward is
        used as the hook returns it.
    exploit_after_warmup
        After the last GP round of warm-up, set the arm to the maximiser of the
        GP posterior mean (instead of the last UCB proposal, which with
        ``p_i = 1`` is often exploratory); sampling starts from the best guess.
    k, schedule, decay, freeze_after
        Annealing of the adaptation probability (see :func:`ahmc.core.gp_ucb`).
        ``k=None`` means the number of GP rounds in warm-up (``p_i = 1`` in
        warm-up).  ``freeze_after="warmup"`` stops moving the arm after warm-up.
    capacity, lengthscale, noise_variance, alpha, delta
        GP-UCB settings, passed to :func:`ahmc.core.gp_ucb`.  ``capacity=64``
        (core's default is 128): 1000 warm-up iterations make 50 rounds and so
        at most 50 distinct arms, and the GP update (run once per round) costs
        O(capacity^3); 64 instead of 128 cut the steady-state time per
        iteration on a 10-d Gaussian from 53 to 29 microseconds (vs 12 without
        GP updates).
    integrator, divergence_threshold
        Passed to :func:`blackjax.mcmc.hmc.build_kernel`.
    kernel
        Replaces that HMC kernel: same signature, ``(rng_key, HMCState,
        logdensity_fn, step_size, inverse_mass_matrix, num_integration_steps)
        -> (HMCState, info)``; ``info`` may carry ``fixed_point_converged`` and
        ``num_gradient_evals`` (RMHMC, :mod:`ahmc.adapters._jax_rmhmc`).
    restart_lost_chains
        Chain checks in the metric phase, at the end of Stan's initial fast
        window and of every slow window: with 3 or more chains, a chain whose
        mean log density over the window is far below the median chain's, is
        still that far below at the check and did not climb over the window
        (:func:`lost_chains`) restarts from the
        current position of a randomly chosen chain that is not far below, and
        the pooled dual averaging restarts.  A chain still climbing from a
        far-off start is left alone.  A chain
        caught in a negligible-mass trap (e.g. a collapsed mixture component)
        otherwise drags the pooled step size down by orders of magnitude and
        never mixes.  Warm-up only; at the end of warm-up a chain far below the
        others or stuck (acceptance rate below 0.05) gets a ``UserWarning`` either way.
        With ``chain_data`` the chains target different densities, so their log
        densities are not compared: no restart and no "far below" warning (the
        stuck-chain warning stays).
    shared_num_steps
        On by default.  Every chain of an iteration takes the number of
        leapfrog steps ``ceil(u L)`` from one shared ``u ~ U(0, 1)``, instead of
        drawing its own from ``{1..L}``.  Each chain's kernel is the same; only
        the draws are common across chains.  With chains ``vmap``-ed, the
        integrator loop runs as many steps as the longest chain needs, so
        independent draws waste about a third of the gradients computed
        (``E[max of 4] / E[one]`` ~ 1.5 for 4 chains and L = 8); shared draws
        waste none.  The price is that the chains are no longer independent
        given the arm (as with ChEES-HMC's shared jitter); given the shared
        sequence of step counts they are, and each chain's kernel leaves the
        target invariant, so the chains' errors stay uncorrelated.  ``False``
        gives each chain its own draw (the paper's setting).
    sequential_chains
        Run the chains' transitions one after another inside the compiled
        iteration (``jax.lax.map``) instead of side by side (``jax.vmap``, the
        default).  The draws are the same up to rounding.  For kernels whose
        cost varies from chain to chain, e.g. RMHMC's implicit solves
        (:func:`ahmc.adapters._jax_rmhmc.build_rmhmc_engine` turns it on): a
        ``vmap``-ed loop runs until the slowest chain is done, so every chain
        pays for the slowest solve (and for a failed one's whole iteration
        cap).  Plain HMC's vmapped gradients are cheaper, so it stays off there.
    min_steps_fraction
        Lower end of the leapfrog-count jitter: ``L_t ~ U{max(1, ceil(f L))..L}``.
        ``0`` (default) is the paper's ``U{1..L}``; ``0.5`` draws from the upper half
        (``U{ceil(L/2)..L}``).  Measured (BENCHMARKS.md@036b7d1, "Leapfrog jitter"): 0.5 raises
        the min ESS of the means per gradient on 14 of 15 benchmark models, by up to
        2.5x, and lowers the ESS of the squares (variances) on 14 of 15, below NUTS's
        on all 15; the paper's jitter is the safer default.  Applies in warm-up too.
    jump_estimate
        How a round's mean squared jump (the reward's numerator) is measured.
        ``"trajectory"`` (the default with the engine's own kernel): from every leapfrog
        step of the round's trajectories, each step's whitened squared jump from the start
        weighted by the acceptance probability had the trajectory stopped there, averaged
        per length and then over lengths (:func:`ahmc.core.objectives.step_jumps_estimate`; the same
        target without the noise of the accept/reject coin and of the draw of ``L_t``).
        The transitions are the same; the kernel is BlackJAX's ``build_kernel`` with a
        proposal that also adds each step's value to the round's per-length sums
        (:func:`trajectory_proposal`; one entry per length up to 64, beyond that 64 bins of
        adjacent lengths whose means are weighted by their widths).  It costs, per leapfrog
        step, the kinetic energy, the whitened jump (``O(d)``, ``O(d^2)`` with a dense
        matrix) and two writes.
        ``"transition"``: the jumps the chains made (the paper; the default with a user
        ``kernel``, e.g. RMHMC, which takes only this).
    initial_arm
        ``(step_size, L)`` of the first round in a user box (default: the box's middle).
    chain_data
        Per-chain data, a pytree with a leading chain axis: chain ``c`` then targets
        ``logdensity_fn(position, data_c)`` (e.g. cross-validation: each chain's training mask).
    round_end_fn, round_end_state
        A reward computed from the round's draws instead of ``objective``:
        ``round_end_fn(draws, num_draws, hook_state) -> (reward, hook_state)``, called once per
        round; ``draws`` has leading axes ``(C, M)`` (``M`` = ``round_length``, or
        ``super_transitions``), of which the first ``num_draws`` (traced) are this round's
        positions; ``reward`` is a scalar or one per chain ``(C,)``.  ``round_end_state`` is the
        hook's initial state, kept in ``EngineState.round_end_state``.  The draw buffer exists
        only when a hook is given.
    super_transitions
        Leapfrog budget ``B`` per chain and round (thesis 3.2, after Neal): a round with
        maximum ``L`` makes ``2 B / (L + 1)`` transitions (the mean of ``L_t ~ U{1..L}`` is
        ``(L + 1) / 2``; with ``min_steps_fraction`` it is ``B / E[L_t]``, ``E[L_t] = (L_min + L) / 2``;
        stochastic rounding makes the expected number of leapfrog steps exactly ``B``) and ``L`` is capped at ``2 B - 1``, so every arm's reward is bought with
        the same computation.  Pooled tuner only.  ``EngineInfo.round`` and ``is_warmup`` then
        count rounds: warm-up is the first ``num_warmup // round_length`` GP rounds.
    """
    if not callable(logdensity_fn):
        raise ValueError("logdensity_fn must be callable: position -> scalar log density.")
    # The Config's None defaults, resolved for the JAX engine (docs/options.md).
    metric_fraction = 0.5 if metric_fraction is None else metric_fraction
    initial_step_size = 1.0 if initial_step_size is None else initial_step_size
    noise_variance = GPConfig(noise_variance=noise_variance).resolved_noise_variance(one_chain_rounds=False)
    min_steps_fraction = check_min_steps_fraction(min_steps_fraction)
    if jump_estimate is None:
        jump_estimate = "trajectory" if kernel is None else "transition"
    if jump_estimate not in ("transition", "trajectory"):
        raise ValueError(f"jump_estimate must be 'transition' (the jumps made, the paper's) or 'trajectory' "
                         f"(every leapfrog step); got {jump_estimate!r}.")
    if jump_estimate == "trajectory" and kernel is not None:
        raise ValueError("jump_estimate='trajectory' needs the engine's own HMC kernel; with a user kernel "
                         "(e.g. RMHMC) use jump_estimate='transition'.")
    if not isinstance(num_warmup, (int, np.integer)) or num_warmup < 0:
        raise ValueError(f"num_warmup must be an integer >= 0; got {num_warmup!r}.")
    if step_size_bounds is not None and num_steps_bounds is None:
        raise ValueError(
            "step_size_bounds needs num_steps_bounds=(lo, hi) too (the automatic L range is set from the "
            "warm-up's step size, which a user step-size box replaces); or give num_steps_bounds alone to keep "
            "the automatic step-size box."
        )
    if not isinstance(round_length, (int, np.integer)) or round_length < 1:
        raise ValueError(f"round_length must be a positive integer; got {round_length!r}.")
    if not 0.0 <= metric_fraction < 1.0:
        raise ValueError(f"metric_fraction must be in [0, 1); got {metric_fraction!r}.")
    lo_factor, hi_factor = _pair("step_size_factors", step_size_factors, integer=False)
    if not 0 < lo_factor <= 1.0 <= hi_factor:
        raise ValueError(f"step_size_factors must satisfy 0 < lower <= 1 <= upper; got {step_size_factors!r}.")
    if not (max_integration_time > 0 and warmup_integration_time > 0):
        raise ValueError("max_integration_time and warmup_integration_time must be > 0.")
    if not isinstance(num_steps_cap, (int, np.integer)) or num_steps_cap < 1:
        raise ValueError(f"num_steps_cap must be a positive integer; got {num_steps_cap!r}.")
    if not 0.0 < target_acceptance_rate < 1.0:
        raise ValueError(f"target_acceptance_rate must be in (0, 1); got {target_acceptance_rate!r}.")
    if not (isinstance(dense_mass, (bool, np.bool_)) or (isinstance(dense_mass, str) and dense_mass == "auto")):
        raise ValueError(
            f"dense_mass must be True, False or 'auto' (one matrix over all parameters); got {dense_mass!r}. "
            "Blocks of sites (NumPyro's list form) are not supported.")
    auto_dense = isinstance(dense_mass, str)
    objective_fn = get_objective(objective, divergence_penalty)
    use_center = needs_center(objective_fn)
    if use_center and not adapt_mass_matrix:
        raise ValueError(
            f"objective={objective!r} measures the squares about the posterior mean estimated with the mass "
            "matrix, so it needs adapt_mass_matrix=True (it does not apply to RMHMC, whose metric replaces "
            "the mass matrix). Use objective='normalized_esjd' or adapt the mass matrix.")
    if super_transitions is not None and (
            not isinstance(super_transitions, (int, np.integer)) or super_transitions < 1 or not pooled):
        raise ValueError(
            f"super_transitions must be None or a positive integer leapfrog budget per round (with "
            f"pooled=True); got {super_transitions!r}.")
    if round_end_fn is not None and not callable(round_end_fn):
        raise ValueError("round_end_fn must be callable (draws, num_draws, hook_state) -> (reward, hook_state).")
    if initial_arm is not None and step_size_bounds is None:
        raise ValueError("initial_arm needs a user box: give step_size_bounds and num_steps_bounds too.")
    user_initial_arm = initial_arm

    auto_box = step_size_bounds is None
    if auto_box:
        metric_phase = int(round(metric_fraction * num_warmup))
        if metric_phase < 1:
            raise ValueError(
                "The automatic search box needs a metric (dual-averaging) phase: "
                f"num_warmup={num_warmup} with metric_fraction={metric_fraction} leaves none. "
                "Give step_size_bounds=(lo, hi) and num_steps_bounds=(lo, hi), or more warm-up."
            )
        # First arm: eps = eps*, mean integration time ~ 1.5 (unit coordinate is static because
        # L_hi = T_max / eps*).
        unit_l = min(1.0, 3.0 / max_integration_time)
        if num_steps_bounds is None:
            space = search_space((lo_factor, hi_factor), (1, num_num_steps), num_step_sizes=num_step_sizes,
                                 log_step_size=True)
            initial_arm = (1.0, 1 + round(unit_l * (num_num_steps - 1)))
            box0 = ((lo_factor, hi_factor), (1, num_steps_cap))
        else:  # the user's L range, every integer in it, around the automatic step sizes
            l_box = _check_user_num_steps(num_steps_bounds, super_transitions)
            space = search_space((lo_factor, hi_factor), l_box, num_step_sizes=num_step_sizes, log_step_size=True)
            initial_arm = (1.0, l_box[0] + round(unit_l * (l_box[1] - l_box[0])))
            box0 = ((lo_factor, hi_factor), l_box)
    else:
        eps_box = _pair("step_size_bounds", step_size_bounds, integer=False)
        l_box = _check_user_num_steps(num_steps_bounds, super_transitions)
        space = search_space(eps_box, l_box, num_step_sizes=num_step_sizes, log_step_size=log_step_size)
        metric_phase = int(round(metric_fraction * num_warmup)) if adapt_mass_matrix else 0
        initial_arm = user_initial_arm
        box0 = (eps_box, l_box)
    if use_center and metric_phase < 1:
        raise ValueError(
            f"objective={objective!r} needs a metric phase to estimate the posterior mean: num_warmup={num_warmup} "
            f"with metric_fraction={metric_fraction} leaves none. Give more warm-up or a larger metric_fraction.")
    by_trajectory = jump_estimate == "trajectory"
    num_step_values = min(int(box0[1][1]), MAX_STEP_BINS) if by_trajectory else 0  # lengths or bins
    gp_warmup = max(num_warmup - metric_phase, 0)
    num_warmup_rounds = gp_warmup // round_length
    k_value = int(k) if k is not None else max(num_warmup_rounds, 1)
    if freeze_after == "warmup":
        freeze_rounds = num_warmup_rounds
    elif freeze_after is None or isinstance(freeze_after, (int, np.integer)):
        freeze_rounds = freeze_after
    else:
        raise ValueError(f"freeze_after must be None, an integer number of rounds or 'warmup'; got {freeze_after!r}.")
    tuner = gp_ucb(
        space, initial_arm=initial_arm, capacity=capacity, lengthscale=lengthscale,
        noise_variance=noise_variance, alpha=alpha, delta=delta, schedule=schedule, k=k_value,
        decay=decay, freeze_after=freeze_rounds,
    )
    compare_chains = chain_data is None  # per-chain targets have incomparable log densities
    config = EngineConfig(
        num_warmup=int(num_warmup), metric_phase_length=metric_phase, round_length=int(round_length),
        num_warmup_rounds=num_warmup_rounds, k=k_value, pooled=bool(pooled),
        adapt_mass_matrix=bool(adapt_mass_matrix), auto_box=auto_box,
        step_size_factors=(lo_factor, hi_factor), max_integration_time=float(max_integration_time),
        num_steps_cap=int(num_steps_cap), warmup_integration_time=float(warmup_integration_time),
        target_acceptance_rate=float(target_acceptance_rate), objective=objective_fn,
        freeze_after=freeze_rounds, restart_lost_chains=bool(restart_lost_chains),
        min_steps_fraction=min_steps_fraction, jump_estimate=jump_estimate,
    )

    # Static per-iteration schedule of the metric phase: (is_slow_window, is_window_end).
    # Chain checks (restart of lost chains) at the end of the initial fast window and of every slow window.
    if metric_phase > 0:
        with jax.ensure_compile_time_eval():  # build_engine may be called under jit
            stan = np.asarray(build_schedule(metric_phase))
        is_slow = stan[:, 0].astype(bool) & adapt_mass_matrix
        is_window_end = stan[:, 1].astype(bool) & adapt_mass_matrix
        slow = stan[:, 0].astype(bool)
        is_check = stan[:, 1].astype(bool) | np.append(~slow[:-1] & slow[1:], False)
    else:
        is_slow = np.zeros(1, bool)
        is_window_end = np.zeros(1, bool)
        is_check = np.zeros(1, bool)
    # Last iteration before the first mass-matrix estimate (initial fast window + first slow window);
    # -1 when the mass matrix is not adapted (the metric phase then keeps the user's metric throughout).
    first_window_end = int(np.argmax(is_window_end)) if np.any(is_window_end) else -1
    is_slow, is_window_end, is_check = jnp.asarray(is_slow), jnp.asarray(is_window_end), jnp.asarray(is_check)

    hmc_kernel = hmc.build_kernel(integrator, divergence_threshold) if kernel is None else kernel
    da_init_raw, da_update, _ = dual_averaging_adaptation(target_acceptance_rate)
    # Both estimators: with dense_mass="auto" the state's shape (set by init) picks one.
    mm_adaptations = {dense: mass_matrix_adaptation(is_diagonal_matrix=not dense) for dense in (False, True)}

    def is_dense(matrix) -> bool:
        """Static: a (d, d) inverse mass matrix (dense_mass=True, or "auto" up to DENSE_AUTO_MAX_DIM)."""
        return matrix.ndim == 2

    def mm_update(s, x):
        return mm_adaptations[is_dense(s.inverse_mass_matrix)][1](s, x)

    # BlackJAX's init functions return Python scalars in places; give every leaf a fixed
    # dtype so that scan carries and cond branches agree.
    def da_init(eps):
        eps = jnp.asarray(eps)
        s = da_init_raw(eps)
        return type(s)(*(jnp.asarray(v, jnp.int32 if i == 2 else eps.dtype) for i, v in enumerate(s)))

    def mm_fix(s):
        wc = s.wc_state
        wc = type(wc)(wc.mean, wc.m2, jnp.asarray(wc.sample_size, jnp.int32))
        return type(s)(s.inverse_mass_matrix, wc)

    def mm_init(dim, dtype, dense):
        s = mm_fix(mm_adaptations[dense][0](dim))
        return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, s)

    def mm_final(s):
        dtype = s.inverse_mass_matrix.dtype
        out = mm_fix(mm_adaptations[is_dense(s.inverse_mass_matrix)][2](s))
        return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, out)
    data_args = () if chain_data is None else (chain_data,)
    buffer_length = int(super_transitions) if super_transitions else int(round_length)

    def logdensity_of(*data):
        """The log density one chain targets (its own data, if any)."""
        return logdensity_fn if not data else (lambda z: logdensity_fn(z, data[0]))

    unit_eps = jnp.asarray(space.step_size_unit)
    unit_l = jnp.asarray(space.num_steps_unit)
    num_l_grid = space.shape[1]
    is_log_grid = space.log_step_size or auto_box

    def arm_parameters(tuner_state, box):
        """(step size, L) of the tuner's current arm in the (possibly traced) box."""
        u_eps = unit_eps[tuner_state.arm // num_l_grid].astype(box.step_size.dtype)
        u_l = unit_l[tuner_state.arm % num_l_grid]
        lo, hi = box.step_size[0], box.step_size[1]
        if is_log_grid:
            eps = jnp.exp(jnp.log(lo) + u_eps * (jnp.log(hi) - jnp.log(lo)))
        else:
            eps = lo + u_eps * (hi - lo)
        l_lo, l_hi = box.num_steps[0], box.num_steps[1]
        steps = jnp.round(l_lo + u_l * (l_hi - l_lo)).astype(jnp.int32)
        return eps, jnp.maximum(steps, 1)

    def super_transition_length(tuner_state, box, key):
        """Iterations of a round with leapfrog budget B: B / E[L_t], stochastically rounded."""
        _, num_steps = arm_parameters(tuner_state, box)
        mean_steps = 0.5 * (min_num_steps(num_steps, min_steps_fraction, jnp) + num_steps)
        ratio = super_transitions / mean_steps
        whole = jnp.floor(ratio)
        up = jax.random.uniform(key, (), ratio.dtype) < ratio - whole
        return jnp.clip(whole + up, 1, super_transitions).astype(jnp.int32)

    warmup_max_steps = min(num_steps_cap, WARMUP_MAX_STEPS)

    def warmup_num_steps(eps):
        steps = jnp.ceil(warmup_integration_time / eps)
        return jnp.clip(jnp.nan_to_num(steps, nan=1.0), 1, warmup_max_steps).astype(jnp.int32)

    def window_init(num_chains, dtype):
        zeros = jnp.zeros((num_chains,), dtype)
        return WindowStats(jnp.asarray(0, jnp.int32), zeros, zeros, zeros, zeros)

    def init(positions, rng_key=None) -> EngineState:
        """Initial state for positions with a leading chain axis."""
        leaves = jax.tree.leaves(positions)
        if not leaves:
            raise ValueError("positions is an empty pytree.")
        num_chains = int(np.shape(leaves[0])[0]) if np.ndim(leaves[0]) > 0 else 0
        if num_chains < 1 or any(np.ndim(x) < 1 or np.shape(x)[0] != num_chains for x in leaves):
            raise ValueError(
                "positions must have a leading chain axis of the same size on every leaf "
                "(for one chain: jax.tree.map(lambda x: x[None], position))."
            )
        if chain_data is not None and any(np.ndim(x) < 1 or np.shape(x)[0] != num_chains
                                          for x in jax.tree.leaves(chain_data)):
            raise ValueError(f"chain_data must have a leading chain axis of size {num_chains} on every leaf.")
        logdensity, grad = jax.vmap(jax.value_and_grad(logdensity_fn))(positions, *data_args)
        _check_finite(logdensity, grad)
        flat0, _ = ravel_pytree(jax.tree.map(lambda x: x[0], positions))
        dim = flat0.shape[0]
        dtype = flat0.dtype if jnp.issubdtype(flat0.dtype, jnp.floating) else jnp.float32
        if inverse_mass_matrix is None:
            dense = bool(dense_mass) and not (auto_dense and dim > DENSE_AUTO_MAX_DIM)
            imm = jnp.eye(dim, dtype=dtype) if dense else jnp.ones(dim, dtype)
        else:
            imm = jnp.asarray(inverse_mass_matrix, dtype)
            dense = imm.ndim == 2 if auto_dense else bool(dense_mass)
            if auto_dense and imm.shape not in ((dim,), (dim, dim)):
                raise ValueError(f"inverse_mass_matrix must be ({dim},) or ({dim}, {dim}) with dense_mass='auto'; "
                                 f"got shape {imm.shape}.")
            if dense_mass and not auto_dense and imm.shape != (dim, dim):
                raise ValueError(f"inverse_mass_matrix must be a ({dim}, {dim}) matrix with dense_mass=True; "
                                 f"got shape {imm.shape}.")
            if not dense_mass and imm.shape != (dim,):
                hint = " (a full matrix: that needs dense_mass=True)" if imm.shape == (dim, dim) else ""
                raise ValueError(f"inverse_mass_matrix must be a diagonal of shape ({dim},); got {imm.shape}{hint}.")
        if pooled:
            tuner_state = tuner.init(xp=jnp, dtype=dtype)
        else:
            tuner_state = jax.vmap(lambda _: tuner.init(xp=jnp, dtype=dtype))(jnp.arange(num_chains))
        stats = fresh_round_stats(num_chains, dtype)
        box = SearchBox(jnp.asarray(box0[0], dtype), jnp.asarray(box0[1], jnp.int32))
        eps0 = jnp.asarray(initial_step_size, dtype)
        if metric_phase > 0:
            key = jax.random.key(0) if rng_key is None else rng_key
            ref = hmc.HMCState(jax.tree.map(lambda x: x[0], positions), logdensity[0],
                               jax.tree.map(lambda x: x[0], grad))

            def kernel_generator(eps):
                chain0 = logdensity_of(*jax.tree.map(lambda x: x[0], data_args))
                return lambda key, state: hmc_kernel(key, state, chain0, eps, imm, 1)

            eps0 = find_reasonable_step_size(key, kernel_generator, ref, eps0, target_acceptance_rate)
        return EngineState(
            position=positions, logdensity=logdensity, logdensity_grad=grad,
            iteration=jnp.asarray(0, jnp.int32), tuner=tuner_state, round_stats=stats,
            inverse_mass_matrix=imm, box=box, step_size_adaptation=da_init(eps0),
            mass_matrix_adaptation=mm_init(dim, dtype, dense), adapt_probability=jnp.asarray(1.0, dtype),
            window=window_init(num_chains, dtype), whitening=inverse_cholesky(imm) if dense else None,
            **round_buffers(positions, tuner_state, box, rng_key),
        )

    def fresh_round_stats(num_chains, dtype):
        """Empty round sums, one per chain (with per-length sums for ``jump_estimate="trajectory"``)."""
        stats = jax.vmap(lambda _: round_init(jnp, dtype))(jnp.arange(num_chains))
        if not by_trajectory:
            return stats
        shape = (num_chains, num_step_values)
        return TrajectoryRoundStats(stats, jnp.zeros(shape, dtype), jnp.zeros(shape, jnp.int32))

    def made_jumps(stats) -> RoundStats:
        return stats.stats if by_trajectory else stats

    def chain_rewards(stats, arm_l, dtype):
        """The objective of each chain's round (its sums and its L)."""
        if by_trajectory:  # the round's mean squared jump from every leapfrog step (made jumps if none)
            lowest = min_num_steps(arm_l, min_steps_fraction, jnp)
            estimate = jax.vmap(trajectory_jump_estimate)(stats.step_sums, stats.step_counts, lowest, arm_l)
            made = stats.stats
            total = jnp.where(jnp.isfinite(estimate), estimate * made.num_iterations, made.sum_squared_jump)
            stats = made._replace(sum_squared_jump=total.astype(made.sum_squared_jump.dtype))
        return jax.vmap(objective_fn)(stats, arm_l).astype(dtype)

    def round_buffers(positions, tuner_state, box, rng_key):
        """Initial values of the optional state fields (hook buffer, round counters, center)."""
        extra = {}
        if round_end_fn is not None:
            extra["round_draws"] = jax.tree.map(
                lambda x: jnp.zeros((x.shape[0], buffer_length) + x.shape[1:], x.dtype), positions)
            extra["round_end_state"] = round_end_state
        if round_end_fn is not None or super_transitions:
            extra["round_iteration"] = jnp.asarray(0, jnp.int32)
        if super_transitions:
            key = jax.random.fold_in(jax.random.key(0) if rng_key is None else rng_key, 7)
            extra["round_target"] = super_transition_length(tuner_state, box, key)  # reset when the GP starts
        if use_center:  # replaced at every mass-matrix window's end, before the GP starts
            extra["center"] = jnp.mean(jax.vmap(lambda p: ravel_pytree(p)[0])(positions), axis=0)
        return extra

    def close_round(operand, *, arm_l, key_tuner, round_draws=None, num_draws=None, ends=True):
        """The end of a round: the round's reward, the tuner's update, fresh round sums.

        ``operand`` is ``(tuner_state, round_stats, adapt_probability, hook_state)``; ``arm_l`` the
        round's L per chain, ``key_tuner`` the iteration's tuner key; ``round_draws`` / ``num_draws``
        the hook's buffer (``round_end_fn`` only).  Returns the operand's new values, with
        ``(reward, arm_changed, adapt_probability)`` per chain in place of the probability."""
        tuner_state, stats, _, hook_state = operand
        num_chains = arm_l.shape[0]
        dtype = made_jumps(stats).sum_squared_jump.dtype
        if round_end_fn is None:
            rewards = chain_rewards(stats, arm_l, dtype)
        else:
            rewards, hook_state = round_end_fn(round_draws, num_draws, hook_state)
            rewards = jnp.asarray(rewards, dtype)
            rewards = rewards if pooled else jnp.broadcast_to(rewards, (num_chains,))
        # A host callback only when a reward is not finite; the flag goes to the host too, because under a
        # user's jax.vmap (one-chain adaptive_hmc) this cond becomes a select that runs both branches.
        # ``ends``: whether the round really ends here (False in the branch a vmapped cond runs anyway).
        finite = jnp.all(jnp.isfinite(rewards))
        jax.lax.cond(finite, lambda _: None, _warn_nonfinite_reward, ~finite & ends)
        fresh = fresh_round_stats(num_chains, dtype)
        if pooled:
            reward = jnp.mean(rewards)
            uniform = jax.random.uniform(key_tuner, (), dtype)
            tuner_state, tinfo = tuner.update(tuner_state, reward, uniform, num_chains * 1.0, cond=jax.lax.cond)
            changed = jnp.broadcast_to(tinfo.arm_changed, (num_chains,))
            reward = jnp.broadcast_to(reward, (num_chains,))
            p = tinfo.adapt_probability
        else:
            uniforms = jax.random.uniform(key_tuner, (num_chains,), dtype)
            # update's two halves: the solves only in rounds where some chain needs them (a chain's
            # own branch under vmap would run them in every round, for every chain)
            recorded, work = jax.vmap(tuner.record)(tuner_state, rewards, uniforms)
            tuner_state = jax.lax.cond(jnp.any(work.needs_solve),
                                       lambda operand: jax.vmap(tuner.complete)(*operand)[0],
                                       lambda operand: operand[0], (recorded, work))
            changed, reward, p = tuner_state.arm != recorded.arm, rewards, work.adapt_probability[0]
        if exploit_after_warmup:
            previous_arm = operand[0].arm
            last_round = tuner_state.round if pooled else tuner_state.round[0]
            tuner_state = jax.lax.cond(last_round == num_warmup_rounds, exploit, lambda t: t, tuner_state)
            changed = jnp.broadcast_to(tuner_state.arm != previous_arm, (num_chains,))
        return tuner_state, fresh, (reward, changed, p.astype(dtype)), hook_state

    def exploit(tuner_state):
        """End of warm-up: move to the arm of highest posterior mean reward."""
        def best(t):
            return t._replace(arm=jnp.argmax(tuner.surrogate(t).mean.reshape(-1)).astype(jnp.int32))
        return best(tuner_state) if pooled else jax.vmap(best)(tuner_state)

    def step(rng_key, state: EngineState, sampling: bool = False, round_end: str = "cond"):
        """One iteration of every chain.

        Both extra arguments are static and change only the cost, never the result, when the
        caller's promise holds.  ``sampling=True``: the iteration is past the warm-up's metric
        phase, so it is traced without the warm-up machinery (step-size and mass-matrix
        adaptation, chain checks), whose branches would never run.  ``round_end``: ``"cond"``
        decides at run time whether the round ends here; ``"never"`` / ``"always"`` are promises
        (fixed-length rounds only), which let :func:`scan_draws` drop the run-time branch: on
        CPU a ``lax.cond`` around the GP update cost a few microseconds per iteration even when
        not taken, as much as a cheap model's gradients."""
        num_chains = state.logdensity.shape[0]
        it = state.iteration
        dtype = state.inverse_mass_matrix.dtype
        dense = is_dense(state.inverse_mass_matrix)
        key_hmc, key_tuner = jax.random.split(rng_key)
        key_restart = jax.random.fold_in(key_tuner, 1)  # leaves the other streams as they were
        in_metric_phase = jnp.asarray(False) if sampling else it < metric_phase

        # Parameters of this iteration.
        warm_eps = jnp.exp(state.step_size_adaptation.log_step_size).astype(dtype)
        if pooled:
            arm_eps, arm_l = arm_parameters(state.tuner, state.box)
            arm_eps = jnp.broadcast_to(arm_eps, (num_chains,))
            arm_l = jnp.broadcast_to(arm_l, (num_chains,))
        else:
            arm_eps, arm_l = jax.vmap(arm_parameters, in_axes=(0, None))(state.tuner, state.box)
        if sampling:
            eps, max_steps = arm_eps, arm_l
        else:
            eps = jnp.where(in_metric_phase, warm_eps, arm_eps)
            early = it <= first_window_end
            warm_l = warmup_num_steps(warm_eps)
            warm_l = jnp.where(early, jnp.minimum(warm_l, EARLY_MAX_STEPS), warm_l)
            max_steps = jnp.where(in_metric_phase, warm_l, arm_l)

        # One HMC transition per chain, L_t ~ U{L_min..L} (L_min = 1: the paper's jitter).
        def shared_count(max_c):  # one u for every chain: L_t = L_min + floor(u (L - L_min + 1))
            lowest = min_num_steps(max_c, min_steps_fraction, jnp)
            span = max_c - lowest + 1
            return jnp.clip(jnp.floor(shared_u * span).astype(jnp.int32) + lowest, lowest, max_c)

        common_num = None
        common_max = max_steps[0] if pooled else None
        if shared_num_steps:
            shared_u = jax.random.uniform(jax.random.fold_in(key_hmc, 3), (), dtype)
            if pooled:  # every chain runs the same L: the count is computed once, outside the chains' vmap,
                # so the leapfrog loop's trip count is not batched (a batched one makes vmap select the
                # whole loop state at every step)
                common_num = shared_count(common_max)

        def transition(key, position, logdensity, grad, eps_c, max_c, sums_c, counts_c, *data):
            key_l, key_k = jax.random.split(key)
            if common_num is not None:
                num = common_num
            elif shared_num_steps:
                num = shared_count(max_c)
            else:
                num = jax.random.randint(key_l, (), min_num_steps(max_c, min_steps_fraction, jnp), max_c + 1)
            if by_trajectory:
                # A pooled tuner's L is the same for every chain: taken from outside the vmap, the bin
                # index stays a loop counter (a batched index turns each in-place add into a scatter).
                arm_c = max_c if common_max is None else common_max
                lowest = min_num_steps(arm_c, min_steps_fraction, jnp)
                kernel_c = hmc.build_kernel(integrator, divergence_threshold,
                                            trajectory_proposal(whiten, sums_c, counts_c, arm_c, lowest))
            else:
                kernel_c = hmc_kernel
            new, info = kernel_c(key_k, hmc.HMCState(position, logdensity, grad), logdensity_of(*data),
                                 eps_c, metric, num)
            if kernel is None:  # BlackJAX reports the proposal's H; NumPyro and Stan the chain's state's
                info = info._replace(energy=current_energy(info, position, logdensity, metric))
            return new, info, num

        if by_trajectory:  # the same transition, each step's a_l J_l added to the round's sums (whitened
            # as the reward's jumps)
            if dense:
                def whiten(dx):
                    return state.whitening @ dx
            else:
                def whiten(dx):
                    return dx / jnp.sqrt(state.inverse_mass_matrix)
            sums, counts = state.round_stats.step_sums, state.round_stats.step_counts
        else:  # placeholders for the unused arguments
            sums = counts = jnp.zeros((num_chains,), jnp.int32)

        # A dense matrix goes in with its momentum factor (no factorisation per transition);
        # a user's kernel (RMHMC) gets the matrix as before.
        metric = (carried_metric(state.inverse_mass_matrix, state.whitening) if dense and kernel is None
                  else state.inverse_mass_matrix)
        keys = jax.random.split(key_hmc, num_chains)
        chain_args = (keys, state.position, state.logdensity, state.logdensity_grad, eps, max_steps, sums, counts,
                      *data_args)
        if sequential_chains:
            new, hmc_info, num_taken = jax.lax.map(lambda args: transition(*args), chain_args)
        else:
            new, hmc_info, num_taken = jax.vmap(transition)(*chain_args)

        accept = jnp.nan_to_num(hmc_info.acceptance_rate, nan=0.0).astype(dtype)
        # Per-chain window sums for the chain checks and the end-of-warm-up warning.
        ld = new.logdensity.astype(dtype)
        count = state.window.count + 1
        window = WindowStats(count, state.window.logdensity + ld, state.window.logdensity_sq + ld * ld,
                             state.window.acceptance + accept,
                             state.window.logdensity_trend + count.astype(dtype) * ld)
        starts_gp = False
        if sampling:  # the warm-up adapters are done: carry their state unchanged
            flat_new = jax.vmap(lambda p: ravel_pytree(p)[0])(new.position)
            da_state, mm_state = state.step_size_adaptation, state.mass_matrix_adaptation
            imm, box, center = state.inverse_mass_matrix, state.box, state.center
            whitening = state.whitening
            lost = jnp.zeros((num_chains,), bool)
        else:
            # Warm-up adapters (pooled over chains).
            da_state = state.step_size_adaptation
            da_state = jax.tree.map(lambda a, b: jnp.where(in_metric_phase, a, b),
                                    da_update(da_state, pooled_acceptance(accept, early)), da_state)
            phase_it = jnp.minimum(it, is_slow.shape[0] - 1)

            # Chain check: a chain far below the others restarts from a healthy chain's position.
            is_check_now = in_metric_phase & is_check[phase_it]
            if compare_chains and restart_lost_chains and num_chains >= 3:
                far = far_below(window)  # at most half the chains (median): donors always exist
                lost = lost_chains(window, ld, remaining=metric_phase - it) & is_check_now
                donors = jax.random.categorical(key_restart, jnp.where(far, -jnp.inf, 0.0), shape=(num_chains,))

                def take(x):
                    moved = x[donors]
                    return jnp.where(lost.reshape((-1,) + (1,) * (x.ndim - 1)), moved, x)

                new = jax.tree.map(take, new)
                da_state = jax.tree.map(lambda a, b: jnp.where(jnp.any(lost), a, b),
                                        da_init(jnp.exp(da_state.log_step_size)), da_state)
            else:
                lost = jnp.zeros((num_chains,), bool)
            warmup_ends = it == num_warmup - 1
            if num_warmup > 0:
                jax.lax.cond(warmup_ends, partial(_warn_if_lost, compare_chains=compare_chains),
                             lambda operand: None, (window, ld, warmup_ends, jnp.exp(da_state.log_step_size)))
            window = jax.tree.map(lambda fresh, w: jnp.where(is_check_now | warmup_ends, fresh, w),
                                  window_init(num_chains, dtype), window)
            slow_now = in_metric_phase & is_slow[phase_it]
            window_end = in_metric_phase & is_window_end[phase_it]
            flat_new = jax.vmap(lambda p: ravel_pytree(p)[0])(new.position)

            def pool_positions(mm_state):
                return jax.lax.scan(lambda s, x: (mm_update(s, x), None), mm_state, flat_new)[0]

            mm_state = jax.lax.cond(slow_now, pool_positions, lambda s: s, state.mass_matrix_adaptation)

            def close_window(operand):
                mm_state, _, da_state, _ = operand
                window_mean = mm_state.wc_state.mean.astype(dtype) if use_center else None
                num_draws = mm_state.wc_state.sample_size
                mm_state = mm_final(mm_state)
                if dense:  # a short window's missed directions must not freeze (ahmc.core.mass_matrix)
                    raw = mm_state.inverse_mass_matrix
                    covariance = shrink_correlations(raw, num_draws, jnp)
                    if auto_dense:  # correlations no stronger than their noise: the diagonal does better
                        keep = prefers_dense(raw, num_draws, xp=jnp)
                        covariance = jnp.where(keep, covariance, jnp.diag(jnp.diag(covariance)))
                    mm_state = mm_state._replace(inverse_mass_matrix=covariance)
                restart = da_init(jnp.exp(da_state.log_step_size))
                return mm_state, mm_state.inverse_mass_matrix.astype(dtype), restart, window_mean

            mm_state, imm, da_state, center = jax.lax.cond(
                window_end, close_window, lambda x: x, (mm_state, state.inverse_mass_matrix, da_state, state.center))
            whitening = (jax.lax.cond(window_end, inverse_cholesky, lambda _: state.whitening, imm)
                         if dense else None)

            # The GP phase starts: fix eps* and (if automatic) the search box.
            starts_gp = it == metric_phase - 1
            eps_star = jnp.exp(da_state.log_step_size_avg).astype(dtype)
            if auto_box:
                if num_steps_bounds is not None:  # the user's L range; only eps follows eps*
                    l_range = state.box.num_steps
                else:
                    l_hi = jnp.clip(jnp.ceil(max_integration_time / eps_star), 2, num_steps_cap).astype(jnp.int32)
                    if super_transitions:  # every arm must fit one transition in the budget
                        l_hi = jnp.minimum(l_hi, max(2, 2 * int(super_transitions) - 1))
                    l_range = jnp.stack([jnp.asarray(1, jnp.int32), l_hi])
                new_box = SearchBox(eps_star * jnp.asarray((lo_factor, hi_factor), dtype), l_range)
                box = jax.tree.map(lambda a, b: jnp.where(starts_gp, a, b), new_box, state.box)
            else:
                box = state.box

        # Round bookkeeping in the whitened metric.
        flat_old = jax.vmap(lambda p: ravel_pytree(p)[0])(state.position)
        if dense:  # jumps in the frame of the covariance estimate imm = C C^T: C^-1 x
            flat_old, flat_new = flat_old @ whitening.T, flat_new @ whitening.T
            stats_center = None if center is None else whitening @ center
            scale = None
        else:
            scale, stats_center = jnp.sqrt(imm), center
        stats = jax.vmap(round_update, in_axes=(0, 0, 0, 0, 0, 0, None, None))(
            made_jumps(state.round_stats), flat_old, flat_new, num_taken, hmc_info.acceptance_rate,
            hmc_info.is_divergent, scale, stats_center)
        if by_trajectory:
            stats = TrajectoryRoundStats(stats, hmc_info.step_sums, hmc_info.step_counts)
        if not sampling:
            stats = jax.tree.map(lambda fresh, s: jnp.where(in_metric_phase, fresh, s),
                                 fresh_round_stats(num_chains, dtype), stats)
        since_gp = it - metric_phase
        is_round_end = (~in_metric_phase) & ((since_gp + 1) % round_length == 0)
        if super_transitions:
            key_tuner, key_length = jax.random.split(key_tuner)
            round_target = jnp.where(starts_gp, super_transition_length(state.tuner, box, key_length),
                                     state.round_target)
            is_round_end = (~in_metric_phase) & (state.round_iteration + 1 >= round_target)
        round_draws = None
        if round_end_fn is not None:
            slot = jnp.minimum(state.round_iteration, buffer_length - 1)
            round_draws = jax.tree.map(lambda buf, x: buf.at[:, slot].set(x), state.round_draws, new.position)

        end_round = partial(close_round, arm_l=arm_l, key_tuner=key_tuner, round_draws=round_draws,
                            num_draws=state.round_iteration + 1 if round_end_fn is not None else None,
                            ends=is_round_end if round_end == "cond" else True)

        def continue_round(operand):
            tuner_state, stats, p, hook_state = operand
            nan = jnp.full((num_chains,), jnp.nan, dtype)
            return tuner_state, stats, (nan, jnp.zeros((num_chains,), bool), p), hook_state

        operand = (state.tuner, stats, state.adapt_probability, state.round_end_state)
        if round_end == "cond":
            tuner_state, stats, (reward, changed, p), hook_state = jax.lax.cond(
                is_round_end, end_round, continue_round, operand)
        else:
            if super_transitions:
                raise ValueError("round_end='never'/'always' needs fixed-length rounds (no super_transitions).")
            is_round_end = jnp.asarray(round_end == "always")
            tuner_state, stats, (reward, changed, p), hook_state = (
                end_round if round_end == "always" else continue_round)(operand)

        new_state = EngineState(
            position=new.position, logdensity=new.logdensity, logdensity_grad=new.logdensity_grad,
            iteration=it + 1, tuner=tuner_state, round_stats=stats, inverse_mass_matrix=imm, box=box,
            step_size_adaptation=da_state, mass_matrix_adaptation=mm_state, adapt_probability=p,
            window=window, center=center, whitening=whitening,
        )
        round_index = jnp.where(in_metric_phase, 0, since_gp // round_length + 1).astype(jnp.int32)
        is_warmup = it < num_warmup
        if round_end_fn is not None or super_transitions:
            new_state = new_state._replace(
                round_iteration=jnp.where(is_round_end | in_metric_phase, 0, state.round_iteration + 1))
        if round_end_fn is not None:
            new_state = new_state._replace(round_draws=round_draws, round_end_state=hook_state)
        if super_transitions:  # warm-up and round indices count rounds of varying length
            key_next = jax.random.fold_in(key_tuner, 1)
            new_state = new_state._replace(round_target=jnp.where(
                is_round_end, super_transition_length(tuner_state, box, key_next), round_target))
            round_index = jnp.where(in_metric_phase, 0, state.tuner.round + 1).astype(jnp.int32)
            is_warmup = in_metric_phase | (state.tuner.round < num_warmup_rounds)
        info = EngineInfo(
            step_size=eps, num_steps=max_steps, num_integration_steps=num_taken.astype(jnp.int32),
            acceptance_rate=hmc_info.acceptance_rate, is_accepted=hmc_info.is_accepted,
            is_divergent=hmc_info.is_divergent, energy=hmc_info.energy, logdensity=new.logdensity,
            reward=reward, round=jnp.broadcast_to(round_index, (num_chains,)), arm_changed=changed,
            adapt_probability=jnp.broadcast_to(p, (num_chains,)),
            is_warmup=jnp.broadcast_to(is_warmup, (num_chains,)),
            fixed_point_converged=getattr(hmc_info, "fixed_point_converged", jnp.ones((num_chains,), bool)),
            num_gradient_evals=getattr(hmc_info, "num_gradient_evals", num_taken).astype(jnp.int32),
            restarted=lost,
        )
        return new_state, info

    def parameters(state: EngineState) -> dict:
        """Current sampler parameters: the arm's (per chain when not pooled); in the metric phase the DA ones."""
        if pooled:
            eps, steps = arm_parameters(state.tuner, state.box)
        else:
            eps, steps = jax.vmap(arm_parameters, in_axes=(0, None))(state.tuner, state.box)
        in_metric_phase = state.iteration < metric_phase
        warm_eps = jnp.exp(state.step_size_adaptation.log_step_size_avg).astype(eps.dtype)
        return {
            "step_size": jnp.where(in_metric_phase, warm_eps, eps),
            "inverse_mass_matrix": state.inverse_mass_matrix,
            "num_integration_steps": jnp.where(in_metric_phase, warmup_num_steps(warm_eps), steps),
            "min_steps_fraction": min_steps_fraction,  # the jitter the arm was tuned with
        }

    def record_round(state: EngineState, rng_key):
        """A pooled tuner's round end without linear algebra (fixed-length rounds, no hook): the
        reward recorded, fresh round sums; returns the state and ``(work, rewards per chain)``
        for ``tuner.complete``.  Same keys and values as ``close_round``."""
        num_chains = state.logdensity.shape[0]
        _, key_tuner = jax.random.split(rng_key)
        arm_l = jnp.broadcast_to(arm_parameters(state.tuner, state.box)[1], (num_chains,))
        dtype = state.inverse_mass_matrix.dtype
        rewards = chain_rewards(state.round_stats, arm_l, dtype)
        uniform = jax.random.uniform(key_tuner, (), dtype)
        recorded, work = tuner.record(state.tuner, jnp.mean(rewards), uniform, num_chains * 1.0)
        fresh = fresh_round_stats(num_chains, dtype)
        return state._replace(tuner=recorded, round_stats=fresh), (work, rewards)

    def finish_round(state: EngineState, rng_key):
        """End the round after an iteration run with ``round_end="never"`` with key ``rng_key``:
        the state and ``(reward, arm_changed, adapt_probability)`` per chain that ``"always"``
        would have given (fixed-length rounds)."""
        num_chains = state.logdensity.shape[0]
        _, key_tuner = jax.random.split(rng_key)
        if pooled:
            arm_l = jnp.broadcast_to(arm_parameters(state.tuner, state.box)[1], (num_chains,))
        else:
            arm_l = jax.vmap(arm_parameters, in_axes=(0, None))(state.tuner, state.box)[1]
        hook = round_end_fn is not None
        operand = (state.tuner, state.round_stats, state.adapt_probability, state.round_end_state)
        tuner_state, stats, (reward, changed, p), hook_state = close_round(
            operand, arm_l=arm_l, key_tuner=key_tuner, round_draws=state.round_draws if hook else None,
            num_draws=state.round_iteration if hook else None)
        state = state._replace(tuner=tuner_state, round_stats=stats, adapt_probability=p)
        if hook:
            state = state._replace(round_end_state=hook_state, round_iteration=jnp.zeros_like(state.round_iteration))
        return state, (reward, changed, jnp.broadcast_to(p, (num_chains,)))

    def segmented_rounds(inner, state: EngineState, blocks):
        """Whole rounds of a pooled tuner after warm-up (no hook), keys ``blocks`` (rounds, L):
        ``(state, (positions, info))`` with a leading rounds axis, as one round per scan step gives.

        XLA's CPU backend compiles a loop into a single kernel only when it holds no linear-algebra
        call; otherwise it runs the loop body's operations one by one, at a fixed cost each (a round
        end has some hundred of them: as much as a cheap model's gradients).  So the rounds run in
        segments: an inner loop of whole rounds (transitions, round sums, the reward and the tuner's
        bookkeeping, ``tuner.record``) that stops after the first round whose update needs the
        tuner's solves (a move of the arm, p_i per round, or an eviction); then ``tuner.complete``
        outside it.  A non-finite reward warns once, after the run."""
        num_rounds = blocks.shape[0]
        num_chains = state.logdensity.shape[0]
        dtype = state.inverse_mass_matrix.dtype

        def iteration(state, key):
            state, info = inner(key, state)
            return state, (state.position, info)

        def whole_round(state, keys):
            """A round's iterations, then its end: the reward recorded (``tuner.record``)."""
            state, (positions, info) = jax.lax.scan(iteration, state, keys)
            state, (work, rewards) = record_round(state, keys[-1])
            p = work.adapt_probability.astype(dtype)
            per_chain = partial(jnp.broadcast_to, shape=(num_chains,))
            # the iterations ran with round_end="never" (arm_changed already False): the round's end fills the rest
            info = info._replace(reward=info.reward.at[-1].set(per_chain(jnp.mean(rewards))),
                                 adapt_probability=info.adapt_probability.at[-1].set(per_chain(p)))
            return state._replace(adapt_probability=p), (positions, info), (work, rewards)

        _, round_shapes, pending_shapes = jax.eval_shape(whole_round, state, blocks[0])
        outputs = jax.tree.map(lambda x: jnp.zeros((num_rounds,) + x.shape, x.dtype), round_shapes)
        pending = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), pending_shapes)

        def one_round(carry):
            state, r, outputs, _, _, nonfinite = carry
            state, round_out, pending = whole_round(state, blocks[r])
            outputs = jax.tree.map(lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x, r, 0),
                                   outputs, round_out)
            work, rewards = pending
            nonfinite = nonfinite | ~jnp.all(jnp.isfinite(rewards))
            return state, r + 1, outputs, pending, work.needs_solve, nonfinite

        def segment(carry):
            state, r, outputs, pending, _, nonfinite = carry
            state, r, outputs, pending, stopped, nonfinite = jax.lax.while_loop(
                lambda c: (c[1] < num_rounds) & ~c[4], one_round, (state, r, outputs, pending, False, nonfinite))
            tuner_state, _ = jax.lax.cond(stopped, partial(tuner.complete, cond=jax.lax.cond),
                                          lambda t, w: (t, jnp.asarray(-1, jnp.int32)), state.tuner, pending[0])
            changed = jnp.broadcast_to(tuner_state.arm != state.tuner.arm, (num_chains,))
            positions, info = outputs
            info = info._replace(arm_changed=info.arm_changed.at[r - 1, -1].set(changed))
            return state._replace(tuner=tuner_state), r, (positions, info), pending, False, nonfinite

        start = (state, jnp.asarray(0, jnp.int32), outputs, pending, jnp.asarray(False), jnp.asarray(False))
        state, _, outputs, _, _, nonfinite = jax.lax.while_loop(lambda c: c[1] < num_rounds, segment, start)
        jax.lax.cond(nonfinite, _warn_nonfinite_reward, lambda _: None, nonfinite)
        return state, outputs

    def scan_draws(rng_key, state: EngineState, num_samples: int, first_iteration: int):
        """Run ``num_samples`` iterations after warm-up: ``(state, (positions, info))`` as a
        ``lax.scan`` of ``step`` with ``jax.random.split(rng_key, num_samples)`` gives, the same
        draws, but cheaper.  ``first_iteration`` (static) is ``state.iteration``, at least
        ``num_warmup``.  With fixed-length rounds each whole round runs as an inner scan of
        iterations that cannot end a round, followed by the round's end, so no iteration
        branches at run time; the partial rounds at either end use ``step``."""
        keys = jax.random.split(rng_key, num_samples)

        def run(step_fn, state, keys):
            def body(state, key):
                state, info = step_fn(key, state)
                return state, (state.position, info)
            return jax.lax.scan(body, state, keys)

        per_iteration = partial(step, sampling=True)
        if super_transitions:
            return run(per_iteration, state, keys)
        into_round = (first_iteration - metric_phase) % round_length
        head = min(num_samples, (round_length - into_round) % round_length)
        num_rounds = (num_samples - head) // round_length
        tail = num_samples - head - num_rounds * round_length
        # An empty piece is left out rather than scanned over no keys: it would still be traced and
        # lowered (about half the tracing time of the draws on a 10-d Gaussian, 2026-11-28).
        pieces = []
        if head:
            state, out = run(per_iteration, state, keys[:head])
            pieces.append(out)
        if num_rounds:
            inner = partial(step, sampling=True, round_end="never")
            blocks = keys[head:head + num_rounds * round_length].reshape((num_rounds, round_length) + keys.shape[1:])
            # A pooled tuner without a hook, after warm-up (the exploit step lies in the warm-up): rounds
            # run in segments, as below.  Otherwise one round per step of a scan.
            if pooled and round_end_fn is None and first_iteration >= num_warmup:
                state, out = segmented_rounds(inner, state, blocks)
            else:
                def one_round(state, round_keys):
                    state, (positions, info) = run(inner, state, round_keys)
                    state, (reward, changed, p) = finish_round(state, round_keys[-1])
                    info = info._replace(reward=info.reward.at[-1].set(reward),
                                         arm_changed=info.arm_changed.at[-1].set(changed),
                                         adapt_probability=info.adapt_probability.at[-1].set(p))
                    return state, (positions, info)

                state, out = jax.lax.scan(one_round, state, blocks)
            pieces.append(jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), out))
        if tail or not pieces:
            state, out = run(per_iteration, state, keys[head + num_rounds * round_length:])
            pieces.append(out)
        return state, jax.tree.map(lambda *xs: jnp.concatenate(xs), *pieces)

    return Engine(init=init, step=step, parameters=parameters, tuner=tuner, config=config,
                  scan_draws=scan_draws)


# Leapfrog cap of the metric phase before the first mass-matrix estimate.  L = ceil(T_w / eps) assumes
# a metric that roughly whitens the posterior; with the initial identity and a posterior sd of 0.01 it
# asks for 200 steps (measured before this cap: 80-130 gradients per iteration over the first 100
# iterations on kidiq, earnings, sblrc, arK, gauss_mix and the 10-d diagonal Gaussian, most of their
# warm-up).  32 steps still cross a typical set at that scale; the chains only need to reach it.
EARLY_MAX_STEPS = 32
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
    return jnp.where(early, jnp.median(accept), jnp.mean(accept))


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
    spread = jnp.sqrt(jnp.median(var))
    threshold = jnp.maximum(LOST_GAP_SDS * spread, LOST_GAP_MIN)
    far = (jnp.median(mean) - mean > threshold) & (window.count > 1)
    if logdensity is not None:
        far &= jnp.median(mean) - logdensity > threshold
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
    return _window_rise(window) > 3.0 * jnp.sqrt(jnp.median(var))


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
    gap = jnp.median(mean) - (mean if logdensity is None else logdensity)
    late = gap > jnp.maximum(_window_rise(window) / n, 0.0) * remaining
    return far & (trapped | late)


def _warn_if_lost(operand, compare_chains=True):
    """End of warm-up: warn (host callback) about chains far below the others, or stuck, over the last window."""
    window, logdensity, now, step_size = operand
    count = jnp.maximum(window.count, 1).astype(window.logdensity.dtype)
    lost = far_below(window, logdensity) if compare_chains else jnp.zeros(window.logdensity.shape, bool)
    jax.debug.callback(_warn_host, lost, window.acceptance / count, window.logdensity / count, now, step_size)


#: A warm-up step size (in the mass matrix's units) beyond this, or not finite, means the log density is flat
#: along some direction at every scale the search tried: an improper posterior.
FLAT_STEP_SIZE = 1e10

IMPROPER_MESSAGE = (
    "ahmc: the warm-up's step size grew to {eps:.3g}: the log density is flat along some direction at every "
    "scale tried, as in an improper posterior (a flat prior that no likelihood term bounds). The draws then keep "
    "growing without bound, or cannot move once the step overflows, and represent no posterior. Give every "
    "parameter a proper prior, or check that the data enter the likelihood.")


def _warn_host(lost, acceptance, mean_logdensity, now=True, step_size=1.0):
    if not np.all(now):  # a vmapped cond runs this branch at every iteration: only the last one counts
        return
    eps = np.asarray(step_size, dtype=float).reshape(-1)
    if np.any(~np.isfinite(eps) | (eps > FLAT_STEP_SIZE)):
        warnings.warn(IMPROPER_MESSAGE.format(eps=float(np.nanmax(np.where(np.isfinite(eps), eps, np.inf)))),
                      UserWarning, stacklevel=2)
        return
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
    warnings.warn(
        "ahmc: at the end of warm-up " + "; ".join(parts) + ". Such a chain is stuck (e.g. in a "
        "negligible-mass local mode) and its draws do not represent the posterior: check R-hat, start the "
        "chains elsewhere (init_params / initial positions), run more warm-up, or use 3+ chains so that "
        "the warm-up can restart lost chains.",
        UserWarning, stacklevel=2,
    )


def _warn_nonfinite_reward(flag):
    jax.debug.callback(_warn_nonfinite_reward_host, flag)


def _warn_nonfinite_reward_host(flag=True):
    if not np.any(flag):
        return
    warnings.warn(NONFINITE_REWARD_MESSAGE, UserWarning, stacklevel=2)


def _check_finite(logdensity, grad):
    """Raise a ValueError now if the initial log density is not finite (when values are concrete)."""
    if isinstance(logdensity, jax.core.Tracer):
        return
    values = np.asarray(logdensity)
    grad_ok = np.all(np.stack([np.all(np.isfinite(np.asarray(g)).reshape(values.shape[0], -1), axis=1)
                               for g in jax.tree.leaves(grad)]), axis=0)
    bad = np.flatnonzero(~np.isfinite(values) | ~grad_ok)
    if bad.size:
        raise ValueError(
            f"The log density (or its gradient) is not finite at the initial position of chain(s) "
            f"{bad.tolist()}: log density {values[bad].tolist()}. Start the chains inside the "
            "support (for constrained parameters, sample an unconstrained transform)."
        )


def sample(rng_key, logdensity_fn, positions, num_warmup=1000, num_samples=1000, *, build=None, **options):
    """Warm up and sample with infinite adaptation: ``(samples, info, final EngineState)``.

    ``samples`` has leading axes ``(chains, num_samples)``; ``info`` fields have shape
    ``(num_warmup + num_samples, chains)``, warm-up first.  ``build`` makes the engine
    (default :func:`build_engine`; the RMHMC entry point passes its own).  The public
    entry points are :func:`ahmc.adapters.blackjax.run_chains` and ``run_rmhmc_chains``.
    """
    engine = _engine_for(build or build_engine, logdensity_fn, num_warmup, options)
    if build is None and engine.scan_draws is not None:
        # The plain engine: the whole run is one compiled program (initial state, warm-up, draws), which
        # compiles in about two thirds of the time of the two phases apart and skips the eager
        # initialisation; a start outside the support is still refused before it (cheap compile).
        _check_finite(*_start_density(logdensity_fn, positions, *_chain_data(options)))
        return _whole_run_jit(engine.init, engine.step, engine.scan_draws, rng_key, positions, num_warmup,
                              num_samples)
    init_key, warm_key, sample_key = jax.random.split(rng_key, 3)
    state = engine.init(positions, init_key)
    state, warm_info = _scan(engine.step, warm_key, state, num_warmup, keep_positions=False)
    state, (draws, sample_info) = _scan_draws(engine, sample_key, state, num_samples, num_warmup)
    info = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), warm_info, sample_info)
    samples = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), draws)
    return samples, info, state


def _whole_run(init, step, scan_draws, rng_key, positions, num_warmup, num_samples):
    """What :func:`sample` returns, with the same keys and draws, as one traced function."""
    init_key, warm_key, sample_key = jax.random.split(rng_key, 3)
    state = init(positions, init_key)
    state, warm_info = _scan_impl(step, warm_key, state, num_warmup, False)
    state, (draws, sample_info) = scan_draws(sample_key, state, num_samples, num_warmup)
    info = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), warm_info, sample_info)
    samples = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), draws)
    return samples, info, state


_whole_run_jit = jax.jit(_whole_run, static_argnums=(0, 1, 2, 5, 6))
_start_density = jax.jit(lambda fn, positions, *data: jax.vmap(jax.value_and_grad(fn))(positions, *data),
                         static_argnums=0)


def _chain_data(options) -> tuple:
    data = options.get("chain_data")
    return () if data is None else (data,)


_ENGINES: dict = {}
_MAX_ENGINES = 16


def _frozen(value):
    """A hashable stand-in for an option value (TypeError for arrays, whose equality is not a bool)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (np.ndarray, jax.Array)):
        raise TypeError("arrays are not cached")
    hash(value)
    return value


def _engine_for(build, logdensity_fn, num_warmup, options):
    """The engine for these arguments, reused across calls: its step functions are the jitted loops' static
    arguments, so a second ``run_chains`` with the same log density and options compiles nothing anew.
    Options holding arrays are built afresh (no cache)."""
    try:
        key = (build, logdensity_fn, int(num_warmup), _frozen(options))
    except TypeError:
        return build(logdensity_fn, num_warmup=num_warmup, **options)
    if key not in _ENGINES:
        if len(_ENGINES) >= _MAX_ENGINES:
            _ENGINES.pop(next(iter(_ENGINES)))
        _ENGINES[key] = build(logdensity_fn, num_warmup=num_warmup, **options)
    return _ENGINES[key]


def _scan_draws(engine, rng_key, state, num_samples, first_iteration):
    """The draws after warm-up, compiled: ``engine.scan_draws`` when the engine has one."""
    if engine.scan_draws is None:
        return _scan(engine.step, rng_key, state, num_samples, True)
    return _scan_draws_jit(engine.scan_draws, rng_key, state, num_samples, first_iteration)


_scan_draws_jit = jax.jit(lambda scan_draws, key, state, n, first: scan_draws(key, state, n, first),
                          static_argnums=(0, 3, 4))


def _scan(step, rng_key, state, num_steps, keep_positions):
    return _scan_jit(step, rng_key, state, num_steps, keep_positions)


def _scan_impl(step, rng_key, state, num_steps, keep_positions):
    def body(state, key):
        state, info = step(key, state)
        return state, ((state.position, info) if keep_positions else info)

    keys = jax.random.split(rng_key, num_steps)
    return jax.lax.scan(body, state, keys)


_scan_jit = jax.jit(_scan_impl, static_argnums=(0, 3, 4))
