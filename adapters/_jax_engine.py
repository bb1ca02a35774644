"""The shared JAX engine of adaptive HMC: BlackJAX transitions, a warm-up adaptation and GP-UCB rounds.

One engine advances a *batch of chains* (leading chain axis) by one iteration.  It composes three parts,
each built once from the options (BlackJAX's ``build_kernel`` style):

* the chains' transition (:mod:`ahmc.adapters._jax_kernel`): every chain draws its number of
  leapfrog steps from ``{L_min..L}`` and makes one BlackJAX HMC transition (or a user kernel's, e.g.
  RMHMC's);
* the warm-up adaptation (:mod:`ahmc.adapters._jax_warmup`): pooled dual averaging, the
  mass-matrix windows, chain checks and, at the metric phase's end, the automatic search box;
* the GP-UCB rounds (:mod:`ahmc.adapters._jax_rounds`): a round's sums, its reward, the tuner's
  update at the round's end, a ``lax.cond`` on the *shared* iteration counter (under a ``vmap`` that
  predicate would turn the cond into a select and the GP would run on every iteration).

The schedule (metric-phase length, windows, ``k``, freezing) is :func:`ahmc.core.schedule.plan_warmup`'s.
``step(key, state, sampling=True)`` traces the sampling phase without the warm-up adaptation, and
``scan_draws`` runs whole rounds without a run-time branch per iteration.

The execution options of :func:`build_engine` (the tuning options are the Config's):

pooled
    One tuner for all chains (every chain runs the same arm; the chain-mean reward enters the
    GP with weight ``C``), or ``False``: an independent tuner per chain.
inverse_mass_matrix
    The initial (or, with ``adapt_mass_matrix=False``, fixed) inverse mass matrix: ``(d,)``, or
    ``(d, d)`` with ``dense_mass``; default identity.
integrator, divergence_threshold
    Passed to :func:`blackjax.mcmc.hmc.build_kernel`.
kernel
    Replaces that HMC kernel: ``(rng_key, HMCState, logdensity_fn, step_size, inverse_mass_matrix,
    num_integration_steps) -> (HMCState, info)``; ``info`` may carry ``fixed_point_converged`` and
    ``num_gradient_evals`` (RMHMC, :mod:`ahmc.adapters._jax_rmhmc`).
initial_arm
    ``(step_size, L)`` of the first round in a user box (default: the box's middle).
chain_data
    Per-chain data with a leading chain axis: chain ``c`` targets ``logdensity_fn(position, data_c)``
    (cross-validation folds); their log densities are then not compared (no restarts).
round_end_fn, round_end_state
    A reward from the round's draws instead of the objective:
    ``round_end_fn(draws, num_draws, hook_state) -> (reward, hook_state)``, once per round; ``draws``
    has leading axes ``(C, M)``, of which the first ``num_draws`` are the round's.
super_transitions
    Leapfrog budget ``B`` per chain and round (thesis 3.2): a round with maximum ``L`` makes
    ``B / E[L_t]`` transitions (stochastically rounded) and ``L <= 2 B - 1``.  Pooled only;
    ``EngineInfo.round`` and ``is_warmup`` then count rounds.
shared_num_steps
    Every chain of an iteration takes ``L_t`` from one shared ``u ~ U(0, 1)`` (default): vmapped
    chains then waste no gradients waiting for the longest; ``False`` is the paper's independent draws.
sequential_chains
    The chains' transitions one after another (``jax.lax.map``) instead of ``jax.vmap``: for kernels
    whose cost varies by chain (RMHMC's implicit solves).
"""

from __future__ import annotations

import functools
import inspect
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import blackjax.mcmc.hmc as hmc
import blackjax.mcmc.integrators as integrators
from blackjax.adaptation.step_size import find_reasonable_step_size

from ahmc.core import Config, RoundStats, TunerState, gp_ucb, search_space
from ahmc.core.config import GPConfig, resolve_options
from ahmc.core.mass_matrix import DENSE_AUTO_MAX_DIM, resolve_metric_recipe
from ahmc.core.objectives import get_objective, needs_center
from ahmc.core.options import check_option_names, whole_number_pair
from ahmc.core.schedule import WarmupPlan, first_unit_num_steps, plan_warmup, warmup_num_steps
from ahmc.core.snapshot import prior_evidence
from ahmc.core.space import WARMUP_MAX_STEPS, check_min_steps_fraction

from ._jax_kernel import MAX_STEP_BINS, ChainKernel, build_chain_kernel, inverse_cholesky
from ._jax_rounds import Rounds, build_rounds
from ._jax_sharding import to_host
from ._jax_warmup import SearchBox, Warmup, WarmupState, WindowStats, build_warmup

