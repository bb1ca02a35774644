"""The engine's GP-UCB rounds: the arm in the search box, a round's sums, its reward and the tuner's update.

Every iteration adds the chains' whitened squared jumps to the round's running sums
(:func:`ahmc.core.objectives.round_update`; with ``jump_estimate="trajectory"`` also every
leapfrog step's, :func:`trajectory_jump_estimate`).  At a round's end the reward (the objective
of the round's sums, or a ``round_end_fn`` hook's value from the round's draws) updates the core
tuner: once, with the chain-mean reward and weight ``C`` (pooled, its solves in NumPy on the host:
:func:`tuner_solves`), or per chain.  :func:`build_rounds`
returns these as functions of the engine's state; the engine decides when a round ends.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ahmc.core import RoundStats
from ahmc.core.objectives import NONFINITE_REWARD_MESSAGE, round_init, round_update
from ahmc.core.space import grid_num_steps, min_num_steps

from ._jax_kernel import step_bin_widths
from ._jax_types import EngineState
from ._jax_warmup import warn_from_compiled

__all__ = ["Rounds", "advance_round", "build_rounds", "TrajectoryRoundStats", "trajectory_jump_estimate"]


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

def _warn_nonfinite_reward(flag):
    jax.debug.callback(_warn_nonfinite_reward_host, flag)


def _warn_nonfinite_reward_host(flag=True):
    if not np.any(flag):
        return
    warn_from_compiled(NONFINITE_REWARD_MESSAGE)


class Rounds(NamedTuple):
    """The GP-UCB rounds of the engine (:func:`build_rounds`); every function takes and returns arrays.

    arm(tuner_state, box) -> (step_size, L)        the tuner's current arm in the (traced) box
    chain_arms(tuner_state, box, C) -> ((C,), (C,)) every chain's arm (one tuner, or one per chain)
    fresh(C, dtype)                                 empty round sums, one per chain
    add(stats, old, new, num, info, imm, whitening, center)  the iteration's jumps added
    close(operand, arm_l, key_tuner, ...)           a round's end: reward, tuner update, fresh sums
    finish(state, rng_key)                          the round's end after ``round_end="never"``
    segmented(inner, state, blocks)                 whole rounds of a pooled tuner after warm-up
    length(tuner_state, box, key)                   iterations of a super-transition round
    """

    arm: Callable
    chain_arms: Callable
    fresh: Callable
    add: Callable
    close: Callable
    finish: Callable
    segmented: Callable
    length: Callable


def _flat(positions):
    return jax.vmap(lambda p: ravel_pytree(p)[0])(positions)


def _build_arms(space, *, pooled: bool, log_grid: bool, log_num_steps: bool, min_steps_fraction: float,
                super_transitions):
    """``(arm, chain_arms, length)`` of :class:`Rounds` for the tuner's grid ``space`` (``log_num_steps``: the
    ``L`` columns evenly spaced in ``log L``, :func:`ahmc.core.space.grid_num_steps`)."""
    unit_eps, unit_l, num_l_grid = jnp.asarray(space.step_size_unit), jnp.asarray(space.num_steps_unit), space.shape[1]

    def arm(tuner_state, box):
        u_eps = unit_eps[tuner_state.arm // num_l_grid].astype(box.step_size.dtype)
        u_l = unit_l[tuner_state.arm % num_l_grid]
        lo, hi = box.step_size[0], box.step_size[1]
        if log_grid:
            eps = jnp.exp(jnp.log(lo) + u_eps * (jnp.log(hi) - jnp.log(lo)))
        else:
            eps = lo + u_eps * (hi - lo)
        l_lo, l_hi = box.num_steps[0], box.num_steps[1]
        return eps, grid_num_steps(u_l.astype(eps.dtype), l_lo, l_hi, log=log_num_steps, xp=jnp)

    def chain_arms(tuner_state, box, num_chains):
        if pooled:
            eps, steps = arm(tuner_state, box)
            return jnp.broadcast_to(eps, (num_chains,)), jnp.broadcast_to(steps, (num_chains,))
        return jax.vmap(arm, in_axes=(0, None))(tuner_state, box)

    def length(tuner_state, box, key):
        """Iterations of a round with leapfrog budget B: B / E[L_t], stochastically rounded."""
        _, num_steps = arm(tuner_state, box)
        mean_steps = 0.5 * (min_num_steps(num_steps, min_steps_fraction, jnp) + num_steps)
        ratio = super_transitions / mean_steps
        whole = jnp.floor(ratio)
        up = jax.random.uniform(key, (), ratio.dtype) < ratio - whole
        return jnp.clip(whole + up, 1, super_transitions).astype(jnp.int32)

    return arm, chain_arms, length


def _build_sums(*, by_trajectory: bool, num_step_values: int, min_steps_fraction: float, objective_fn: Callable):
    """``(fresh, made_jumps, add, chain_rewards)``: a round's running sums and the reward of each chain's round."""
    def fresh(num_chains, dtype):
        """Empty round sums, one per chain (with per-length sums for ``jump_estimate="trajectory"``)."""
        stats = jax.vmap(lambda _: round_init(jnp, dtype))(jnp.arange(num_chains))
        if not by_trajectory:
            return stats
        shape = (num_chains, num_step_values)
        return TrajectoryRoundStats(stats, jnp.zeros(shape, dtype), jnp.zeros(shape, jnp.int32))

    def made_jumps(stats) -> RoundStats:
        return stats.stats if by_trajectory else stats

    def add(stats, old_positions, flat_new, num_taken, info, imm, whitening, center):
        """The iteration's jumps in the whitened metric (``C^-1 x`` for a dense ``imm = C C^T``)."""
        flat_old = _flat(old_positions)
        if whitening is not None:
            flat_old, flat_new = flat_old @ whitening.T, flat_new @ whitening.T
            stats_center = None if center is None else whitening @ center
            scale = None
        else:
            scale, stats_center = jnp.sqrt(imm), center
        made = jax.vmap(round_update, in_axes=(0, 0, 0, 0, 0, 0, None, None))(
            made_jumps(stats), flat_old, flat_new, num_taken, info.acceptance_rate, info.is_divergent, scale,
            stats_center)
        return TrajectoryRoundStats(made, info.step_sums, info.step_counts) if by_trajectory else made

    def chain_rewards(stats, arm_l, dtype):
        """The objective of each chain's round (its sums and its L)."""
        if by_trajectory:  # the round's mean squared jump from every leapfrog step (made jumps if none)
            lowest = min_num_steps(arm_l, min_steps_fraction, jnp)
            estimate = jax.vmap(trajectory_jump_estimate)(stats.step_sums, stats.step_counts, lowest, arm_l)
            made = stats.stats
            total = jnp.where(jnp.isfinite(estimate), estimate * made.num_iterations, made.sum_squared_jump)
            stats = made._replace(sum_squared_jump=total.astype(made.sum_squared_jump.dtype))
        return jax.vmap(objective_fn)(stats, arm_l).astype(dtype)

    return fresh, made_jumps, add, chain_rewards


