"""One HMC transition per chain for the adaptive engine: BlackJAX's kernel, ``L_t`` drawn from the arm's ``L``.

:func:`build_chain_kernel` returns the chains' transition: each chain draws its number of
leapfrog steps uniformly from ``{L_min..L}`` (by default from one ``u`` shared by all chains) and
makes one transition with BlackJAX's ``hmc.build_kernel`` (or a user kernel such as RMHMC's),
``jax.vmap``-ed (or ``jax.lax.map``-ed) over chains.  With ``jump_estimate="trajectory"`` the
proposal also adds every leapfrog step's value to the round's per-length sums
(:func:`trajectory_proposal`).  No leapfrog is written here.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

import blackjax.mcmc.hmc as hmc
import blackjax.mcmc.metrics as metrics
from blackjax.mcmc.proposal import safe_energy_diff, static_binomial_sampling
from blackjax.mcmc.trajectory import hmc_energy
from blackjax.util import generate_gaussian_noise

from ahmc.core.retry import retry_log_acceptance
from ahmc.core.space import min_num_steps

__all__ = ["ChainKernel", "build_chain_kernel", "inverse_cholesky", "current_energy", "carried_metric", "finite_energy",
           "finite_logdensity", "TrajectoryInfo",
           "MAX_STEP_BINS", "step_bin", "step_bin_widths", "trajectory_proposal", "Retry"]


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


def finite_energy(metric) -> metrics.Metric:
    """BlackJAX's metric (or the one ``default_metric`` makes of a matrix) with a kinetic energy that is
    ``+inf`` wherever it is not finite, so that such a proposal is a divergence, never accepted.

    A trajectory thrown far out overflows the momentum's quadratic form (in float32, NumPyro's
    default, from about 1e19), and with a dense or low-rank matrix the overflow can come out as
    ``-inf``; BlackJAX's acceptance test (``safe_energy_diff``) maps only NaN, so such a proposal was
    accepted with probability one and the chain left for a point 1e32 below the mode, where the step
    size then collapsed (one chain of eight schools in float32, 300 warm-up iterations)."""
    base = metrics.default_metric(metric)

    def kinetic_energy(momentum, position=None):
        value = base.kinetic_energy(momentum, position)
        return jnp.where(jnp.isfinite(value), value, jnp.inf)

    return base._replace(kinetic_energy=kinetic_energy)


def finite_logdensity(logdensity_fn: Callable) -> Callable:
    """``logdensity_fn``, ``-inf`` wherever it is not finite: a proposal at ``+inf`` (a density's
    singularity, in floating point) has energy ``-inf``, which BlackJAX's acceptance test would accept
    with probability one, and the chain could never leave it.  With :func:`finite_energy` no
    proposal's energy is ``-inf`` or NaN."""
    def logdensity(*args):
        value = logdensity_fn(*args)
        return jnp.where(jnp.isfinite(value), value, -jnp.inf)

    return logdensity


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
    retried: Any


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


class Retry(NamedTuple):
    """How a divergent trajectory retries (:func:`trajectory_proposal`): the step-size divisor, whether
    retries are on now (a traced bool: off in the metric phase), and the name of the chains' ``vmap``
    axis (``None``: the chains run one at a time)."""

    factor: int
    allowed: Any
    chain_axis: str | None


