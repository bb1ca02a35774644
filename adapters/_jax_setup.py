"""What :func:`ahmc.adapters._jax_engine.build_engine` resolves before anything is traced: every check of
its options (a clear error naming the option), the warm-up plan, the tuner and its grid, a warm start's
metric and GP evidence, and the initial metric and chain count of the positions."""

from __future__ import annotations

import functools
import inspect
from typing import Any, NamedTuple

import jax
import numpy as np

from ahmc.core import Config, gp_ucb, search_space
from ahmc.core.config import GPConfig, resolve_options
from ahmc.core.mass_matrix import DENSE_AUTO_MAX_DIM
from ahmc.core.objectives import default_objective, get_objective, needs_center
from ahmc.core.options import check_option_names, whole_number_pair
from ahmc.core.schedule import WarmupPlan, first_unit_num_steps, metric_phase_length, plan_warmup
from ahmc.core.snapshot import prior_evidence
from ahmc.core.space import WARMUP_MAX_STEPS

import jax.numpy as jnp

from ._jax_kernel import MAX_STEP_BINS
from ._jax_rounds import build_rounds
from ._jax_sharding import to_host
from ._jax_types import Engine, EngineConfig
from ._jax_warmup import build_warmup


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


def engine_option_names(*builds) -> set:
    """Every option name the engine builders ``builds`` take (their arguments and the Config's), the
    ``valid`` of :func:`ahmc.core.options.check_option_names`."""
    names = set(Config.option_names())
    for build in builds:
        names |= set(inspect.signature(build).parameters)
    return names - {"logdensity_fn", "options"}


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
        check_option_names(execution, engine_option_names(build) | set(extra_names), owner)
        if paper:  # the paper's chains draw their step counts independently
            execution.setdefault("shared_num_steps", False)
        built_engine = build(logdensity_fn, **tuning, **execution)
        if isinstance(built_engine, Engine):
            built_engine = built_engine._replace(options=dict(tuning))
        return built_engine

    return built


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
        log_num_steps=config.log_num_steps,
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


class WarmInputs(NamedTuple):
    """A checked snapshot's values that start an engine, as arrays: :func:`ahmc.adapters._jax_run.sample`
    passes them to its compiled program as arguments, so a refit from another snapshot of the same shapes
    compiles nothing.  ``tuner_prior``: the tuner's first state, the snapshot's GP evidence on the grid."""

    inverse_mass_matrix: Any
    step_size: Any
    tuner_prior: Any


def warm_inputs(engine_parts, snapshot) -> WarmInputs:
    """The :class:`WarmInputs` of ``snapshot`` for an engine built with ``warm_start=snapshot``."""
    return WarmInputs(np.asarray(snapshot.inverse_mass_matrix), np.asarray(snapshot.step_size, float),
                      engine_parts.tuner_prior)


def _tuner_prior(tuner, warm_start, max_weight):
    """The tuner's first state holding a warm start's GP evidence (None without a warm start)."""
    if warm_start is None:
        return None
    if isinstance(warm_start, WarmInputs):
        return warm_start.tuner_prior
    space = tuner.space
    arms, rewards, weights, start_arm = prior_evidence(warm_start, space.step_size_unit, space.num_steps_unit,
                                                       max_weight)
    return tuner.prefill(arms, rewards, weights, start_arm=start_arm)


def _warm_metric(warm_start, inverse_mass_matrix, dense_mass, initial_step_size, follow_snapshot=True):
    """``(inverse_mass_matrix, dense_mass, initial_step_size)``: the warm start's where the user gave none
    (``follow_snapshot``: the snapshot's matrix sets ``dense_mass``; a ``metric_recipe`` sets it otherwise)."""
    if warm_start is None:
        return inverse_mass_matrix, dense_mass, initial_step_size
    if not isinstance(warm_start, WarmInputs) and not (hasattr(warm_start, "inverse_mass_matrix")
                                                       and hasattr(warm_start, "gp_arms")):
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
    if objective is None:  # the centred reward where the metric phase estimates the mean it needs
        has_metric_phase = metric_phase_length(num_warmup, metric_fraction, auto_box=step_size_bounds is None,
                                               adapt_mass_matrix=adapt_mass_matrix) >= 1
        objective = default_objective(bool(adapt_mass_matrix) and has_metric_phase)
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