def _python_cond(pred, true_fn, false_fn, operand):
    """``jax.lax.cond``'s contract in plain Python, for the tuner's NumPy path on the host."""
    return true_fn(operand) if bool(pred) else false_fn(operand)


class _Packing(NamedTuple):
    """A pytree of fixed shapes as one flat vector per dtype: a host callback costs about 50 us per array
    it passes, so the tuner's twenty-odd arrays go as three."""

    treedef: Any
    leaves: tuple  # ShapeDtypeStructs
    dtypes: tuple

    @classmethod
    def of(cls, shapes):
        leaves, treedef = jax.tree.flatten(shapes)
        return cls(treedef, tuple(leaves), tuple(sorted({np.dtype(leaf.dtype) for leaf in leaves}, key=str)))

    @property
    def vectors(self):
        sizes = [sum(int(np.prod(leaf.shape)) for leaf in self.leaves if leaf.dtype == d) for d in self.dtypes]
        return tuple(jax.ShapeDtypeStruct((size,), d) for size, d in zip(sizes, self.dtypes))

    def pack(self, tree, xp):
        flat = jax.tree.leaves(tree)
        return tuple(xp.concatenate([xp.reshape(xp.asarray(x), (-1,)).astype(d)
                                     for x, leaf in zip(flat, self.leaves) if leaf.dtype == d]) for d in self.dtypes)

    def unpack(self, vectors, xp):
        offsets, flat = dict.fromkeys(self.dtypes, 0), []
        for leaf in self.leaves:
            vector, start, size = vectors[self.dtypes.index(leaf.dtype)], offsets[leaf.dtype], int(np.prod(leaf.shape))
            flat.append(xp.reshape(vector[start:start + size], leaf.shape))
            offsets[leaf.dtype] = start + size
        return jax.tree.unflatten(self.treedef, flat)


