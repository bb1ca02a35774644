"""The JAX engine's types: its state, per-iteration info, resolved configuration, and the engine itself."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from ahmc.core import RoundStats, TunerState

from ._jax_warmup import SearchBox, WindowStats

__all__ = ["EngineState", "EngineInfo", "EngineConfig", "Engine", "EngineParts", "SearchBox", "WindowStats"]


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

    Only with a centred objective (``"normalized_ess"``, the default, or ``"esjd_moments"``; ``None`` otherwise):

    center : float, (D,)                 mean of the latest mass-matrix window (flattened position)

    Only with a dense inverse mass matrix (``dense_mass=True``, or ``"auto"`` up to d = 200; ``None``
    otherwise):

    whitening : float, (D, D)            inverse Cholesky factor of ``inverse_mass_matrix``: the
                                         reward measures jumps as ``whitening @ x``

    Only when the warm-up searches for its first step size (a metric phase, no warm start; ``None``
    otherwise):

    step_size_search : StepSizeSearch    the initial step-size search's progress (its first iterations)
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
    step_size_search: Any = None


class EngineInfo(NamedTuple):
    """Per-iteration information; every field has shape (C,) (one per chain).

    step_size              step size used
    num_steps              the arm's ``L`` (maximum number of leapfrog steps)
    num_integration_steps  leapfrog steps taken (uniform on ``{1..L}``; a retry's included)
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
    retried                the trajectory diverged and the transition retried finer (``divergence_retry``);
                           ``is_divergent`` is then whether the retry diverged too
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
    retried: Any


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
    log_num_steps: bool = False  # the automatic box's L columns are log-spaced (an automatic L range only)


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


class EngineParts(NamedTuple):
    """What :func:`ahmc.adapters._jax_engine.build_engine` resolved and built (static): the engine's functions
    (``step``, ``init``, ``parameters``, ``scan_draws``) take it first."""

    config: EngineConfig
    logdensity_fn: Callable
    chain_data: Any
    plan: Any  # ahmc.core.schedule.WarmupPlan
    kernel: Any  # _jax_kernel.ChainKernel: the chains' transition
    warmup: Any  # _jax_warmup.Warmup: the warm-up adaptation
    rounds: Any  # _jax_rounds.Rounds: the GP-UCB rounds
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