__all__ = ["EngineConfig", "EngineState", "EngineInfo", "SearchBox", "WindowStats", "Engine", "build_engine",
           "sample"]


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
    options: dict | None = None  # the tuning options the user set (a snapshot keeps them)


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
    (which equal the Config's, or resolve its ``None``) apply to the rest.  An :class:`Engine` keeps the
    tuning options set (``options``).
    """

    @functools.wraps(build)
    def built(logdensity_fn, **options):
        paper = options.get("paper_preset", False) is True
        tuning, execution = resolve_options(options, owner)
        valid = (set(inspect.signature(build).parameters) | set(extra_names)) - {"logdensity_fn"}
        check_option_names(execution, valid | set(Config.option_names()), owner)
        if paper:  # the paper's chains draw their step counts independently
            execution.setdefault("shared_num_steps", False)
        built_engine = build(logdensity_fn, **tuning, **execution)
        if isinstance(built_engine, Engine):
            built_engine = built_engine._replace(options=dict(tuning))
        return built_engine

    return built


@functools.partial(with_config, owner="ahmc")
def build_engine(
    logdensity_fn: Callable,
    *,
    num_warmup: int,
    step_size_bounds: tuple[float, float] | None = _DEFAULT.box.step_size_bounds,
    num_steps_bounds: tuple[int, int] | None = _DEFAULT.box.num_steps_bounds,
    adapt_mass_matrix: bool = _DEFAULT.warmup.adapt_mass_matrix,
    inverse_mass_matrix=None, dense_mass: bool | str = _DEFAULT.warmup.dense_mass,
    metric_recipe: str | None = _DEFAULT.warmup.metric_recipe,
    pooled: bool = True,
    round_length: int = _DEFAULT.schedule.round_length,
    metric_fraction: float | None = _DEFAULT.warmup.metric_fraction,
    step_size_factors: tuple[float, float] = _DEFAULT.box.step_size_factors,
    max_integration_time: float = _DEFAULT.box.max_integration_time,
    warmup_integration_time: float = _DEFAULT.warmup.warmup_integration_time,
    num_steps_cap: int = _DEFAULT.box.num_steps_cap,
    num_step_sizes: int = _DEFAULT.box.num_step_sizes, num_num_steps: int = _DEFAULT.box.num_num_steps,
    log_step_size: bool = _DEFAULT.box.log_step_size,
    target_acceptance_rate: float = _DEFAULT.warmup.target_acceptance_rate,
    initial_step_size: float | None = _DEFAULT.warmup.initial_step_size,
    objective: str | Callable = _DEFAULT.reward.objective,
    divergence_penalty: float = _DEFAULT.reward.divergence_penalty,
    exploit_after_warmup: bool = _DEFAULT.schedule.exploit_after_warmup,
    schedule: str = _DEFAULT.schedule.schedule, k: int | None = _DEFAULT.schedule.k,
    decay: float = _DEFAULT.schedule.decay, freeze_after: int | str | None = _DEFAULT.schedule.freeze_after,
    # the GP (ahmc.core.config.GPConfig)
    capacity: int = _DEFAULT.gp.capacity, lengthscale: float = _DEFAULT.gp.lengthscale,
    noise_variance: float | None = _DEFAULT.gp.noise_variance, alpha: float = _DEFAULT.gp.alpha,
    delta: float = _DEFAULT.gp.delta,
    # how the chains run (the module's text)
    integrator: Callable = integrators.velocity_verlet, divergence_threshold: float = 1000.0,
    kernel: Callable | None = None,
    restart_lost_chains: bool = _DEFAULT.warmup.restart_lost_chains,
    warm_start_weight: float = _DEFAULT.warmup.warm_start_weight, warm_start: Any = None,
    initial_arm: tuple[float, int] | None = None, chain_data: Any = None,
    round_end_fn: Callable | None = None, round_end_state: Any = None,
    super_transitions: int | None = None, shared_num_steps: bool = True,
    min_steps_fraction: float = _DEFAULT.box.min_steps_fraction, sequential_chains: bool = False,
    jump_estimate: str | None = _DEFAULT.reward.jump_estimate,
) -> Engine:
    """Build the adaptive-HMC engine for a batch of chains.

    The tuning options (search box, GP, schedule, warm-up, reward) are :class:`ahmc.core.Config`'s,
    with its defaults (``docs/options.md``); ``num_warmup`` sets the schedule
    (:func:`ahmc.core.schedule.plan_warmup`).  The others say how the chains run (the module's text).
    ``warm_start``: a checked :class:`ahmc.core.snapshot.TuningSnapshot` (``ahmc.adapters._jax_snapshot``):
    its metric and step size start the warm-up and its GP evidence the tuner.
    """
    recipe, dense_mass = resolve_metric_recipe(metric_recipe, dense_mass, adapt_mass_matrix)
    inverse_mass_matrix, dense_mass, initial_step_size = _warm_metric(
        warm_start, inverse_mass_matrix, dense_mass, initial_step_size,
        follow_snapshot=metric_recipe is None and (dense_mass or adapt_mass_matrix))
    checked = _check_options(
        logdensity_fn, num_warmup=num_warmup, step_size_bounds=step_size_bounds, num_steps_bounds=num_steps_bounds,
        round_length=round_length, metric_fraction=metric_fraction, step_size_factors=step_size_factors,
        max_integration_time=max_integration_time, warmup_integration_time=warmup_integration_time,
        num_steps_cap=num_steps_cap, target_acceptance_rate=target_acceptance_rate, dense_mass=dense_mass,
        objective=objective, divergence_penalty=divergence_penalty, adapt_mass_matrix=adapt_mass_matrix,
        super_transitions=super_transitions, pooled=pooled, round_end_fn=round_end_fn, initial_arm=initial_arm,
        jump_estimate=jump_estimate, kernel=kernel)
    objective_fn, jump_estimate, factors, metric_fraction = checked
    auto_box, use_center = step_size_bounds is None, needs_center(objective_fn)
    plan = _checked_plan(num_warmup, metric_fraction=metric_fraction, round_length=round_length, auto_box=auto_box,
                         adapt_mass_matrix=adapt_mass_matrix, k=k, freeze_after=freeze_after,
                         use_center=use_center, objective=objective)
    space, initial_arm, box0 = _search_setup(
        auto_box, step_size_bounds, num_steps_bounds, factors, num_step_sizes, num_num_steps, log_step_size,
        max_integration_time, num_steps_cap, super_transitions, initial_arm)
    tuner = _gp_tuner(space, plan, initial_arm=initial_arm, capacity=capacity, lengthscale=lengthscale,
                      noise_variance=noise_variance, alpha=alpha, delta=delta, schedule=schedule, decay=decay)
    tuner_prior = _tuner_prior(tuner, warm_start, warm_start_weight)
    min_steps_fraction = check_min_steps_fraction(min_steps_fraction)
    by_trajectory = jump_estimate == "trajectory"
    config = EngineConfig(
        num_warmup=int(num_warmup), metric_phase_length=plan.metric_phase_length, round_length=int(round_length),
        num_warmup_rounds=plan.num_warmup_rounds, k=plan.k, pooled=bool(pooled),
        adapt_mass_matrix=bool(adapt_mass_matrix), auto_box=auto_box, step_size_factors=factors,
        max_integration_time=float(max_integration_time), num_steps_cap=int(num_steps_cap),
        warmup_integration_time=float(warmup_integration_time), target_acceptance_rate=float(target_acceptance_rate),
        objective=objective_fn, freeze_after=plan.freeze_rounds, restart_lost_chains=bool(restart_lost_chains),
        min_steps_fraction=min_steps_fraction, jump_estimate=jump_estimate)
    chain_kernel = build_chain_kernel(
        logdensity_fn, kernel=kernel, integrator=integrator, divergence_threshold=divergence_threshold,
        min_steps_fraction=min_steps_fraction, shared_num_steps=shared_num_steps,
        sequential_chains=sequential_chains, by_trajectory=by_trajectory)
    warmup = _warmup_of(config, plan, recipe=recipe, use_center=use_center, compare_chains=chain_data is None,
                        user_num_steps=num_steps_bounds is not None, super_transitions=super_transitions)
    rounds = _rounds(tuner, space, box0, config, plan, round_end_fn=round_end_fn, super_transitions=super_transitions,
                     exploit_after_warmup=exploit_after_warmup)
    parts = _Parts(
        config=config, logdensity_fn=logdensity_fn, chain_data=chain_data, plan=plan, kernel=chain_kernel,
        warmup=warmup, rounds=rounds, tuner=tuner, box0=box0, inverse_mass_matrix=inverse_mass_matrix,
        dense_mass=dense_mass, initial_step_size=1.0 if initial_step_size is None else initial_step_size,
        use_center=use_center, round_end_fn=round_end_fn,
        round_end_state=round_end_state, super_transitions=super_transitions,
        buffer_length=int(super_transitions) if super_transitions else int(round_length), tuner_prior=tuner_prior)
    return Engine(init=partial(_init, parts), step=partial(_step, parts), parameters=partial(_parameters, parts),
                  tuner=tuner, config=config, scan_draws=partial(_scan_draws_of, parts))


def _warmup_of(config: EngineConfig, plan: WarmupPlan, *, recipe, use_center, compare_chains, user_num_steps,
               super_transitions):
    """The warm-up adaptation (:func:`ahmc.adapters._jax_warmup.build_warmup`) for the engine's settings."""
    return build_warmup(
        plan, target_acceptance_rate=config.target_acceptance_rate,
        warmup_integration_time=config.warmup_integration_time,
        warmup_max_steps=min(config.num_steps_cap, WARMUP_MAX_STEPS), recipe=recipe, use_center=use_center,
        restart_lost_chains=config.restart_lost_chains, compare_chains=compare_chains, auto_box=config.auto_box,
        user_num_steps=user_num_steps, step_size_factors=config.step_size_factors,
        max_integration_time=config.max_integration_time, num_steps_cap=config.num_steps_cap,
        box_max_steps=2 * int(super_transitions) - 1 if super_transitions else None)


def _rounds(tuner, space, box0, config, plan, **options):
    """The GP rounds' steps (:func:`build_rounds`) for the engine's configuration."""
    by_trajectory = config.jump_estimate == "trajectory"
    return build_rounds(
        tuner, pooled=config.pooled, log_grid=space.log_step_size or config.auto_box, by_trajectory=by_trajectory,
        num_step_values=min(int(box0[1][1]), MAX_STEP_BINS) if by_trajectory else 0,
        min_steps_fraction=config.min_steps_fraction, objective_fn=config.objective,
        num_warmup_rounds=plan.num_warmup_rounds, **options)


def _checked_plan(num_warmup, *, metric_fraction, auto_box, use_center, objective, **schedule):
    """The warm-up plan (:func:`plan_warmup`), with a metric phase where the automatic box or a centred
    objective needs one."""
    plan = plan_warmup(num_warmup, metric_fraction=metric_fraction, auto_box=auto_box, **schedule)
    if auto_box and plan.metric_phase_length < 1:
        raise ValueError(
            "The automatic search box needs a metric (dual-averaging) phase: "
            f"num_warmup={num_warmup} with metric_fraction={metric_fraction} leaves none. "
            "Give step_size_bounds=(lo, hi) and num_steps_bounds=(lo, hi), or more warm-up.")
    if use_center and plan.metric_phase_length < 1:
        raise ValueError(
            f"objective={objective!r} needs a metric phase to estimate the posterior mean: num_warmup={num_warmup} "
            f"with metric_fraction={metric_fraction} leaves none. Give more warm-up or a larger metric_fraction.")
    return plan


def _gp_tuner(space, plan, *, noise_variance, **gp_options):
    """The pooled GP-UCB tuner over ``space``, on the plan's schedule (its ``k`` and freezing round)."""
    noise_variance = GPConfig(noise_variance=noise_variance).resolved_noise_variance(one_chain_rounds=False)
    return gp_ucb(space, noise_variance=noise_variance, k=plan.k, freeze_after=plan.freeze_rounds, **gp_options)


class _Parts(NamedTuple):
    """What :func:`build_engine` resolved and built (static): the engine's functions take it first."""

    config: EngineConfig
    logdensity_fn: Callable
    chain_data: Any
    plan: WarmupPlan
    kernel: ChainKernel
    warmup: Warmup
    rounds: Rounds
    tuner: Any
    box0: tuple
    inverse_mass_matrix: Any
    dense_mass: Any
    initial_step_size: float
    use_center: bool
    round_end_fn: Callable | None
    round_end_state: Any
    super_transitions: int | None
    buffer_length: int
    tuner_prior: Any = None  # a NumPy TunerState holding a warm start's GP evidence


def _tuner_prior(tuner, warm_start, max_weight):
    """The tuner's first state holding a warm start's GP evidence (None without a warm start)."""
    if warm_start is None:
        return None
    space = tuner.space
    arms, rewards, weights, start_arm = prior_evidence(warm_start, space.step_size_unit, space.num_steps_unit,
                                                       max_weight)
    return tuner.prefill(arms, rewards, weights, start_arm=start_arm)


def _warm_metric(warm_start, inverse_mass_matrix, dense_mass, initial_step_size, follow_snapshot=True):
    """``(inverse_mass_matrix, dense_mass, initial_step_size)``: the warm start's where the user gave none
    (``follow_snapshot``: the snapshot's matrix sets ``dense_mass``; a ``metric_recipe`` sets it otherwise)."""
    if warm_start is None:
        return inverse_mass_matrix, dense_mass, initial_step_size
    if not hasattr(warm_start, "inverse_mass_matrix") or not hasattr(warm_start, "gp_arms"):
        raise ValueError("warm_start must be an ahmc.core.snapshot.TuningSnapshot (or the path of a saved one); "
                         f"got {type(warm_start).__name__}.")
    if inverse_mass_matrix is None:
        inverse_mass_matrix = warm_start.inverse_mass_matrix
        if dense_mass != "auto" and follow_snapshot:
            dense_mass = inverse_mass_matrix.ndim == 2
    return inverse_mass_matrix, dense_mass, warm_start.step_size if initial_step_size is None else initial_step_size


def _check_options(logdensity_fn, *, num_warmup, step_size_bounds, num_steps_bounds, round_length, metric_fraction,
                   step_size_factors, max_integration_time, warmup_integration_time, num_steps_cap,
                   target_acceptance_rate, dense_mass, objective, divergence_penalty, adapt_mass_matrix,
                   super_transitions, pooled, round_end_fn, initial_arm, jump_estimate, kernel):
    """Every check of :func:`build_engine`'s options, before anything is traced:
    ``(objective_fn, jump_estimate, step_size_factors, metric_fraction)`` resolved."""
    if not callable(logdensity_fn):
        raise ValueError("logdensity_fn must be callable: position -> scalar log density.")
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
            "the automatic step-size box.")
    if not isinstance(round_length, (int, np.integer)) or round_length < 1:
        raise ValueError(f"round_length must be a positive integer; got {round_length!r}.")
    metric_fraction = 0.5 if metric_fraction is None else metric_fraction
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
    objective_fn = get_objective(objective, divergence_penalty)
    if needs_center(objective_fn) and not adapt_mass_matrix:
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
    return objective_fn, jump_estimate, (lo_factor, hi_factor), metric_fraction


def _search_setup(auto_box, step_size_bounds, num_steps_bounds, factors, num_step_sizes, num_num_steps,
                  log_step_size, max_integration_time, num_steps_cap, super_transitions, initial_arm):
    """The tuner's grid, its first arm and the initial box ``((eps lo, hi), (L lo, hi))``.

    The automatic box is set at the end of the metric phase from ``eps*``; until then its grid is in units
    of ``eps*`` (``step_size_factors``) and of the ``L`` range, and the first arm is ``eps = eps*`` with a
    mean integration time of ~1.5."""
    if not auto_box:
        eps_box = _pair("step_size_bounds", step_size_bounds, integer=False)
        l_box = _check_user_num_steps(num_steps_bounds, super_transitions)
        space = search_space(eps_box, l_box, num_step_sizes=num_step_sizes, log_step_size=log_step_size)
        return space, initial_arm, (eps_box, l_box)
    unit_l = first_unit_num_steps(max_integration_time)
    if num_steps_bounds is None:
        space = search_space(factors, (1, num_num_steps), num_step_sizes=num_step_sizes, log_step_size=True)
        return space, (1.0, 1 + round(unit_l * (num_num_steps - 1))), (factors, (1, num_steps_cap))
    l_box = _check_user_num_steps(num_steps_bounds, super_transitions)  # every integer in it, eps automatic
    space = search_space(factors, l_box, num_step_sizes=num_step_sizes, log_step_size=True)
    return space, (1.0, l_box[0] + round(unit_l * (l_box[1] - l_box[0]))), (factors, l_box)


def _init(parts: _Parts, positions, rng_key=None) -> EngineState:
    """Initial state for positions with a leading chain axis."""
    num_chains = _check_positions(positions, parts.chain_data)
    data = () if parts.chain_data is None else (parts.chain_data,)
    logdensity, grad = jax.vmap(jax.value_and_grad(parts.logdensity_fn))(positions, *data)
    _check_finite(logdensity, grad)
    flat0, _ = ravel_pytree(jax.tree.map(lambda x: x[0], positions))
    dim = flat0.shape[0]
    dtype = flat0.dtype if jnp.issubdtype(flat0.dtype, jnp.floating) else jnp.float32
    imm, dense = _initial_metric(parts.inverse_mass_matrix, parts.dense_mass, dim, dtype)
    if parts.tuner_prior is not None:
        tuner_state = jax.tree.map(lambda x: jnp.asarray(x, dtype if np.issubdtype(x.dtype, np.floating) else x.dtype),
                                   parts.tuner_prior)
    else:
        tuner_state = parts.tuner.init(xp=jnp, dtype=dtype)
    if not parts.config.pooled:
        tuner_state = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_chains, *x.shape)), tuner_state)
    box = SearchBox(jnp.asarray(parts.box0[0], dtype), jnp.asarray(parts.box0[1], jnp.int32))
    eps0 = jnp.asarray(parts.initial_step_size, dtype)
    # A warm start's eps* was adapted for this metric already (and checked): no search from it.
    if parts.plan.metric_phase_length > 0 and parts.tuner_prior is None:
        key = jax.random.key(0) if rng_key is None else rng_key
        first = jax.tree.map(lambda x: x[0], (positions, grad, data))
        ref = hmc.HMCState(first[0], logdensity[0], first[1])
        chain0 = parts.logdensity_fn if not data else (lambda z: parts.logdensity_fn(z, first[2][0]))

        def kernel_generator(eps):
            return lambda key, state: parts.kernel.base(key, state, chain0, eps, imm, 1)

        eps0 = find_reasonable_step_size(key, kernel_generator, ref, eps0, parts.config.target_acceptance_rate)
    warmup = parts.warmup
    return EngineState(
        position=positions, logdensity=logdensity, logdensity_grad=grad, iteration=jnp.asarray(0, jnp.int32),
        tuner=tuner_state, round_stats=parts.rounds.fresh(num_chains, dtype), inverse_mass_matrix=imm, box=box,
        step_size_adaptation=warmup.step_size_state(eps0), mass_matrix_adaptation=warmup.mass_matrix_state(dim, dtype, dense, num_chains),
        adapt_probability=jnp.asarray(1.0, dtype), window=warmup.window_state(num_chains, dtype),
        whitening=inverse_cholesky(imm) if dense else None, **_round_buffers(parts, positions, tuner_state, box, rng_key))


