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

Its types are :mod:`ahmc.adapters._jax_types`'; the checks and resolution of its options
:mod:`ahmc.adapters._jax_setup`'s; whole runs (one compiled program, engines reused across calls)
:mod:`ahmc.adapters._jax_run`'s.

The execution options of :func:`build_engine` (how the chains run; the tuning options are the Config's)
are described in docs/architecture.md, "The engine's execution options".
"""

from __future__ import annotations

import functools
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

import blackjax.mcmc.integrators as integrators

from ahmc.core.mass_matrix import resolve_metric_recipe
from ahmc.core.objectives import needs_center
from ahmc.core.space import check_min_steps_fraction

from ._jax_kernel import build_chain_kernel
from ._jax_rounds import advance_round
from ._jax_scan import scan_draws
from ._jax_setup import (_DEFAULT, _check_options, _checked_plan, _gp_tuner, _rounds, _search_setup, _tuner_prior,
                         _warm_metric, _warmup_of, with_config)
from ._jax_state import current_parameters, initial_state
from ._jax_types import Engine, EngineConfig, EngineInfo, EngineParts, EngineState, SearchBox, WindowStats
from ._jax_warmup import WarmupState

__all__ = ["EngineConfig", "EngineState", "EngineInfo", "SearchBox", "WindowStats", "Engine", "build_engine"]


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
    log_step_size: bool = _DEFAULT.box.log_step_size, log_num_steps: bool = _DEFAULT.box.log_num_steps,
    target_acceptance_rate: float = _DEFAULT.warmup.target_acceptance_rate,
    initial_step_size: float | None = _DEFAULT.warmup.initial_step_size,
    objective: str | Callable | None = _DEFAULT.reward.objective,
    divergence_penalty: float = _DEFAULT.reward.divergence_penalty,
    divergence_retry: int | None = _DEFAULT.reward.divergence_retry,
    exploit_after_warmup: bool = _DEFAULT.schedule.exploit_after_warmup,
    schedule: str = _DEFAULT.schedule.schedule, k: int | None = _DEFAULT.schedule.k,
    decay: float = _DEFAULT.schedule.decay, freeze_after: int | str | None = _DEFAULT.schedule.freeze_after,
    # the GP (ahmc.core.config.GPConfig)
    capacity: int = _DEFAULT.gp.capacity, lengthscale: float = _DEFAULT.gp.lengthscale,
    noise_variance: float | None = _DEFAULT.gp.noise_variance, alpha: float = _DEFAULT.gp.alpha,
    delta: float = _DEFAULT.gp.delta, initial_design: int = _DEFAULT.gp.initial_design,
    # how the chains run (the module's text)
    integrator: Callable = integrators.velocity_verlet, divergence_threshold: float = 1000.0,
    kernel: Callable | None = None,
    restart_lost_chains: bool = _DEFAULT.warmup.restart_lost_chains,
    warm_start_weight: float = _DEFAULT.warmup.warm_start_weight, warm_start: Any = None,
    initial_arm: tuple[float, int] | None = None, chain_data: Any = None,
    round_end_fn: Callable | None = None, round_end_state: Any = None,
    super_transitions: int | None = None, shared_num_steps: bool = True,
    min_steps_fraction: float = _DEFAULT.box.min_steps_fraction, sequential_chains: bool = False,
    jump_estimate: str | None = _DEFAULT.reward.jump_estimate, host_solves: bool = True,
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
                      noise_variance=noise_variance, alpha=alpha, delta=delta, schedule=schedule, decay=decay,
                      initial_design=0 if warm_start is not None else initial_design)  # a snapshot's GP knows
    tuner_prior = _tuner_prior(tuner, warm_start, warm_start_weight)
    min_steps_fraction = check_min_steps_fraction(min_steps_fraction)
    config = EngineConfig(
        num_warmup=int(num_warmup), metric_phase_length=plan.metric_phase_length, round_length=int(round_length),
        num_warmup_rounds=plan.num_warmup_rounds, k=plan.k, pooled=bool(pooled),
        adapt_mass_matrix=bool(adapt_mass_matrix), auto_box=auto_box, step_size_factors=factors,
        max_integration_time=float(max_integration_time), num_steps_cap=int(num_steps_cap),
        warmup_integration_time=float(warmup_integration_time), target_acceptance_rate=float(target_acceptance_rate),
        objective=objective_fn, freeze_after=plan.freeze_rounds, restart_lost_chains=bool(restart_lost_chains),
        min_steps_fraction=min_steps_fraction, jump_estimate=jump_estimate,
        log_num_steps=bool(log_num_steps) and auto_box and num_steps_bounds is None)
    chain_kernel = build_chain_kernel(
        logdensity_fn, kernel=kernel, integrator=integrator, divergence_threshold=divergence_threshold,
        min_steps_fraction=min_steps_fraction, shared_num_steps=shared_num_steps,
        sequential_chains=sequential_chains, by_trajectory=jump_estimate == "trajectory", retry_factor=divergence_retry)
    warmup = _warmup_of(config, plan, recipe=recipe, use_center=use_center, compare_chains=chain_data is None,
                        user_num_steps=num_steps_bounds is not None, super_transitions=super_transitions)
    rounds = _rounds(tuner, space, box0, config, plan, round_end_fn=round_end_fn, super_transitions=super_transitions,
                     exploit_after_warmup=exploit_after_warmup, host_solves=bool(host_solves))
    parts = EngineParts(
        config=config, logdensity_fn=logdensity_fn, chain_data=chain_data, plan=plan, kernel=chain_kernel,
        warmup=warmup, rounds=rounds, tuner=tuner, box0=box0, inverse_mass_matrix=inverse_mass_matrix,
        dense_mass=dense_mass, initial_step_size=1.0 if initial_step_size is None else initial_step_size,
        use_center=use_center, round_end_fn=round_end_fn, round_end_state=round_end_state, tuner_prior=tuner_prior,
        super_transitions=super_transitions, buffer_length=int(super_transitions or round_length))
    step = partial(_step, parts)
    return Engine(init=partial(initial_state, parts), step=step, parameters=partial(current_parameters, parts),
                  tuner=tuner, config=config, scan_draws=partial(scan_draws, parts, step))


def engine_parts(engine: Engine) -> EngineParts:
    """What :func:`build_engine` resolved for ``engine`` (its functions are partials over it)."""
    return engine.init.args[0]


def _step(parts: EngineParts, rng_key, state: EngineState, sampling: bool = False, round_end: str = "cond"):
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
    # no retries while dual averaging learns the step size from the divergences (the metric phase)
    new, hmc_info, num_taken, retried = parts.kernel.step(key_hmc, state, eps, max_steps,
                                                          max_steps[0] if parts.config.pooled else None, data,
                                                          ~in_metric_phase)
    if sampling:  # the warm-up adaptation is done: its state carries over unchanged
        warm = WarmupState(state.step_size_adaptation, state.mass_matrix_adaptation, state.inverse_mass_matrix,
                           state.whitening, state.center, state.box, state.window, state.step_size_search)
        lost = jnp.zeros((num_chains,), bool)
        flat_new = jax.vmap(lambda p: ravel_pytree(p)[0])(new.position)
    else:
        accept = jnp.nan_to_num(hmc_info.acceptance_rate, nan=0.0).astype(dtype)
        new, warm, lost, flat_new = parts.warmup.update(jax.random.fold_in(key_tuner, 1), state, new, accept, early)
    # the tuner's divergence penalty counts the divergences a finer retry rescued: their arm is still too coarse
    stats = parts.rounds.add(state.round_stats, state.position, flat_new, num_taken,
                             hmc_info._replace(is_divergent=hmc_info.is_divergent | retried),
                             warm.inverse_mass_matrix, warm.whitening, warm.center)
    if not sampling:
        stats = jax.tree.map(lambda fresh, s: jnp.where(in_metric_phase, fresh, s),
                             parts.rounds.fresh(num_chains, dtype), stats)
    starts_gp = False if sampling else it == parts.plan.metric_phase_length - 1
    new_state, round_info = advance_round(parts, key_tuner, state, new, stats, warm, arm_l, in_metric_phase,
                                           starts_gp, round_end)
    info = EngineInfo(
        step_size=eps, num_steps=max_steps, num_integration_steps=num_taken.astype(jnp.int32),
        acceptance_rate=hmc_info.acceptance_rate, is_accepted=hmc_info.is_accepted,
        is_divergent=hmc_info.is_divergent, energy=hmc_info.energy, logdensity=new.logdensity,
        fixed_point_converged=getattr(hmc_info, "fixed_point_converged", jnp.ones((num_chains,), bool)),
        num_gradient_evals=getattr(hmc_info, "num_gradient_evals", num_taken).astype(jnp.int32),
        restarted=lost, retried=retried, **round_info)
    return new_state, info
