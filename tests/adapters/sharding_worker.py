"""Runs ``run_chains`` unsharded and sharded over simulated CPU devices; the parent test reads the results.

A separate process because the device count is fixed when JAX starts: ``XLA_FLAGS`` asks for 8 CPU devices
before the import.  With ``--process-id`` it is one of two ``jax.distributed`` processes on localhost,
each with one device and half the chains.
"""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--devices", type=int, default=8)
parser.add_argument("--process-id", type=int)
parser.add_argument("--coordinator", default="localhost:12355")
args = parser.parse_args()
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={args.devices}").strip()

import jax  # noqa: E402

if args.process_id is not None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, num_processes=2, process_id=args.process_id)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from ahmc.adapters.blackjax import gpucb_adaptation, run_chains, shard_chains  # noqa: E402

SCALES = np.arange(1.0, 6.0)
NUM_CHAINS, NUM_WARMUP, NUM_SAMPLES = 16, 300, 400


def logdensity(x):
    return -0.5 * jnp.sum((x / SCALES) ** 2)


def run(positions):
    samples, info, state = run_chains(jax.random.key(0), logdensity, positions, NUM_WARMUP, NUM_SAMPLES,
                                      return_state=True)
    # this process's own copy of the replicated tuner state: equal in every process if the tuner is one
    result["tuner"] = [np.asarray(leaf.addressable_data(0)).tolist() for leaf in jax.tree.leaves(state.tuner)]
    specs = [str(getattr(a.sharding, "spec", "unsharded")) for a in (samples, info.step_size)]
    gathered = multihost_utils.process_allgather((samples, info.step_size, info.num_steps), tiled=True)
    return [np.asarray(a).tolist() for a in gathered], specs


def run_numpyro(init_params):
    """The NumPyro kernel, chains vectorized, from sharded initial positions: the sharding of its draws."""
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC

    from ahmc.adapters.numpyro import AdaptiveHMC

    def model():
        numpyro.sample("x", dist.Normal(0.0, jnp.asarray(SCALES)))

    mcmc = MCMC(AdaptiveHMC(model), num_warmup=100, num_samples=100, num_chains=NUM_CHAINS,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), init_params=init_params)
    x = mcmc.get_samples(group_by_chain=True)["x"]
    return [str(x.sharding.spec), str(mcmc.last_state.z["x"].sharding.spec), list(x.shape)]


positions = np.asarray(jax.random.normal(jax.random.key(1), (NUM_CHAINS, SCALES.size)))
result = {}
if args.process_id is None:
    result["one"] = run(jnp.asarray(positions))
    result["two"] = run(shard_chains(positions, jax.devices()[:2]))
    result["all"] = run(shard_chains(positions))
    result["numpyro"] = run_numpyro(shard_chains({"x": positions}))
    (adapted, _), _ = gpucb_adaptation(logdensity).run(jax.random.key(0), shard_chains(positions), 100)
    result["adaptation"] = str(adapted.position.sharding.spec)
    rmhmc_samples, _ = run_chains(jax.random.key(0), logdensity, shard_chains(positions), 100, 100, metric="softabs")
    result["rmhmc"] = [str(rmhmc_samples.sharding.spec), np.asarray(rmhmc_samples).std(axis=(0, 1)).tolist()]
    try:
        shard_chains(positions[:6])
    except ValueError as err:
        result["error"] = str(err)
else:  # each process holds its half of the chains; shard_chains spans both processes' devices
    result["all"] = run(shard_chains(positions))
with open(args.out if jax.process_index() == 0 else f"{args.out}.{jax.process_index()}", "w") as f:
    json.dump(result, f)
sys.exit(0)
