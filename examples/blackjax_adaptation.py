"""AHMC with BlackJAX: GP-UCB warm-up, then a plain BlackJAX sampling loop.

Bayesian logistic regression (200 x 5 synthetic data, N(0, 100) prior), 4 chains.
"""

import jax
import jax.numpy as jnp
import numpy as np

import blackjax
from ahmc.adapters.blackjax import gpucb_adaptation, uniform_steps_hmc

rng = np.random.default_rng(0)
features = rng.normal(size=(200, 5))
labels = rng.uniform(size=200) < 1 / (1 + np.exp(-features @ np.array([1.0, -2.0, 0.5, 0.0, 1.5])))
features, labels = jnp.asarray(features, jnp.float32), jnp.asarray(labels, jnp.float32)


def logdensity_fn(beta):
    logits = features @ beta
    return jnp.sum(labels * logits - jnp.logaddexp(0.0, logits)) - 0.5 * jnp.sum(beta**2) / 100.0


num_chains = 4
warmup_key, sample_key, init_key = jax.random.split(jax.random.key(0), 3)
positions = jax.random.normal(init_key, (num_chains, 5))

# 1. Warm-up: mass matrix + dual averaging, then GP-UCB over (step size, L).
warmup = gpucb_adaptation(logdensity_fn)
(state, parameters), info = warmup.run(warmup_key, positions, 1000)
box = info.search_box
print(f"search box: step size {np.asarray(box.step_size).round(3)}, L {np.asarray(box.num_steps)}")
print(f"chosen arm: step size {float(parameters['step_size']):.3f}, L {int(parameters['num_integration_steps'])}")
rounds = np.isfinite(np.asarray(info.info.reward[:, 0]))
print(f"GP rounds in warm-up: {rounds.sum()}, distinct arms tried: "
      f"{len(set(zip(np.asarray(info.info.step_size[rounds, 0]).tolist(), np.asarray(info.info.num_steps[rounds, 0]).tolist())))}")

# 2. Sampling with the tuned kernel (L_t uniform on {1..L}) in an ordinary BlackJAX loop.
kernel = uniform_steps_hmc(logdensity_fn, **parameters)
step = jax.vmap(kernel.step)


def one_step(state, key):
    state, step_info = step(jax.random.split(key, num_chains), state)
    return state, (state.position, step_info.acceptance_rate, step_info.num_integration_steps)


_, (draws, acceptance, num_steps) = jax.lax.scan(one_step, state, jax.random.split(sample_key, 1000))
ess = np.asarray(blackjax.ess(np.asarray(draws), chain_axis=1, sample_axis=0))
print(f"acceptance {float(acceptance.mean()):.2f}, gradients {int(num_steps.sum())}")
print(f"ESS min/median {ess.min():.0f}/{np.median(ess):.0f} of {draws.shape[0] * num_chains} draws; "
      f"min ESS per gradient {ess.min() / int(num_steps.sum()):.3f}")
print("posterior mean", np.asarray(draws.mean(axis=(0, 1))).round(2))
