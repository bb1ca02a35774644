"""The annealed GP-UCB tuner of Algorithm 2 (Wang, Mohamed & de Freitas 2013).

Round ``i = 1, 2, ...``: the sampler runs with arm ``gamma_i``, reports a
reward ``r_i``; the tuner adds ``(gamma_i, r_i)`` to its Gaussian process and,
with probability ``p_i``, moves to the maximiser of

    u(gamma) = s * mu_i(gamma) + p_i * sqrt(beta_{i+1}) * sigma_i(gamma),

otherwise keeps ``gamma_i``.  ``s = alpha / |best reward so far|`` rescales the
rewards each time a new best appears (for positive rewards this is the paper's
``alpha / r_best``; the absolute value keeps the sign right for rewards such as
minus a cross-validation error), and

    beta_{i+1} = 2 log((i + 1)^(d/2 + 2) pi^2 / (3 delta)),   d = 2,
    p_i = max(i - k + 1, 1)^(-1/2)          (schedule "inverse_sqrt", paper)
    p_i = exp(-lambda (i - 1))              (schedule "exponential", thesis).

Because ``p_i -> 0`` the adaptation diminishes, and every arm's kernel leaves
the target invariant, so adaptation may go on after warm-up (paper, section 4).
We add the *standard deviation* (not the variance) in the bonus, as GP-UCB
defines it.

Everything here is a pure function of arrays: the array namespace comes from
the state (NumPy or ``jax.numpy``), random numbers are passed in as uniforms,
shapes never change, and no Python ``if`` looks at an array value, so the same
code runs eagerly under NumPy and under ``jax.jit``/``jax.vmap``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, NamedTuple

import numpy as np

from . import gp
from .space import SearchSpace

_FLOAT32_TINY = float(np.finfo(np.float32).tiny)

__all__ = ["TunerState", "TunerInfo", "TunerWork", "Surrogate", "Tuner", "gp_ucb", "adapt_probability", "ucb_beta"]

SCHEDULES = ("inverse_sqrt", "exponential")


class TunerState(NamedTuple):
    """State of the annealed GP-UCB tuner (arrays only; a JAX pytree).

    Attributes
    ----------
    round : int32, ()
        Number of rewards received so far (``i`` after the update).
    arm : int32, ()
        Flat grid index of the arm to run next.
    buffer : ArmBuffer
        The distinct arms observed, pooled (see :mod:`ahmc.core.gp`).
    grid_variance : float, (G, H)
        Posterior variance of the GP on the whole grid, kept up to date by
        exact rank-one steps, except for ``pending_weight`` (below).
    best_reward, worst_reward : float, ()
        Extremes of the finite rewards seen (``-inf`` / ``+inf`` before any).
    scale : float, ()
        ``s = alpha / |best_reward|`` (1 before any finite reward).
    freeze_round : int32, ()
        From this round on the arm no longer moves (a large number = never).
    pending_arm : int32, ()
        Arm whose latest rewards the buffer holds but ``grid_variance`` does
        not yet (-1: none).
    pending_weight : float, ()
        Their total weight.  Only an acquisition reads the variance, and
        ``c`` rewards at one arm change it exactly as one reward of weight
        ``c`` does, so the rounds between acquisitions pool their rewards and
        the variance takes them in one rank-one step when the next arm is
        chosen (or by :func:`settle`): one solve per acquisition instead of
        one per round.
    """

    round: object
    arm: object
    buffer: gp.ArmBuffer
    grid_variance: object
    best_reward: object
    worst_reward: object
    scale: object
    freeze_round: object
    pending_arm: object
    pending_weight: object


class TunerInfo(NamedTuple):
    """What one update did (arrays only).

    Attributes
    ----------
    round : int32, ()              index ``i`` of the round just scored
    reward : float, ()             reward as given (may be non-finite)
    clean_reward : float, ()       reward entered into the GP
    is_finite : bool, ()           whether the given reward was finite
    arm : int32, ()                arm that earned the reward
    adapt_probability : float, ()  ``p_i``
    beta : float, ()               ``beta_{i+1}``
    is_adapting : bool, ()         ``uniform < p_i`` and not frozen
    proposed_arm : int32, ()       maximiser of the acquisition function (-1: not computed, lazy update)
    next_arm : int32, ()           arm for round ``i + 1``
    arm_changed : bool, ()         ``next_arm != arm``
    num_arms : int32, ()           distinct arms in the buffer
    is_evicting : bool, ()         whether a stored arm was dropped for this one
    """

    round: object
    reward: object
    clean_reward: object
    is_finite: object
    arm: object
    adapt_probability: object
    beta: object
    is_adapting: object
    proposed_arm: object
    next_arm: object
    arm_changed: object
    num_arms: object
    is_evicting: object


class TunerWork(NamedTuple):
    """What :func:`record <gp_ucb>` decided and :func:`complete <gp_ucb>` carries out (arrays only).

    Attributes
    ----------
    needs_solve : bool, ()          whether ``complete`` has anything to do (any of the next three)
    is_moved : bool, ()             rewards were pending at an arm moved from outside: settle them
    is_evicting : bool, ()          a stored arm was dropped for this one: forget it
    is_adapting : bool, ()          ``uniform < p_i`` and not frozen: pick the next arm
    previous_buffer : ArmBuffer     the buffer before this reward (settling and forgetting read it)
    previous_pending_arm, previous_pending_weight : the pending rewards before this one
    slot : int32, ()                the buffer slot of this reward
    reward, clean_reward, is_finite, adapt_probability, beta : as in :class:`TunerInfo`
    """

    needs_solve: object
    is_moved: object
    is_evicting: object
    is_adapting: object
    previous_buffer: gp.ArmBuffer
    previous_pending_arm: object
    previous_pending_weight: object
    slot: object
    reward: object
    clean_reward: object
    is_finite: object
    adapt_probability: object
    beta: object


class Surrogate(NamedTuple):
    """The GP surrogate on the grid, for plots.

    ``mean`` and ``sd`` are in reward units; ``acquisition`` is the UCB that
    the next move would maximise (in units of the rescaled reward).
    All three have shape (G, H), rows along ``step_sizes``.
    """

    step_sizes: np.ndarray
    num_steps: np.ndarray
    mean: object
    sd: object
    acquisition: object


class Tuner(NamedTuple):
    """Pure functions returned by :func:`gp_ucb`.

    ``init(xp=numpy, dtype=None) -> TunerState``
    ``update(state, reward, uniform, weight=1.0, *, lazy=False) -> (TunerState, TunerInfo)``
    ``arm(state) -> (step_size, num_steps)``
    ``surrogate(state) -> Surrogate``
    ``settle(state) -> TunerState`` (the pending weight taken into ``grid_variance``)
    ``record(state, reward, uniform, weight=1.0) -> (TunerState, TunerWork)`` and
    ``complete(state, work, *, cond=None) -> (TunerState, proposed_arm)``: ``update``'s two
    halves, without and with its linear algebra
    ``prefill(arms, rewards, weights, dtype=None) -> TunerState``: a NumPy state whose GP holds
    earlier evidence (a warm start), at round 0
    """

    init: Callable
    update: Callable
    arm: Callable
    surrogate: Callable
    space: SearchSpace
    settle: Callable
    record: Callable
    complete: Callable
    prefill: Callable = None


def adapt_probability(round_index, *, schedule: str = "inverse_sqrt", k: int = 100, decay: float = 0.01, xp=np):
    """Probability ``p_i`` of moving the arm after round ``i`` (``i >= 1``); ``xp=math``: Python numbers."""
    if xp is math:  # one round of an eager loop (see the tuner's _update_eager)
        i = float(round_index)
        return 1.0 / math.sqrt(max(i - k + 1, 1.0)) if schedule == "inverse_sqrt" else math.exp(-decay * (i - 1.0))
    i = xp.asarray(round_index)
    if schedule == "inverse_sqrt":
        return 1.0 / xp.sqrt(xp.maximum(i - k + 1, 1) * 1.0)
    return xp.exp(-decay * (i - 1.0))


def ucb_beta(round_index, *, delta: float = 0.1, dim: int = 2, xp=np):
    """``beta_{i+1} = 2 log((i+1)^(d/2+2) pi^2 / (3 delta))`` (Srinivas et al. 2010); ``xp=math``: Python numbers."""
    i = float(round_index) if xp is math else xp.asarray(round_index)
    return 2.0 * ((dim / 2.0 + 2.0) * xp.log(i + 1.0) + math.log(math.pi**2 / (3.0 * delta)))


def _namespace(array):
    return array.__array_namespace__()


def _check_positive(name, value, *, integer=False, allow_zero=False):
    ok_type = isinstance(value, (int, np.integer)) if integer else isinstance(value, (int, float, np.integer, np.floating))
    if not ok_type or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "integer" if integer else "number"
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite {kind} {bound}; got {value!r}.")


def gp_ucb(
    space: SearchSpace,
    *,
    initial_arm: tuple[float, int] | None = None,
    capacity: int = 128,
    lengthscale: float = 0.2,
    noise_variance: float = 0.1,
    alpha: float = 4.0,
    delta: float = 0.1,
    schedule: str = "inverse_sqrt",
    k: int = 100,
    decay: float = 0.01,
    freeze_after: int | None = None,
    initial_design: int = 0,
) -> Tuner:
    """Build the annealed GP-UCB tuner of (step size, number of leapfrog steps).

    Parameters
    ----------
    space
        The grid of arms, from :func:`ahmc.core.search_space`.
    initial_arm
        ``(step_size, num_steps)`` for the first round (snapped to the grid);
        default: the middle of the box.
    capacity
        Maximum number of distinct arms the GP remembers.  When a new arm
        arrives and the buffer is full, the slot with the fewest visits
        (oldest last visit among ties) is dropped and its information removed
        from the posterior exactly, so the GP never claims knowledge it no
        longer holds: forgotten regions get their uncertainty back.
    lengthscale
        ``kappa``: kernel length scale as a fraction of the box width (0.2).
    noise_variance
        ``sigma_eta^2``: variance of one reward's noise relative to the GP's
        unit prior variance.  Rewards are rescaled so that the best is
        ``alpha = 4``; the default 0.1 treats one round's reward as having a
        noise sd of about 8% of that best value, so that repeated visits of an
        arm matter and a single lucky round does not dominate.
    alpha
        Scale of the best reward after rescaling (paper: 4).
    delta
        Confidence parameter of ``beta`` (paper: 0.1).
    schedule
        ``"inverse_sqrt"``: ``p_i = max(i - k + 1, 1)^(-1/2)`` (paper, with ``k``);
        ``"exponential"``: ``p_i = exp(-decay (i - 1))`` (thesis, ``decay`` = lambda).
    freeze_after
        If given, the arm never moves after this many rounds (0 = fixed arm).
    initial_design
        The first ``initial_design`` proposals go to arms spread evenly over
        the ``L`` columns at the first arm's step size (an initial design, as
        Bayesian optimisation starts; an arm visited already is left to the
        UCB), so the GP sees short and long trajectories before it exploits.
        0 (this function's default): the UCB from the first round, the paper's;
        the adapters' ``Config`` uses 3.

    Examples
    --------
    >>> import numpy as np
    >>> from ahmc.core import search_space, gp_ucb
    >>> tuner = gp_ucb(search_space((0.01, 1.0), (1, 50)))
    >>> state = tuner.init()
    >>> state, info = tuner.update(state, reward=0.5, uniform=0.3)
    >>> int(state.round), bool(info.is_adapting)
    (1, True)
    """
    if not isinstance(space, SearchSpace):
        raise ValueError("space must be a SearchSpace from ahmc.core.search_space(...).")
    _check_positive("capacity", capacity, integer=True)
    _check_positive("lengthscale", lengthscale)
    _check_positive("noise_variance", noise_variance)
    _check_positive("alpha", alpha)
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1); got {delta!r}.")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}.")
    _check_positive("k", k, integer=True)
    _check_positive("decay", decay)
    if freeze_after is not None:
        _check_positive("freeze_after", freeze_after, integer=True, allow_zero=True)
    _check_positive("initial_design", initial_design, integer=True, allow_zero=True)
    if initial_arm is None:
        first_arm = space.center_arm()
    else:
        try:
            eps0, steps0 = initial_arm
        except (TypeError, ValueError):
            raise ValueError(f"initial_arm must be (step_size, num_steps); got {initial_arm!r}.") from None
        if not (math.isfinite(eps0) and eps0 > 0 and math.isfinite(steps0) and steps0 >= 1):
            raise ValueError(f"initial_arm must have step_size > 0 and num_steps >= 1; got {initial_arm!r}.")
        first_arm = space.arm_index(eps0, steps0)

    spec = _Spec(space=space, first_arm=first_arm, capacity=int(capacity), kernel=gp.grid_kernel(space, lengthscale),
                 noise_variance=noise_variance, alpha=alpha, delta=delta, schedule=schedule, k=k, decay=decay,
                 freeze_round=NEVER if freeze_after is None else int(freeze_after), num_eps=space.shape[0],
                 num_l=space.shape[1], design=_design_arms(space, first_arm, int(initial_design)))
    return Tuner(init=partial(_tuner_init, spec), update=partial(_tuner_update, spec), arm=partial(_tuner_arm, spec),
                 surrogate=partial(_tuner_surrogate, spec), space=space, settle=partial(_tuner_settle, spec),
                 record=partial(_tuner_record, spec), complete=partial(_tuner_complete, spec),
                 prefill=partial(_tuner_prefill, spec))


class _Spec(NamedTuple):
    """What :func:`gp_ucb` resolved (static): the tuner's functions below take it first."""

    space: SearchSpace
    first_arm: int
    capacity: int
    kernel: Any
    noise_variance: float
    alpha: float
    delta: float
    schedule: str
    k: int
    decay: float
    freeze_round: int
    num_eps: int
    num_l: int
    design: tuple = ()


def _design_arms(space: SearchSpace, first_arm: int, count: int) -> tuple:
    """``count`` arms at the first arm's step size, their ``L`` columns evenly spread (centred in ``count``
    equal parts of the columns): :func:`gp_ucb`'s ``initial_design``."""
    num_l = space.shape[1]
    row = first_arm // num_l
    return tuple(row * num_l + int(round((j + 0.5) / count * (num_l - 1))) for j in range(count))


NEVER = np.iinfo(np.int32).max  # a round that never comes: no freeze; an eviction key that never wins


def _tuner_init(spec: _Spec, xp=np, dtype=None) -> TunerState:
    dtype = xp.asarray(0.0).dtype if dtype is None else dtype
    return TunerState(
        round=xp.asarray(0, dtype=xp.int32),
        arm=xp.asarray(spec.first_arm, dtype=xp.int32),
        buffer=gp.empty_buffer(spec.capacity, xp, dtype),
        grid_variance=xp.ones((spec.num_eps, spec.num_l), dtype=dtype),
        best_reward=xp.asarray(-np.inf, dtype=dtype),
        worst_reward=xp.asarray(np.inf, dtype=dtype),
        scale=xp.asarray(1.0, dtype=dtype),
        freeze_round=xp.asarray(spec.freeze_round, dtype=xp.int32),
        pending_arm=xp.asarray(-1, dtype=xp.int32),
        pending_weight=xp.asarray(0.0, dtype=dtype),
    )

def _tuner_settled_variance(spec: _Spec, buffer, variance, arm, weight, xp, dtype):
    """``variance`` after the rank-one step of weight ``weight`` at ``arm``, data the buffer already pools.

    The step needs the posterior before that data, so the slot's count is reduced by ``weight``
    (an arm first seen in this stretch drops out: rounding may leave a sliver of its count).
    """
    in_slot = (buffer.arm == arm) & (buffer.count > 0)
    earlier = buffer.count - xp.where(in_slot, weight, xp.zeros_like(weight))
    earlier = xp.where(in_slot & (earlier <= 1e-6 * buffer.count), xp.zeros_like(earlier), earlier)
    cov, var = gp.posterior_covariance_column(buffer._replace(count=earlier), spec.kernel, spec.noise_variance,
                                              arm, xp, dtype)
    tiny = xp.asarray(np.finfo(dtype).tiny, dtype=dtype)
    return xp.clip(variance - cov * cov / (var + spec.noise_variance / xp.maximum(weight, tiny)), 0.0, 1.0)

def _tuner_settle(spec: _Spec, state: TunerState) -> TunerState:
    """The same state with the pending weight taken into ``grid_variance`` (nothing pending: unchanged)."""
    xp = _namespace(state.grid_variance)
    dtype = state.grid_variance.dtype
    if xp.__name__.split(".")[0] == "numpy":
        if not float(state.pending_weight) > 0:
            return state
        variance = _tuner_settled_variance(spec, gp.compact(state.buffer), state.grid_variance, state.pending_arm,
                                    state.pending_weight, np, dtype)
    else:
        has_pending = state.pending_weight > 0
        variance = xp.where(has_pending, _tuner_settled_variance(spec, state.buffer, state.grid_variance, state.pending_arm,
                                                          state.pending_weight, xp, dtype),
                            state.grid_variance)
    return state._replace(grid_variance=variance, pending_arm=xp.full_like(state.pending_arm, -1),
                          pending_weight=xp.zeros_like(state.pending_weight))

def _tuner_update(spec: _Spec, state: TunerState, reward, uniform, weight=1.0, *, lazy: bool = False, cond=None):
    """Score the current arm with ``reward`` and pick the next arm.

    The reward is pooled into the buffer at once; the grid variance takes
    the rewards gathered since the last acquisition in one rank-one step
    when the next acquisition happens (``pending_weight``), which is exact.
    A round that does not adapt therefore costs no solve.

    ``lazy=True`` (eager NumPy only; ignored by other array namespaces)
    also skips, with Python branches, the work whose result would be
    discarded: the eviction downdate when nothing is evicted and the
    acquisition when the arm does not move (``uniform >= p_i`` or frozen;
    then ``info.proposed_arm`` is -1), and solves over the occupied slots
    instead of the whole spec.capacity.  The new state is the same up to
    rounding.

    ``cond`` (a ``jax.lax.cond``-like ``cond(pred, true_fn, false_fn,
    operand)``) gives traced code the same skips: the settling of an arm
    moved from outside, the eviction downdate, and the acquisition with its
    settling (``info.proposed_arm`` -1 when skipped); the new state is
    identical.  The core takes it as an argument so that
    it NEVER imports a framework.
    """
    xp = _namespace(state.grid_variance)
    if lazy and xp.__name__.split(".")[0] == "numpy":
        return _tuner_update_eager(spec, state, reward, uniform, weight)
    recorded, work = _tuner_record(spec, state, reward, uniform, weight)
    new_state, proposed = _tuner_complete(spec, recorded, work, cond=cond)
    return new_state, _tuner_info(spec, recorded, work, proposed, new_state.arm)

def _tuner_record(spec: _Spec, state: TunerState, reward, uniform, weight=1.0):
    """The first half of :func:`update`, without linear algebra: ``(state, work)``.

    The reward is pooled into the buffer and the round counted; whether the
    arm moves is decided (``work.is_adapting``) but not carried out.  When
    ``work.needs_solve`` is false, ``state`` is already what ``update``
    returns; otherwise :func:`complete` finishes it.  Traced code can so run
    this half inside a loop that XLA compiles into one spec.kernel and keep the
    solves, rarely needed, outside.
    """
    xp = _namespace(state.grid_variance)
    dtype = state.grid_variance.dtype
    reward = xp.asarray(reward, dtype=dtype)
    weight = xp.asarray(weight, dtype=dtype)
    buffer = state.buffer
    i = state.round + 1

    # A non-finite reward counts as the worst finite reward so far (0 if none).
    is_finite = xp.isfinite(reward)
    any_finite = xp.isfinite(state.worst_reward)
    fallback = xp.where(any_finite, state.worst_reward, xp.zeros_like(reward))
    clean = xp.where(is_finite, reward, fallback)
    is_best = is_finite & (clean > state.best_reward)
    best = xp.where(is_best, clean, state.best_reward)
    worst = xp.where(is_finite & (clean < state.worst_reward), clean, state.worst_reward)
    magnitude = xp.maximum(xp.abs(best), xp.asarray(np.finfo(np.float32).tiny, dtype=dtype))
    scale = xp.where(is_best, spec.alpha / magnitude, state.scale)

    # The arm was moved from outside (an adapter's exploit step) with rewards still pending: they are
    # settled at their own arm first (``complete``), so that pending rewards always belong to ``state.arm``.
    moved = (state.pending_weight > 0) & (state.pending_arm != state.arm)
    pending_weight = xp.where(moved, xp.zeros_like(state.pending_weight), state.pending_weight)

    # Slot for this arm: its own, else a free one, else evict.
    slots = xp.arange(spec.capacity, dtype=xp.int32)
    is_match = buffer.arm == state.arm
    is_free = buffer.arm < 0
    has_match = xp.any(is_match)
    has_free = xp.any(is_free)
    fewest = buffer.count == xp.min(buffer.count)
    eviction_key = xp.where(fewest, buffer.last_round, xp.full_like(buffer.last_round, NEVER))
    slot = xp.where(
        has_match,
        xp.argmax(is_match),
        xp.where(has_free, xp.argmax(is_free), xp.argmin(eviction_key)),
    ).astype(xp.int32)
    is_evicting = ~has_match & ~has_free
    in_slot = slots == slot
    kept = xp.where(is_evicting & in_slot, xp.zeros_like(buffer.count), buffer.count)
    mean_kept = xp.where(is_evicting & in_slot, xp.zeros_like(buffer.mean_reward), buffer.mean_reward)

    # Pool the reward into its slot; the variance learns it at the next acquisition (see ``pending_weight``).
    total = kept + weight
    new_buffer = gp.ArmBuffer(
        arm=xp.where(in_slot, state.arm, buffer.arm),
        count=xp.where(in_slot, total, kept),
        mean_reward=xp.where(in_slot, mean_kept + (clean - mean_kept) * weight / total, mean_kept),
        last_round=xp.where(in_slot, i, buffer.last_round),
    )
    pending_weight = pending_weight + weight

    # Annealed GP-UCB step: decided here, carried out by ``complete``.
    p = adapt_probability(i, schedule=spec.schedule, k=spec.k, decay=spec.decay, xp=xp)
    p = xp.asarray(p, dtype=dtype)
    beta = xp.asarray(ucb_beta(i, delta=spec.delta, xp=xp), dtype=dtype)
    is_adapting = (xp.asarray(uniform, dtype=dtype) < p) & (i < state.freeze_round)

    recorded = TunerState(
        round=i.astype(xp.int32),
        arm=state.arm,
        buffer=new_buffer,
        grid_variance=state.grid_variance,
        best_reward=best,
        worst_reward=worst,
        scale=scale,
        freeze_round=state.freeze_round,
        pending_arm=xp.asarray(state.arm, dtype=xp.int32),
        pending_weight=pending_weight,
    )
    work = TunerWork(
        needs_solve=moved | is_evicting | is_adapting, is_moved=moved, is_evicting=is_evicting,
        is_adapting=is_adapting, previous_buffer=buffer, previous_pending_arm=state.pending_arm,
        previous_pending_weight=state.pending_weight, slot=slot, reward=reward, clean_reward=clean,
        is_finite=is_finite, adapt_probability=p, beta=beta,
    )
    return recorded, work

def _tuner_complete(spec: _Spec, state: TunerState, work: TunerWork, *, cond=None):
    """The second half of :func:`update`: ``(state, proposed_arm)`` from :func:`record`'s output.

    Settles rewards left pending at an arm moved from outside, removes an
    evicted arm from the variance, and picks the next arm when adapting
    (``proposed_arm`` -1 when it does not).  ``cond`` as in :func:`update`.
    """
    xp = _namespace(state.grid_variance)
    dtype = state.grid_variance.dtype
    before = state._replace(buffer=work.previous_buffer, pending_arm=work.previous_pending_arm,
                            pending_weight=work.previous_pending_weight)
    if cond is None:
        variance = xp.where(work.is_moved, _tuner_settle(spec, before).grid_variance, state.grid_variance)
    else:
        variance = cond(work.is_moved, lambda s: _tuner_settle(spec, s).grid_variance, lambda s: s.grid_variance, before)

    # Forget the evicted arm exactly: v += c^2 / (noise / count - v(x)).  Nothing is pending then:
    # an arm new to a full buffer has no rewards yet, and moved arms were settled above.
    old_buffer, slot = work.previous_buffer, work.slot

    def forget(variance):
        cov_old, var_old = gp.posterior_covariance_column(
            old_buffer, spec.kernel, spec.noise_variance, old_buffer.arm[slot], xp, dtype)
        old_noise = spec.noise_variance / xp.maximum(old_buffer.count[slot], xp.asarray(1e-30, dtype=dtype))
        tiny = xp.asarray(np.finfo(dtype).tiny, dtype=dtype)
        downdate = cov_old * cov_old / xp.maximum(old_noise - var_old, tiny)
        return variance + xp.where(work.is_evicting, downdate, xp.zeros_like(downdate))

    if cond is None:
        variance = forget(variance)
    else:
        variance = cond(work.is_evicting, forget, lambda v: v, variance)

    buffer, pending_weight, is_adapting = state.buffer, state.pending_weight, work.is_adapting

    def propose(operand):
        variance = _tuner_settled_variance(spec, buffer, operand, state.arm, pending_weight, xp, dtype)
        acquisition = _tuner_acquisition(spec, buffer, variance, state.scale, work.adapt_probability, work.beta, xp, dtype,
                                         state.round)
        return variance, xp.argmax(xp.reshape(acquisition, (-1,))).astype(xp.int32)

    if cond is None:
        settled, proposed = propose(variance)
        variance = xp.where(is_adapting, settled, variance)
    else:
        variance, proposed = cond(is_adapting, propose, lambda v: (v, xp.asarray(-1, dtype=xp.int32)), variance)
    new_state = state._replace(
        arm=xp.where(is_adapting, proposed, state.arm).astype(xp.int32),
        grid_variance=variance,
        pending_arm=xp.where(is_adapting, xp.asarray(-1, dtype=xp.int32), state.arm).astype(xp.int32),
        pending_weight=xp.where(is_adapting, xp.zeros_like(pending_weight), pending_weight),
    )
    return new_state, proposed

def _tuner_info(spec: _Spec, recorded: TunerState, work: TunerWork, proposed, next_arm) -> TunerInfo:
    """The :class:`TunerInfo` of an update from its two halves."""
    xp = _namespace(recorded.grid_variance)
    return TunerInfo(
        round=recorded.round,
        reward=work.reward,
        clean_reward=work.clean_reward,
        is_finite=work.is_finite,
        arm=recorded.arm,
        adapt_probability=work.adapt_probability,
        beta=work.beta,
        is_adapting=work.is_adapting,
        proposed_arm=proposed,
        next_arm=next_arm,
        arm_changed=next_arm != recorded.arm,
        num_arms=xp.sum(recorded.buffer.count > 0).astype(xp.int32),
        is_evicting=work.is_evicting,
    )

def _tuner_update_eager(spec: _Spec, state: TunerState, reward, uniform, weight):
    """``_tuner_update(spec, ..., lazy=True)`` under NumPy: the same steps with Python scalars and branches.

    Skips the settling and the eviction downdate when there is nothing to
    settle or evict, and the acquisition when the arm stays; solves over the
    occupied slots only.  Scalars stay Python numbers (float64 arithmetic is
    the same; other dtypes round through ``dtype.type``): an eager sampler
    calls this between trajectories that evict NumPy's code from the CPU
    caches, where every NumPy scalar operation costs a few microseconds.
    ``tests/core`` check it against the array-only path.
    """
    dtype = state.grid_variance.dtype
    real = float if dtype == np.float64 else dtype.type
    i = int(state.round) + 1
    arm = int(state.arm)
    reward, weight = real(reward), real(weight)

    is_finite = math.isfinite(reward)
    worst_before, best_before = real(state.worst_reward), real(state.best_reward)
    clean = reward if is_finite else (worst_before if math.isfinite(worst_before) else real(0.0))
    is_best = is_finite and clean > best_before
    best = clean if is_best else best_before
    worst = clean if is_finite and clean < worst_before else worst_before
    scale = real(spec.alpha / max(abs(best), real(_FLOAT32_TINY))) if is_best else state.scale

    if float(state.pending_weight) > 0 and int(state.pending_arm) != arm:  # moved from outside
        state = _tuner_settle(spec, state)
    buffer = state.buffer
    slot_arms = buffer.arm.tolist()
    is_evicting = False
    if arm in slot_arms:
        slot = slot_arms.index(arm)
    elif -1 in slot_arms:
        slot = slot_arms.index(-1)
    else:
        is_evicting = True
        key = np.where(buffer.count == buffer.count.min(), buffer.last_round, NEVER)
        slot = int(np.argmin(key))

    variance = state.grid_variance
    arms, counts, means, last = (field.copy() for field in buffer)  # copies: states stay immutable
    if is_evicting:  # forget the evicted arm exactly: v += c^2 / (noise / count - v(x))
        cov_old, var_old = gp.posterior_covariance_column(gp.compact(buffer), spec.kernel, spec.noise_variance,
                                                          arms[slot], np, dtype)
        old_noise = spec.noise_variance / max(counts[slot], real(1e-30))
        variance = variance + cov_old * cov_old / max(old_noise - var_old, np.finfo(dtype).tiny)
        counts[slot], means[slot] = 0.0, 0.0
    count, mean = real(counts[slot]), real(means[slot])
    total = count + weight
    means[slot] = mean + (clean - mean) * weight / total
    arms[slot], counts[slot], last[slot] = arm, total, i
    buffer = gp.ArmBuffer(arms, counts, means, last)
    pending_weight = real(state.pending_weight) + weight

    p = real(adapt_probability(i, schedule=spec.schedule, k=spec.k, decay=spec.decay, xp=math))
    beta = real(ucb_beta(i, delta=spec.delta, xp=math))
    is_adapting = real(uniform) < p and i < int(state.freeze_round)
    proposed = -1
    if is_adapting:
        variance = _tuner_settled_variance(spec, gp.compact(buffer), variance, arm, pending_weight, np, dtype)
        pending_weight = real(0.0)
        acquisition = _tuner_acquisition(spec, gp.compact(buffer), variance, scale, p, beta, np, dtype, i)
        proposed = int(np.argmax(acquisition))
    next_arm = proposed if is_adapting else arm

    new_state = TunerState(
        round=np.int32(i), arm=np.asarray(next_arm, dtype=np.int32), buffer=buffer, grid_variance=variance,
        best_reward=np.asarray(best, dtype), worst_reward=np.asarray(worst, dtype),
        scale=np.asarray(scale, dtype), freeze_round=state.freeze_round,
        pending_arm=np.asarray(-1 if is_adapting else arm, dtype=np.int32),
        pending_weight=np.asarray(pending_weight, dtype),
    )
    info = TunerInfo(
        round=np.int32(i), reward=np.asarray(reward, dtype), clean_reward=np.asarray(clean, dtype),
        is_finite=np.bool_(is_finite), arm=state.arm, adapt_probability=np.asarray(p, dtype),
        beta=np.asarray(beta, dtype), is_adapting=np.bool_(is_adapting),
        proposed_arm=np.int32(proposed), next_arm=np.asarray(next_arm, dtype=np.int32),
        arm_changed=np.bool_(next_arm != arm), num_arms=np.int32((counts > 0).sum()),
        is_evicting=np.bool_(is_evicting),
    )
    return new_state, info

def _tuner_acquisition(spec: _Spec, buffer, variance, scale, p, beta, xp, dtype, round_index):
    """The UCB over the grid after round ``round_index``; in the initial design's rounds, its next arm on top
    (unless visited: the buffer holds it)."""
    mean = gp.posterior_mean(buffer, spec.kernel, spec.noise_variance, xp, dtype)
    acquisition = scale * mean + p * xp.sqrt(beta) * xp.sqrt(variance)
    if not spec.design:
        return acquisition
    design = xp.asarray(spec.design, dtype=xp.int32)
    target = design[xp.clip(xp.asarray(round_index, dtype=xp.int32) - 1, 0, len(spec.design) - 1)]
    visited = xp.any((buffer.arm == target) & (buffer.count > 0))
    on_top = (xp.asarray(round_index) <= len(spec.design)) & ~visited
    flat = xp.reshape(acquisition, (-1,))
    top = xp.max(flat) + xp.asarray(1.0, dtype=flat.dtype)
    flat = xp.where(on_top & (xp.arange(flat.shape[0]) == target), top, flat)
    return xp.reshape(flat, acquisition.shape)

def _tuner_arm(spec: _Spec, state: TunerState):
    """``(step_size, num_steps)`` of the current arm, as arrays."""
    xp = _namespace(state.grid_variance)
    eps = xp.asarray(spec.space.step_sizes, dtype=state.grid_variance.dtype)
    steps = xp.asarray(spec.space.num_steps, dtype=xp.int32)
    return eps[state.arm // spec.num_l], steps[state.arm % spec.num_l]

def _tuner_surrogate(spec: _Spec, state: TunerState) -> Surrogate:
    """GP mean and sd (reward units) and the acquisition on the grid (pending rewards settled)."""
    state = _tuner_settle(spec, state)
    xp = _namespace(state.grid_variance)
    dtype = state.grid_variance.dtype
    mean = gp.posterior_mean(state.buffer, spec.kernel, spec.noise_variance, xp, dtype)
    sd = xp.sqrt(state.grid_variance) / state.scale
    i = xp.maximum(state.round, 1)
    p = xp.asarray(adapt_probability(i, schedule=spec.schedule, k=spec.k, decay=spec.decay, xp=xp), dtype=dtype)
    beta = xp.asarray(ucb_beta(i, delta=spec.delta, xp=xp), dtype=dtype)
    acquisition = state.scale * mean + p * xp.sqrt(beta) * xp.sqrt(state.grid_variance)
    return Surrogate(spec.space.step_sizes, spec.space.num_steps, mean, sd, acquisition)


def _content_key(value):
    """A hashable key of ``value``'s contents (nested tuples, NumPy arrays and scalars)."""
    if isinstance(value, tuple):
        return (type(value).__name__,) + tuple(_content_key(v) for v in value)
    if isinstance(value, np.ndarray):
        return value.dtype.str, value.shape, value.tobytes()
    return value


#: The last few prefilled states by their inputs' contents: refits from one snapshot (a loop of folds, a
#: daily refit in one session) enter the same evidence, one rank-one GP step per arm, in about 35 ms.
_PREFILLED: dict = {}
_PREFILLED_MAX = 8


def _tuner_prefill(spec: _Spec, arms, rewards, weights, dtype=None, start_arm=None) -> TunerState:
    """A NumPy initial state whose GP already holds ``rewards`` at flat grid indices ``arms`` with ``weights``.

    For a warm start: the evidence of an earlier run, entered with the weights the caller chose (less than
    the rounds it took, so that new rewards soon outweigh it); the ``capacity`` heaviest are kept.  The
    round counter and the annealing start afresh, at ``start_arm`` (default: :func:`init`'s first arm);
    the best reward sets the scale as it did in that run.  The state's arrays are read-only (they may be
    shared with an earlier call's).
    """
    key = _content_key((spec, np.asarray(arms), np.asarray(rewards, float), np.asarray(weights, float),
                        None if dtype is None else np.dtype(dtype).str, start_arm))
    if key not in _PREFILLED:
        if len(_PREFILLED) >= _PREFILLED_MAX:
            _PREFILLED.pop(next(iter(_PREFILLED)))
        state = _prefilled(spec, arms, rewards, weights, dtype, start_arm)
        for array in state:
            for leaf in (array if isinstance(array, tuple) else (array,)):
                if isinstance(leaf, np.ndarray):
                    leaf.setflags(write=False)
        _PREFILLED[key] = state
    return _PREFILLED[key]


def _prefilled(spec: _Spec, arms, rewards, weights, dtype, start_arm) -> TunerState:
    state = _tuner_init(spec, np, dtype)
    order = np.argsort(-np.asarray(weights, dtype=float), kind="stable")[:spec.capacity]
    for arm_index, reward, weight in zip(np.asarray(arms)[order].tolist(), np.asarray(rewards)[order].tolist(),
                                         np.asarray(weights)[order].tolist()):
        if not (weight > 0 and math.isfinite(reward)):
            continue
        state, _ = _tuner_record(spec, _tuner_settle(spec, state)._replace(arm=np.asarray(arm_index, np.int32)), reward, 1.0, weight)
    state = _tuner_settle(spec, state)
    buffer = state.buffer._replace(last_round=np.zeros_like(state.buffer.last_round))
    start = spec.first_arm if start_arm is None else int(start_arm)
    return state._replace(round=np.asarray(0, np.int32), arm=np.asarray(start, np.int32), buffer=buffer)