def trajectory_proposal(whiten: Callable, step_sums, step_counts, max_steps=None, min_steps=1,
                        retry: Retry | None = None) -> Callable:
    """A ``build_proposal`` for :func:`blackjax.mcmc.hmc.build_kernel` that also adds every step's
    value to a round's per-length sums, and retries a divergent trajectory finer.

    The same endpoint proposal as BlackJAX's ``hmc_proposal`` (BlackJAX's integrator, energy and
    ``static_binomial_sampling``), integrated by a loop that at each step ``l >= min_steps`` also
    adds ``a_l J_l`` to the sums and 1 to the counts (returned in :class:`TrajectoryInfo`): what
    :func:`ahmc.core.objectives.step_jumps_estimate` averages.  Entry ``l - 1`` takes step ``l`` when
    ``max_steps`` (the arm's ``L``; ``None``: the vectors' length) fits the vectors, otherwise its
    :func:`step_bin`.  Adding in the loop touches only the steps taken.  ``whiten`` maps a
    flattened position difference to the frame the reward measures jumps in.

    With ``retry`` (:class:`Retry`), a trajectory that diverged retries finer in the same loop
    (:mod:`ahmc.core.retry` says how and why it is exact); the loop runs on only while some chain retries."""

    def build(integrator, kinetic_energy, step_size, num_integration_steps, divergence_threshold):
        energy_of = hmc_energy(kinetic_energy)
        num_bins = step_sums.shape[0]
        arm = num_bins if max_steps is None else max_steps
        n = num_integration_steps

        def generate(rng_key, state):
            start_energy = energy_of(state)
            start = ravel_pytree(state.position)[0]

            def add_step(i, current, sums, counts, failed):
                """Step ``i + 1``'s ``a_l J_l`` into the sums (the first try's steps only)."""
                delta = safe_energy_diff(start_energy, energy_of(current))  # NaN -> -inf
                first_try = i < n
                failed = failed | (first_try & ((-delta > divergence_threshold) | ~jnp.isfinite(delta)))
                accept = jnp.where(failed, 0.0, jnp.exp(jnp.minimum(delta, 0.0)))
                jump = whiten(ravel_pytree(current.position)[0] - start)
                # In place (a dynamic update slice, O(1)): `.at[b].add(mode="drop")` selects the whole
                # vector at every step.  A step beyond the arm's L (only when the caller's L is shorter
                # than the trajectory) adds nothing to the clamped last entry.
                b = step_bin(i, arm, num_bins)
                counted = (b < num_bins) & (i + 1 >= min_steps) & first_try
                value = jnp.where(counted, accept * jnp.sum(jump * jump), 0.0).astype(sums.dtype)
                sums = jax.lax.dynamic_update_index_in_dim(
                    sums, jax.lax.dynamic_index_in_dim(sums, b, keepdims=False) + value, b, 0)
                count = jax.lax.dynamic_index_in_dim(counts, b, keepdims=False) + counted.astype(counts.dtype)
                counts = jax.lax.dynamic_update_index_in_dim(counts, count, b, 0)
                return sums, counts, failed, delta

            if retry is None:
                def one_step(i, carry):
                    current, sums, counts, failed = carry
                    current = integrator(current, step_size)
                    return (current, *add_step(i, current, sums, counts, failed)[:3])

                end, sums, counts, _ = jax.lax.fori_loop(0, n, one_step,
                                                         (state, step_sums, step_counts, jnp.asarray(False)))
                retried = jnp.asarray(False)
            else:
                end, sums, counts, retried, fine, ghost = _retrying_loop(
                    integrator, step_size, n, state, (step_sums, step_counts), add_step, retry, divergence_threshold)
            end = hmc.flip_momentum(end)
            end_energy = energy_of(end)
            delta_energy = safe_energy_diff(start_energy, end_energy)
            is_diverging = -delta_energy > divergence_threshold
            sampled, (do_accept, p_accept, _) = static_binomial_sampling(rng_key, delta_energy, state, end)
            info = TrajectoryInfo(state.momentum, p_accept, do_accept, is_diverging, end_energy, end, n, sums, counts,
                                  retried)
            if retry is None:
                return sampled, info, None
            verdict = _retry_verdict(jax.random.fold_in(rng_key, 1), state, start_energy, fine, energy_of(fine),
                                     energy_of(ghost), p_accept, divergence_threshold)
            sampled = jax.tree.map(lambda a, b: jnp.where(retried, a, b), verdict[0], sampled)
            info = info._replace(
                is_accepted=jnp.where(retried, verdict[1], do_accept),
                is_divergent=jnp.where(retried, verdict[2], is_diverging),
                energy=jnp.where(retried, verdict[3], end_energy),
                num_integration_steps=jnp.where(retried, (retry.factor + 2) * n, n))
            return sampled, info, None

        return generate

    return build


def _tree_where(condition, a, b):
    return jax.tree.map(lambda x, y: jnp.where(condition, x, y), a, b)