def _check_positions(positions, chain_data) -> int:
    """The chain count of ``positions`` (a leading axis on every leaf), or a ValueError that says how to add it."""
    leaves = jax.tree.leaves(positions)
    if not leaves:
        raise ValueError("positions is an empty pytree.")
    num_chains = int(np.shape(leaves[0])[0]) if np.ndim(leaves[0]) > 0 else 0
    if num_chains < 1 or any(np.ndim(x) < 1 or np.shape(x)[0] != num_chains for x in leaves):
        raise ValueError(
            "positions must have a leading chain axis of the same size on every leaf "
            "(for one chain: jax.tree.map(lambda x: x[None], position)).")
    if chain_data is not None and any(np.ndim(x) < 1 or np.shape(x)[0] != num_chains
                                      for x in jax.tree.leaves(chain_data)):
        raise ValueError(f"chain_data must have a leading chain axis of size {num_chains} on every leaf.")
    return num_chains


def _initial_metric(inverse_mass_matrix, dense_mass, dim, dtype):
    """``(inverse mass matrix, dense)``: the user's (checked against ``dense_mass``) or the identity."""
    auto_dense = isinstance(dense_mass, str)
    if inverse_mass_matrix is None:
        dense = bool(dense_mass) and not (auto_dense and dim > DENSE_AUTO_MAX_DIM)
        return (jnp.eye(dim, dtype=dtype) if dense else jnp.ones(dim, dtype)), dense
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
    return imm, dense