def _on_host(fn, shapes):
    """``fn`` on NumPy arrays, called from traced code through ``jax.pure_callback``; its output has
    ``shapes`` (a pytree of ``ShapeDtypeStruct``)."""
    out = _Packing.of(shapes)

    def call(*args):
        given = _Packing.of(jax.eval_shape(lambda *a: a, *args))

        def host(*vectors):  # NumPy arrays: the core then runs its NumPy path
            with np.errstate(all="ignore"):  # quiet as the traced path is (e.g. float32's inf scale x 0)
                return out.pack(fn(*given.unpack([np.asarray(v) for v in vectors], np)), np)

        packed = jax.pure_callback(host, out.vectors, *given.pack(args, jnp), vmap_method="sequential")
        return out.unpack(packed, jnp)

    return call


def _callbacks_see_this_precision() -> bool:
    """Whether a host callback returns this trace's dtypes: JAX casts its outputs under the process-wide
    ``jax_enable_x64``, so inside a ``with jax.enable_x64(...)`` block that differs from it the float64
    results would not match (a run-time error); the solves then stay traced."""
    try:
        from jax._src.config import enable_x64
    except ImportError:  # pragma: no cover - a JAX without it: assume the usual process-wide setting
        return True
    return bool(enable_x64.value) == bool(enable_x64.get_global())


def tuner_solves(tuner, *, on_host: bool):
    """``(complete, best_arm)``: the pooled tuner's linear algebra, ``complete(state, work) -> state`` (the
    second half of its update, :func:`ahmc.core.gp_ucb`'s ``complete``) and ``best_arm(state)`` (the arm of
    highest posterior mean reward), traced or, ``on_host``, in NumPy through ``jax.pure_callback``.

    On the host they are the core tuner's NumPy path, the one the PyMC step runs: the same solves, so the
    same arms (the engine's pinned draws are equal to the bit; tested).  Traced, XLA's CPU compiler turns
    them into about a hundred fused kernels, 0.5-0.7 s of every run's compilation on a 2-core host
    (docs/decisions.md, "The pooled tuner's solves run on the host"); on the host they cost under a
    millisecond in the rounds that move the arm.  Not for a state a user's ``jax.vmap`` batches (the
    one-chain kernel): there a ``lax.cond`` becomes a select and the callback would run every round."""
    def traced_complete(state, work):
        return tuner.complete(state, work, cond=jax.lax.cond)[0]

    def traced_best_arm(state):
        return jnp.argmax(tuner.surrogate(state).mean.reshape(-1)).astype(jnp.int32)

    if not on_host:
        return traced_complete, traced_best_arm

    def complete(state, work):
        if not _callbacks_see_this_precision():
            return traced_complete(state, work)
        shapes = jax.eval_shape(lambda s: s, state)  # complete returns the state it is given, updated
        return _on_host(lambda s, w: tuner.complete(s, w, cond=_python_cond)[0], shapes)(state, work)

    def best_arm(state):
        if not _callbacks_see_this_precision():
            return traced_best_arm(state)
        shape = jax.ShapeDtypeStruct((), jnp.int32)
        return _on_host(lambda s: np.argmax(tuner.surrogate(s).mean), shape)(state)

    return complete, best_arm