def _retrying_loop(integrator, step_size, n, start, sums, add_step, retry: Retry, divergence_threshold):
    """The first try's ``n`` steps and, for a chain whose first try diverged, the retry's ``factor x n``
    steps at ``eps / factor`` from the start, then the ghost's ``n`` at ``eps`` from the retry's end
    (momentum flipped): one loop, so the model's gradient is compiled once.  Its trip count is shared
    by the chains (the step index stays unbatched under ``vmap``: batched, each in-place add to the
    sums would become a scatter); a chain with nothing left to do integrates on, unread.
    Returns ``(first try's end, sums, counts, retried, retry's end (flipped), ghost's end)``."""
    factor = retry.factor
    fine_end = n + factor * n

    def any_chain(flag):
        return flag if retry.chain_axis is None else jax.lax.psum(flag.astype(jnp.int32), retry.chain_axis) > 0

    def cond(carry):
        return carry[0] < carry[-1]

    def body(carry):
        i, current, first_end, fine, sums, counts, failed, retried, total = carry
        current = _tree_where(retried & (i == n), start, current)  # the retry starts over
        turn = retried & (i == fine_end)  # the retry's end: kept, momentum flipped, the ghost goes on
        fine = _tree_where(turn, hmc.flip_momentum(current), fine)
        current = _tree_where(turn, fine, current)
        eps = jnp.where((i >= n) & (i < fine_end), step_size / factor, step_size)
        current = integrator(current, eps)  # past its first try a chain that does not retry is not read
        sums, counts, failed, delta = add_step(i, current, sums, counts, failed)
        last_first = i == n - 1
        first_end = _tree_where(last_first, current, first_end)
        retries = last_first & (-delta > divergence_threshold) & retry.allowed
        total = jnp.where(last_first & any_chain(retries), fine_end + n, total)
        return i + 1, current, first_end, fine, sums, counts, failed, retried | retries, total

    no = jnp.asarray(False)
    carry = (jnp.asarray(0, jnp.asarray(n).dtype), start, start, start, *sums, no, no, jnp.asarray(n))
    _, ghost, first_end, fine, step_sums, step_counts, _, retried, _ = jax.lax.while_loop(cond, body, carry)
    return first_end, step_sums, step_counts, retried, fine, ghost


def _retry_verdict(key, start, start_energy, fine, fine_energy, ghost_energy, first_accept, divergence_threshold):
    """The retry's delayed-rejection verdict (:mod:`ahmc.core.retry`): ``(state, accepted, diverged, energy)``.

    Exact, so a chain in a funnel's neck, where the tuned ``eps`` is unstable and every first try
    diverges, moves with the finer one instead of staying put; a run without divergences makes the
    draws it made without retries."""
    to_ghost = safe_energy_diff(fine_energy, ghost_energy)  # the flips leave the energies as they are
    log_ratio = retry_log_acceptance(start_energy, fine_energy, -to_ghost > divergence_threshold, first_accept,
                                     jnp.exp(jnp.minimum(to_ghost, 0.0)), jnp)
    accepted = jnp.log(jax.random.uniform(key, (), fine_energy.dtype)) < log_ratio
    state = _tree_where(accepted, fine, start)
    diverged = -safe_energy_diff(start_energy, fine_energy) > divergence_threshold
    return state, accepted, diverged, jnp.where(accepted, fine_energy, start_energy)


class ChainKernel(NamedTuple):
    """``step``: every chain's transition (:func:`build_chain_kernel`)."""

    step: Callable


_CHAINS = "chains"  # the name of the chains' vmap axis: a retry's loop runs on while any chain retries