def _round_buffers(parts: _Parts, positions, tuner_state, box, rng_key) -> dict:
    """Initial values of the optional state fields (hook buffer, round counters, center)."""
    extra = {}
    if parts.round_end_fn is not None:
        extra["round_draws"] = jax.tree.map(
            lambda x: jnp.zeros((x.shape[0], parts.buffer_length) + x.shape[1:], x.dtype), positions)
        extra["round_end_state"] = parts.round_end_state
    if parts.round_end_fn is not None or parts.super_transitions:
        extra["round_iteration"] = jnp.asarray(0, jnp.int32)
    if parts.super_transitions:
        key = jax.random.fold_in(jax.random.key(0) if rng_key is None else rng_key, 7)
        extra["round_target"] = parts.rounds.length(tuner_state, box, key)  # reset when the GP starts
    if parts.use_center:  # replaced at every mass-matrix window's end, before the GP starts
        extra["center"] = jnp.mean(jax.vmap(lambda p: ravel_pytree(p)[0])(positions), axis=0)
    return extra


def _step(parts: _Parts, rng_key, state: EngineState, sampling: bool = False, round_end: str = "cond"):
    """One iteration of every chain: ``(state, info)``.

    Both extra arguments are static and change only the cost, never the result, when the caller's promise
    holds.  ``sampling=True``: the iteration is past the metric phase, so it is traced without the warm-up
    adaptation, whose branches would never run.  ``round_end``: ``"cond"`` decides at run time whether the
    round ends here; ``"never"`` / ``"always"`` are promises (fixed-length rounds only), which let
    ``scan_draws`` drop the run-time branch: on CPU a ``lax.cond`` around the GP update cost a few
    microseconds per iteration even when not taken, as much as a cheap model's gradients."""
    num_chains = state.logdensity.shape[0]
    it = state.iteration
    dtype = state.inverse_mass_matrix.dtype
    key_hmc, key_tuner = jax.random.split(rng_key)
    in_metric_phase = jnp.asarray(False) if sampling else it < parts.plan.metric_phase_length
    arm_eps, arm_l = parts.rounds.chain_arms(state.tuner, state.box, num_chains)
    eps, max_steps, early = arm_eps, arm_l, None
    if not sampling:
        warm_eps, warm_l, early = parts.warmup.parameters(state)
        eps, max_steps = jnp.where(in_metric_phase, warm_eps, arm_eps), jnp.where(in_metric_phase, warm_l, arm_l)
    data = () if parts.chain_data is None else (parts.chain_data,)
    new, hmc_info, num_taken = parts.kernel.step(key_hmc, state, eps, max_steps,
                                                 max_steps[0] if parts.config.pooled else None, data)
    if sampling:  # the warm-up adaptation is done: its state carries over unchanged
        warm = WarmupState(state.step_size_adaptation, state.mass_matrix_adaptation, state.inverse_mass_matrix,
                           state.whitening, state.center, state.box, state.window)
        lost = jnp.zeros((num_chains,), bool)
        flat_new = jax.vmap(lambda p: ravel_pytree(p)[0])(new.position)
    else:
        accept = jnp.nan_to_num(hmc_info.acceptance_rate, nan=0.0).astype(dtype)
        new, warm, lost, flat_new = parts.warmup.update(jax.random.fold_in(key_tuner, 1), state, new, accept, early)
    stats = parts.rounds.add(state.round_stats, state.position, flat_new, num_taken, hmc_info,
                             warm.inverse_mass_matrix, warm.whitening, warm.center)
    if not sampling:
        stats = jax.tree.map(lambda fresh, s: jnp.where(in_metric_phase, fresh, s),
                             parts.rounds.fresh(num_chains, dtype), stats)
    starts_gp = False if sampling else it == parts.plan.metric_phase_length - 1
    new_state, round_info = _advance_round(parts, key_tuner, state, new, stats, warm, arm_l, in_metric_phase,
                                           starts_gp, round_end)
    info = EngineInfo(
        step_size=eps, num_steps=max_steps, num_integration_steps=num_taken.astype(jnp.int32),
        acceptance_rate=hmc_info.acceptance_rate, is_accepted=hmc_info.is_accepted,
        is_divergent=hmc_info.is_divergent, energy=hmc_info.energy, logdensity=new.logdensity,
        fixed_point_converged=getattr(hmc_info, "fixed_point_converged", jnp.ones((num_chains,), bool)),
        num_gradient_evals=getattr(hmc_info, "num_gradient_evals", num_taken).astype(jnp.int32),
        restarted=lost, **round_info)
    return new_state, info