def build_rounds(tuner, *, pooled: bool, log_grid: bool, by_trajectory: bool, num_step_values: int,
                 min_steps_fraction: float, objective_fn: Callable, round_end_fn: Callable | None,
                 exploit_after_warmup: bool, num_warmup_rounds: int, super_transitions: int | None,
                 host_solves: bool = False, log_num_steps: bool = False) -> Rounds:
    """The rounds of ``tuner`` (:func:`ahmc.core.gp_ucb`) over a box whose ``eps`` grid is log-spaced if
    ``log_grid``; ``host_solves``: a pooled tuner's linear algebra in NumPy on the host (:func:`tuner_solves`)."""
    arm, chain_arms, length = _build_arms(tuner.space, pooled=pooled, log_grid=log_grid, log_num_steps=log_num_steps,
                                          min_steps_fraction=min_steps_fraction, super_transitions=super_transitions)
    fresh, made_jumps, add, chain_rewards = _build_sums(by_trajectory=by_trajectory, num_step_values=num_step_values,
                                                        min_steps_fraction=min_steps_fraction, objective_fn=objective_fn)
    complete, best_arm = tuner_solves(tuner, on_host=host_solves and pooled)

    def exploit(tuner_state):
        """End of warm-up: move to the arm of highest posterior mean reward."""
        def best(t):
            return t._replace(arm=best_arm(t))
        return best(tuner_state) if pooled else jax.vmap(best)(tuner_state)

    def update_tuner(tuner_state, rewards, key_tuner, dtype, num_chains):
        """The tuner's update with the round's rewards: ``(tuner_state, reward, changed, p)`` per chain."""
        if pooled:  # update's two halves: the solves only when the arm moves or a stored arm is evicted
            reward = jnp.mean(rewards)
            uniform = jax.random.uniform(key_tuner, (), dtype)
            recorded, work = tuner.record(tuner_state, reward, uniform, num_chains * 1.0)
            tuner_state = jax.lax.cond(work.needs_solve, complete, lambda s, w: s, recorded, work)
            changed = jnp.broadcast_to(tuner_state.arm != recorded.arm, (num_chains,))
            return tuner_state, jnp.broadcast_to(reward, (num_chains,)), changed, work.adapt_probability
        uniforms = jax.random.uniform(key_tuner, (num_chains,), dtype)
        # update's two halves: the solves only in rounds where some chain needs them (a chain's
        # own branch under vmap would run them in every round, for every chain)
        recorded, work = jax.vmap(tuner.record)(tuner_state, rewards, uniforms)
        tuner_state = jax.lax.cond(jnp.any(work.needs_solve), lambda operand: jax.vmap(tuner.complete)(*operand)[0],
                                   lambda operand: operand[0], (recorded, work))
        return tuner_state, rewards, tuner_state.arm != recorded.arm, work.adapt_probability[0]

    def close(operand, *, arm_l, key_tuner, round_draws=None, num_draws=None, ends=True):
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
        tuner_state, reward, changed, p = update_tuner(tuner_state, rewards, key_tuner, dtype, num_chains)
        if exploit_after_warmup:
            previous_arm = operand[0].arm
            last_round = tuner_state.round if pooled else tuner_state.round[0]
            frozen = last_round >= (tuner_state.freeze_round if pooled else tuner_state.freeze_round[0])
            tuner_state = jax.lax.cond((last_round == num_warmup_rounds) & ~frozen, exploit, lambda t: t, tuner_state)
            changed = jnp.broadcast_to(tuner_state.arm != previous_arm, (num_chains,))
        return tuner_state, fresh(num_chains, dtype), (reward, changed, p.astype(dtype)), hook_state

    def finish(state, rng_key):
        """End the round after an iteration run with ``round_end="never"`` with key ``rng_key``:
        the state and ``(reward, arm_changed, adapt_probability)`` per chain that ``"always"``
        would have given (fixed-length rounds)."""
        num_chains = state.logdensity.shape[0]
        _, key_tuner = jax.random.split(rng_key)
        arm_l = chain_arms(state.tuner, state.box, num_chains)[1]
        hook = round_end_fn is not None
        operand = (state.tuner, state.round_stats, state.adapt_probability, state.round_end_state)
        tuner_state, stats, (reward, changed, p), hook_state = close(
            operand, arm_l=arm_l, key_tuner=key_tuner, round_draws=state.round_draws if hook else None,
            num_draws=state.round_iteration if hook else None)
        state = state._replace(tuner=tuner_state, round_stats=stats, adapt_probability=p)
        if hook:
            state = state._replace(round_end_state=hook_state, round_iteration=jnp.zeros_like(state.round_iteration))
        return state, (reward, changed, jnp.broadcast_to(p, (num_chains,)))

    def record(state, rng_key):
        """A pooled tuner's round end without linear algebra (fixed-length rounds, no hook): the
        reward recorded, fresh round sums; returns the state and ``(work, rewards per chain)``
        for ``tuner.complete``.  Same keys and values as ``close``."""
        num_chains = state.logdensity.shape[0]
        _, key_tuner = jax.random.split(rng_key)
        arm_l = chain_arms(state.tuner, state.box, num_chains)[1]
        dtype = state.inverse_mass_matrix.dtype
        rewards = chain_rewards(state.round_stats, arm_l, dtype)
        uniform = jax.random.uniform(key_tuner, (), dtype)
        recorded, work = tuner.record(state.tuner, jnp.mean(rewards), uniform, num_chains * 1.0)
        return state._replace(tuner=recorded, round_stats=fresh(num_chains, dtype)), (work, rewards)

    return Rounds(arm, chain_arms, fresh, add, close, finish, partial(segmented_rounds, complete, record), length)


