"""Chains spread over devices: the mesh, the check, and the one reduction XLA cannot partition.

The engine needs no communication code of its own: positions placed with a ``NamedSharding`` along the
chain axis make XLA partition every per-chain array the same way, and the chain means the pooled tuner
and warm-up use become cross-device reductions with the tuner state replicated.  The exception is a
median over chains (the lost-chain check, the early pooled acceptance): a sort, which XLA can only do
on one device.  :func:`chain_median` gathers that (chains,) vector on purpose, one small all-gather,
instead of letting the partitioner fall back to a full rematerialization of it.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

CHAIN_AXIS = "chains"


def replicated(x):
    """``x`` gathered on every device when the run is traced under a mesh (unchanged without one): for what
    XLA cannot partition, a sort over chains or a host callback's arguments."""
    if jax.sharding.get_abstract_mesh().empty:
        return x
    return jax.tree.map(lambda leaf: jax.lax.with_sharding_constraint(leaf, PartitionSpec()), x)


def chain_median(x):
    """``jnp.median(x)`` over a (chains,) vector, replicated first when the run is traced under a mesh."""
    return jnp.median(replicated(x))


def to_host(x) -> np.ndarray:
    """``np.asarray(x)``, gathering first an array that spans other processes' devices."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def check_chains_divide(num_chains: int, num_devices: int, name: str) -> None:
    if num_chains % num_devices:
        lower = (num_chains // num_devices) * num_devices
        nearest = " or ".join(str(n) for n in sorted({max(lower, num_devices), lower + num_devices}))
        raise ValueError(
            f"{name}: {num_chains} chains do not divide over {num_devices} devices; use a multiple of "
            f"{num_devices} chains (e.g. {nearest}), or fewer devices.")


def shard_chains(positions, devices=None):
    """``positions`` (leading axis: chains) placed one block of chains per device, along a one-axis mesh.

    ``devices`` defaults to ``jax.devices()`` (every device of every process under
    ``jax.distributed.initialize``; then every process passes the same, full ``positions``, e.g. drawn
    from the same seed, and keeps the blocks of its own devices).  Pass the result to :func:`ahmc.adapters.blackjax.run_chains`: the run
    stays sharded, samples and info come back sharded along their chain axis, and the pooled tuner is one
    tuner for all the chains, replicated on every device."""
    devices = list(jax.devices() if devices is None else devices)
    leaves = jax.tree.leaves(positions)
    if not leaves:
        raise ValueError("shard_chains: positions is empty; pass an array or pytree with a leading chain axis.")
    num_chains = int(np.shape(leaves[0])[0])
    check_chains_divide(num_chains, len(devices), "shard_chains")
    sharding = NamedSharding(Mesh(np.array(devices), (CHAIN_AXIS,)), PartitionSpec(CHAIN_AXIS))

    def place(leaf):  # each process places the blocks of its own devices (all of them in one process)
        leaf = np.asarray(leaf)
        return jax.make_array_from_callback(leaf.shape, sharding, lambda index: leaf[index])

    return jax.tree.map(place, positions)


def chain_mesh(positions, name: str):
    """The mesh the positions are sharded over along their chain axis (``None``: not sharded)."""
    shardings = {getattr(leaf, "sharding", None) for leaf in jax.tree.leaves(positions)}
    named = [s for s in shardings if isinstance(s, NamedSharding) and len(s.spec) and s.spec[0] is not None]
    if not named:
        return None
    mesh = named[0].mesh
    devices = int(np.prod([mesh.shape[a] for a in np.atleast_1d(named[0].spec[0])]))
    check_chains_divide(int(np.shape(jax.tree.leaves(positions)[0])[0]), devices, name)
    return mesh


def traced_mesh_context(mesh):
    """The context a step is traced under inside someone else's ``jit`` (NumPyro's sampling loop): the
    abstract mesh of ``mesh``, or nothing for ``None``."""
    return contextlib.nullcontext() if mesh is None else jax.sharding.use_abstract_mesh(mesh.abstract_mesh)


def set_mesh(mesh):
    """``jax.set_mesh(mesh)``, or nothing for ``None`` (unsharded chains)."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def mesh_context(positions, name: str):
    """A context under which a run on these positions is traced: their mesh, or nothing when unsharded."""
    return set_mesh(chain_mesh(positions, name))


def superchain_positions(starts, chains_per_superchain: int):
    """``(superchains * chains_per_superchain, ...)`` positions: each start repeated for its superchain's chains
    (consecutive), the layout nested R-hat expects."""
    return jax.tree.map(lambda leaf: np.repeat(np.asarray(leaf), chains_per_superchain, axis=0), starts)


def nested_rhat(samples, chains_per_superchain: int) -> np.ndarray:
    """ArviZ's nested R-hat (Margossian et al. 2024) of flat ``(chains, draws, d)`` samples whose consecutive
    blocks of ``chains_per_superchain`` chains started at one point: one value per coordinate."""
    try:
        from arviz_stats import rhat_nested
    except ImportError as err:  # pragma: no cover - only without ArviZ
        raise ImportError('nested R-hat needs ArviZ: pip install "arviz>=1.3"') from err
    leaves = [to_host(leaf) for leaf in jax.tree.leaves(samples)]  # a pytree: its leaves' coordinates in order
    draws = np.concatenate([leaf.reshape(leaf.shape[0], leaf.shape[1], -1) for leaf in leaves], axis=-1)
    ids = np.arange(draws.shape[0]) // chains_per_superchain
    return np.asarray(rhat_nested(draws.reshape(draws.shape[0], draws.shape[1], -1), superchain_ids=ids.tolist()))