def _advance_round(parts: _Parts, key_tuner, state, new, stats, warm, arm_l, in_metric_phase, starts_gp, round_end):
    """The round's bookkeeping after the transition: its end (reward, tuner update) when it ends here, the
    next state, and the round fields of the iteration's info."""
    num_chains, it, plan = state.logdensity.shape[0], state.iteration, parts.plan
    dtype = state.inverse_mass_matrix.dtype
    rounds, hook, super_transitions = parts.rounds, parts.round_end_fn is not None, parts.super_transitions
    since_gp = it - plan.metric_phase_length
    is_round_end = (~in_metric_phase) & ((since_gp + 1) % plan.round_length == 0)
    if super_transitions:
        key_tuner, key_length = jax.random.split(key_tuner)
        round_target = jnp.where(starts_gp, rounds.length(state.tuner, warm.box, key_length), state.round_target)
        is_round_end = (~in_metric_phase) & (state.round_iteration + 1 >= round_target)
    round_draws = None
    if hook:
        slot = jnp.minimum(state.round_iteration, parts.buffer_length - 1)
        round_draws = jax.tree.map(lambda buf, x: buf.at[:, slot].set(x), state.round_draws, new.position)
    end_round = partial(rounds.close, arm_l=arm_l, key_tuner=key_tuner, round_draws=round_draws,
                        num_draws=state.round_iteration + 1 if hook else None,
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
        position=new.position, logdensity=new.logdensity, logdensity_grad=new.logdensity_grad, iteration=it + 1,
        tuner=tuner_state, round_stats=stats, adapt_probability=p, inverse_mass_matrix=warm.inverse_mass_matrix,
        box=warm.box, step_size_adaptation=warm.step_size_adaptation,
        mass_matrix_adaptation=warm.mass_matrix_adaptation, window=warm.window, center=warm.center,
        whitening=warm.whitening)
    round_index = jnp.where(in_metric_phase, 0, since_gp // plan.round_length + 1).astype(jnp.int32)
    is_warmup = it < plan.num_warmup
    if hook or super_transitions:
        new_state = new_state._replace(
            round_iteration=jnp.where(is_round_end | in_metric_phase, 0, state.round_iteration + 1))
    if hook:
        new_state = new_state._replace(round_draws=round_draws, round_end_state=hook_state)
    if super_transitions:  # warm-up and round indices count rounds of varying length
        key_next = jax.random.fold_in(key_tuner, 1)
        new_state = new_state._replace(round_target=jnp.where(
            is_round_end, rounds.length(tuner_state, warm.box, key_next), round_target))
        round_index = jnp.where(in_metric_phase, 0, state.tuner.round + 1).astype(jnp.int32)
        is_warmup = in_metric_phase | (state.tuner.round < plan.num_warmup_rounds)
    per_chain = partial(jnp.broadcast_to, shape=(num_chains,))
    return new_state, dict(reward=reward, round=per_chain(round_index), arm_changed=changed,
                           adapt_probability=per_chain(p), is_warmup=per_chain(is_warmup))


def _parameters(parts: _Parts, state: EngineState) -> dict:
    """Current sampler parameters: the arm's (per chain when not pooled); in the metric phase the DA ones."""
    if parts.config.pooled:
        eps, steps = parts.rounds.arm(state.tuner, state.box)
    else:
        eps, steps = parts.rounds.chain_arms(state.tuner, state.box, state.logdensity.shape[0])
    config = parts.config
    in_metric_phase = state.iteration < config.metric_phase_length
    warm_eps = jnp.exp(state.step_size_adaptation.log_step_size_avg).astype(eps.dtype)
    warm_l = warmup_num_steps(warm_eps, config.warmup_integration_time, min(config.num_steps_cap, WARMUP_MAX_STEPS),
                              jnp)
    return {
        "step_size": jnp.where(in_metric_phase, warm_eps, eps),
        "inverse_mass_matrix": state.inverse_mass_matrix,
        "num_integration_steps": jnp.where(in_metric_phase, warm_l, steps),
        "min_steps_fraction": config.min_steps_fraction,  # the jitter the arm was tuned with
    }


def _scan_draws_of(parts: _Parts, rng_key, state: EngineState, num_samples: int, first_iteration: int):
    """Run ``num_samples`` iterations after warm-up: ``(state, (positions, info))`` as a ``lax.scan`` of ``step``
    with ``jax.random.split(rng_key, num_samples)`` gives, the same draws, but cheaper.  ``first_iteration``
    (static) is ``state.iteration``, at least ``num_warmup``.  With fixed-length rounds each whole round runs
    as an inner scan of iterations that cannot end a round, followed by the round's end, so no iteration
    branches at run time; the partial rounds at either end use ``step``."""
    keys = jax.random.split(rng_key, num_samples)
    plan = parts.plan
    per_iteration = partial(_step, parts, sampling=True)
    if parts.super_transitions:
        return _scan_steps(per_iteration, state, keys)
    into_round = (first_iteration - plan.metric_phase_length) % plan.round_length
    head = min(num_samples, (plan.round_length - into_round) % plan.round_length)
    num_rounds = (num_samples - head) // plan.round_length
    tail = num_samples - head - num_rounds * plan.round_length
    # An empty piece is left out rather than scanned over no keys: it would still be traced and
    # lowered (about half the tracing time of the draws on a 10-d Gaussian, 2026-11-28).
    pieces = []
    if head:
        state, out = _scan_steps(per_iteration, state, keys[:head])
        pieces.append(out)
    if num_rounds:
        inner = partial(_step, parts, sampling=True, round_end="never")
        blocks = keys[head:head + num_rounds * plan.round_length].reshape(
            (num_rounds, plan.round_length) + keys.shape[1:])
        # A pooled tuner without a hook, after warm-up (the exploit step lies in the warm-up): rounds run in
        # segments (:func:`ahmc.adapters._jax_rounds.segmented_rounds`).  Otherwise one round per scan step.
        if parts.config.pooled and parts.round_end_fn is None and first_iteration >= plan.num_warmup:
            state, out = parts.rounds.segmented(inner, state, blocks)
        else:
            def one_round(state, round_keys):
                state, (positions, info) = _scan_steps(inner, state, round_keys)
                state, (reward, changed, p) = parts.rounds.finish(state, round_keys[-1])
                info = info._replace(reward=info.reward.at[-1].set(reward),
                                     arm_changed=info.arm_changed.at[-1].set(changed),
                                     adapt_probability=info.adapt_probability.at[-1].set(p))
                return state, (positions, info)

            state, out = jax.lax.scan(one_round, state, blocks)
        pieces.append(jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), out))
    if tail or not pieces:
        state, out = _scan_steps(per_iteration, state, keys[head + num_rounds * plan.round_length:])
        pieces.append(out)
    return state, jax.tree.map(lambda *xs: jnp.concatenate(xs), *pieces)


