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

from ahmc.core.space import min_num_steps

__all__ = ["ChainKernel", "build_chain_kernel", "inverse_cholesky", "current_energy", "carried_metric", "TrajectoryInfo",
           "MAX_STEP_BINS", "step_bin", "step_bin_widths", "trajectory_proposal"]


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


class ChainKernel(NamedTuple):
    """``step``: every chain's transition (:func:`build_chain_kernel`); ``base``: BlackJAX's one-chain HMC kernel
    (or the user's), ``(rng_key, HMCState, logdensity_fn, step_size, inverse_mass_matrix, num_steps)``."""

    step: Callable
    base: Callable


def build_chain_kernel(logdensity_fn: Callable, *, kernel: Callable | None, integrator: Callable,
                       divergence_threshold: float, min_steps_fraction: float, shared_num_steps: bool,
                       sequential_chains: bool, by_trajectory: bool) -> "ChainKernel":
    """The chains' transition ``(rng_key, state, step_size, max_steps, common_max, chain_data) -> (new, info, num)``,
    and the one-chain kernel it applies (``base``, for the initial step-size search).

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
    """
    hmc_kernel = hmc.build_kernel(integrator, divergence_threshold) if kernel is None else kernel

    def target(*data):
        """The log density one chain targets (its own data, if any)."""
        return logdensity_fn if not data else (lambda z: logdensity_fn(z, data[0]))

    def count_from(u, max_c):  # L_t = L_min + floor(u (L - L_min + 1))
        lowest = min_num_steps(max_c, min_steps_fraction, jnp)
        span = max_c - lowest + 1
        return jnp.clip(jnp.floor(u * span).astype(jnp.int32) + lowest, lowest, max_c)

    def transitions(rng_key, state, step_size, max_steps, common_max, chain_data=()):
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
        else:  # placeholders for the unused arguments
            sums = counts = jnp.zeros((num_chains,), jnp.int32)
        # A dense matrix goes in with its momentum factor (no factorisation per transition);
        # a user's kernel (RMHMC) gets the matrix as before.
        metric = (carried_metric(state.inverse_mass_matrix, state.whitening) if dense and kernel is None
                  else state.inverse_mass_matrix)

        def one_chain(key, position, logdensity, grad, eps_c, max_c, sums_c, counts_c, *data):
            key_l, key_k = jax.random.split(key)
            if common_num is not None:
                num = common_num
            elif shared_num_steps:
                num = count_from(shared_u, max_c)
            else:
                num = jax.random.randint(key_l, (), min_num_steps(max_c, min_steps_fraction, jnp), max_c + 1)
            if by_trajectory:
                arm_c = max_c if common_max is None else common_max
                lowest = min_num_steps(arm_c, min_steps_fraction, jnp)
                kernel_c = hmc.build_kernel(integrator, divergence_threshold,
                                            trajectory_proposal(whiten, sums_c, counts_c, arm_c, lowest))
            else:
                kernel_c = hmc_kernel
            new, info = kernel_c(key_k, hmc.HMCState(position, logdensity, grad), target(*data), eps_c, metric, num)
            if kernel is None:  # BlackJAX reports the proposal's H; NumPyro and Stan the chain's state's
                info = info._replace(energy=current_energy(info, position, logdensity, metric))
            return new, info, num

        keys = jax.random.split(rng_key, num_chains)
        chain_args = (keys, state.position, state.logdensity, state.logdensity_grad, step_size, max_steps, sums,
                      counts, *chain_data)
        if sequential_chains:
            return jax.lax.map(lambda args: one_chain(*args), chain_args)
        return jax.vmap(one_chain)(*chain_args)

    return ChainKernel(transitions, hmc_kernel)