def build_chain_kernel(logdensity_fn: Callable, *, kernel: Callable | None, integrator: Callable,
                       divergence_threshold: float, min_steps_fraction: float, shared_num_steps: bool,
                       sequential_chains: bool, by_trajectory: bool, retry_factor: int | None = None) -> "ChainKernel":
    """The chains' transition ``(rng_key, state, step_size, max_steps, common_max, chain_data) -> (new, info, num,
    retried)``.

    ``state`` holds the chains' ``position``, ``logdensity``, ``logdensity_grad`` (leading chain
    axis), ``inverse_mass_matrix``, ``whitening`` and, with ``by_trajectory``, the round's
    ``round_stats.step_sums`` / ``step_counts``.  ``step_size`` and ``max_steps`` (the arm's
    ``L``) are per chain; ``common_max`` is the one ``L`` of a pooled tuner (``None`` when each
    chain has its own), taken from outside the chains' ``vmap`` so that the leapfrog loop's trip
    count and the per-length bin index stay unbatched (a batched trip count makes ``vmap`` select
    the whole loop state at every step; a batched index turns each in-place add into a scatter).
    ``chain_data``: ``()`` or ``(data,)`` with a leading chain axis.  Returns the new
    ``HMCState`` of every chain, BlackJAX's info (``energy`` the chain's state's, as NumPyro and
    Stan report it; :class:`TrajectoryInfo` with ``by_trajectory``) and the leapfrog steps taken.
    ``retry_factor``: a divergent transition retries finer (:func:`_retry_verdict`; not with a user's
    ``kernel``); ``may_retry`` (a traced bool) turns the retries off for an iteration.
    """
    hmc_kernel = hmc.build_kernel(integrator, divergence_threshold) if kernel is None else kernel
    retries = bool(retry_factor) and kernel is None
    own_proposal = by_trajectory or retries  # the retry lives in trajectory_proposal's loop

    def target(*data):
        """The log density one chain targets (its own data, if any)."""
        return finite_logdensity(logdensity_fn if not data else (lambda z: logdensity_fn(z, data[0])))

    def count_from(u, max_c):  # L_t = L_min + floor(u (L - L_min + 1))
        lowest = min_num_steps(max_c, min_steps_fraction, jnp)
        span = max_c - lowest + 1
        return jnp.clip(jnp.floor(u * span).astype(jnp.int32) + lowest, lowest, max_c)

    def transitions(rng_key, state, step_size, max_steps, common_max, chain_data=(), may_retry=True):
        num_chains = state.logdensity.shape[0]
        dtype = state.inverse_mass_matrix.dtype
        dense = state.inverse_mass_matrix.ndim == 2
        shared_u = jax.random.uniform(jax.random.fold_in(rng_key, 3), (), dtype) if shared_num_steps else None
        common_num = count_from(shared_u, common_max) if shared_num_steps and common_max is not None else None
        if by_trajectory:  # each step's a_l J_l whitened as the reward's jumps
            if dense:
                def whiten(dx):
                    return state.whitening @ dx
            else:
                def whiten(dx):
                    return dx / jnp.sqrt(state.inverse_mass_matrix)
            sums, counts = state.round_stats.step_sums, state.round_stats.step_counts
        elif retries:  # the proposal's sums go unused: one bin
            def whiten(dx):
                return dx
            sums, counts = jnp.zeros((num_chains, 1), dtype), jnp.zeros((num_chains, 1), jnp.int32)
        else:  # placeholders for the unused arguments
            sums = counts = jnp.zeros((num_chains,), jnp.int32)
        # A dense matrix goes in with its momentum factor (no factorisation per transition);
        # a user's kernel (RMHMC) gets the matrix as before.
        metric = (carried_metric(state.inverse_mass_matrix, state.whitening) if dense and kernel is None
                  else state.inverse_mass_matrix)
        if kernel is None:
            metric = finite_energy(metric)

        def one_chain(key, position, logdensity, grad, eps_c, max_c, sums_c, counts_c, *data):
            key_l, key_k = jax.random.split(key)
            if common_num is not None:
                num = common_num
            elif shared_num_steps:
                num = count_from(shared_u, max_c)
            else:
                num = jax.random.randint(key_l, (), min_num_steps(max_c, min_steps_fraction, jnp), max_c + 1)
            if own_proposal:
                arm_c = max_c if common_max is None else common_max
                lowest = min_num_steps(arm_c, min_steps_fraction, jnp)
                retry = Retry(int(retry_factor), may_retry, None if sequential_chains else _CHAINS) if retries else None
                kernel_c = hmc.build_kernel(integrator, divergence_threshold,
                                            trajectory_proposal(whiten, sums_c, counts_c, arm_c, lowest, retry))
            else:
                kernel_c = hmc_kernel
            new, info = kernel_c(key_k, hmc.HMCState(position, logdensity, grad), target(*data), eps_c, metric, num)
            if kernel is None:  # BlackJAX reports the proposal's H; NumPyro and Stan the chain's state's
                info = info._replace(energy=current_energy(info, position, logdensity, metric))
            return new, info, info.num_integration_steps if retries else num

        keys = jax.random.split(rng_key, num_chains)
        chain_args = (keys, state.position, state.logdensity, state.logdensity_grad, step_size, max_steps, sums,
                      counts, *chain_data)
        new, info, num = (jax.lax.map(lambda args: one_chain(*args), chain_args) if sequential_chains
                          else jax.vmap(one_chain, axis_name=_CHAINS)(*chain_args))
        return new, info, num, info.retried if own_proposal else jnp.zeros((num_chains,), bool)

    return ChainKernel(transitions)