def segmented_rounds(complete, record, inner, state, blocks):
    """Whole rounds of a pooled tuner after warm-up (no hook), keys ``blocks`` (rounds, L):
    ``(state, (positions, info))`` with a leading rounds axis, as one round per scan step gives.

    XLA's CPU backend compiles a loop into a single kernel only when it holds no linear-algebra
    call; otherwise it runs the loop body's operations one by one, at a fixed cost each (a round
    end has some hundred of them: as much as a cheap model's gradients).  So the rounds run in
    segments: an inner loop of whole rounds (transitions, round sums, the reward and the tuner's
    bookkeeping, ``tuner.record``) that stops after the first round whose update needs the
    tuner's solves (a move of the arm, p_i per round, or an eviction); then ``tuner.complete``
    outside it (``complete``, :func:`tuner_solves`).  A non-finite reward warns once, after the run."""
    num_rounds = blocks.shape[0]
    num_chains = state.logdensity.shape[0]
    dtype = state.inverse_mass_matrix.dtype

    def iteration(state, key):
        state, info = inner(key, state)
        return state, (state.position, info)

    def whole_round(state, keys):
        """A round's iterations, then its end: the reward recorded (``tuner.record``)."""
        state, (positions, info) = jax.lax.scan(iteration, state, keys)
        state, (work, rewards) = record(state, keys[-1])
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
        tuner_state = jax.lax.cond(stopped, complete, lambda t, w: t, state.tuner, pending[0])
        changed = jnp.broadcast_to(tuner_state.arm != state.tuner.arm, (num_chains,))
        positions, info = outputs
        info = info._replace(arm_changed=info.arm_changed.at[r - 1, -1].set(changed))
        return state._replace(tuner=tuner_state), r, (positions, info), pending, False, nonfinite

    start = (state, jnp.asarray(0, jnp.int32), outputs, pending, jnp.asarray(False), jnp.asarray(False))
    state, _, outputs, _, _, nonfinite = jax.lax.while_loop(lambda c: c[1] < num_rounds, segment, start)
    jax.lax.cond(nonfinite, _warn_nonfinite_reward, lambda _: None, nonfinite)
    return state, outputs


def advance_round(parts: Any, key_tuner, state, new, stats, warm, arm_l, in_metric_phase, starts_gp, round_end):
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
        whitening=warm.whitening, step_size_search=warm.step_size_search)
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