def _scan_steps(step_fn, state, keys):
    def body(state, key):
        state, info = step_fn(key, state)
        return state, (state.position, info)
    return jax.lax.scan(body, state, keys)

def _check_finite(logdensity, grad):
    """Raise a ValueError now if the initial log density is not finite (when values are concrete)."""
    if isinstance(logdensity, jax.core.Tracer):
        return
    values = to_host(logdensity)
    grad_ok = np.all(np.stack([np.all(np.isfinite(to_host(g)).reshape(values.shape[0], -1), axis=1)
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
    entry point is :func:`ahmc.adapters.blackjax.run_chains` (``metric=`` for RMHMC).
    """
    build = build or build_engine
    engine = _engine_for(build, logdensity_fn, num_warmup, options)
    if build is build_engine and engine.scan_draws is not None:
        # The plain engine: the whole run is one compiled program (initial state, warm-up, draws), which
        # compiles in about two thirds of the time of the two phases apart and skips the eager
        # initialisation; a start outside the support is still refused before it (cheap compile).
        _check_finite(*_start_density(logdensity_fn, positions, *_chain_data(options)))
        # Short runs scan ``step`` for the draws too: one traced iteration compiles faster (eight schools
        # 6.3 -> 5.3 s) than ``scan_draws``' cheaper loop saves at run time; long runs take that loop.
        draws = engine.scan_draws if num_samples >= SEGMENTED_MIN_SAMPLES else None
        return _whole_run_jit(engine.init, engine.step, draws, rng_key, positions, num_warmup, num_samples)
    init_key, warm_key, sample_key = jax.random.split(rng_key, 3)
    state = engine.init(positions, init_key)
    state, warm_info = _scan(engine.step, warm_key, state, num_warmup, keep_positions=False)
    state, (draws, sample_info) = _scan_draws(engine, sample_key, state, num_samples, num_warmup)
    info = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), warm_info, sample_info)
    samples = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), draws)
    return samples, info, state


#: From this many draws per chain on, ``run_chains`` samples with ``scan_draws`` (segmented rounds, no warm-up
#: code in the loop), below it with the warm-up's own ``step``: the same draws; the specialised loop costs
#: about a second more to compile and saves 0.03-0.07 s per 1000 draws on the quick models (eight schools,
#: Pima; docs/decisions.md, "One traced step for short runs").
SEGMENTED_MIN_SAMPLES = 5000


def _whole_run(init, step, scan_draws, rng_key, positions, num_warmup, num_samples):
    """What :func:`sample` returns, with the same keys and draws, as one traced function (``scan_draws=None``:
    the draws too are a scan of ``step``)."""
    init_key, warm_key, sample_key = jax.random.split(rng_key, 3)
    state = init(positions, init_key)
    state, warm_info = _scan_impl(step, warm_key, state, num_warmup, False)
    if scan_draws is None:
        state, (draws, sample_info) = _scan_impl(step, sample_key, state, num_samples, True)
    else:
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
