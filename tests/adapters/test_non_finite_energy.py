"""A proposal whose energy is not finite is a divergence, never accepted.

In float32 (NumPyro's default) one leapfrog step with the large step size dual averaging tries
right after a mass-matrix window can throw eight schools' log tau to 36; the momentum reaches
1e33 and, with a dense matrix, BlackJAX's kinetic energy ``0.5 p . (M^-1 p)`` overflows to
``-inf``. BlackJAX's acceptance test maps only NaN to a rejection, so the proposal was accepted
with probability one: the chain jumped to mu = -370, its step size collapsed to 1e-11, and all its
draws sat there (1 run in 40 of one chain with 300 warm-up iterations; no warning). That run
depends on XLA's rounding (it does not recur under the test suite's compiler settings), so the
tests below build the two ways to a non-finite energy directly.
"""

import numpy as np
import pytest
from scipy.stats import norm

pytest.importorskip("numpyro")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

import blackjax.mcmc.metrics as metrics  # noqa: E402

from ahmc.adapters._jax_kernel import finite_energy  # noqa: E402
from ahmc.adapters.blackjax import run_chains, uniform_steps_hmc  # noqa: E402
from ahmc.adapters.numpyro import AdaptiveHMC  # noqa: E402

from ..reference import assert_moments_match  # noqa: E402

# The run's inverse mass matrix at that iteration (eigenvalues 0.63-10: positive definite) and the
# proposal's momentum.
INVERSE_MASS_MATRIX = np.array([
    [9.994, -0.256, -0.132, -0.042, 0.117, 0.051, -0.095, 0.114, 0.039, -0.09],
    [-0.256, 0.858, 0.189, 0.06, -0.167, -0.073, 0.135, -0.163, -0.056, 0.129],
    [-0.132, 0.189, 0.953, 0.031, -0.086, -0.038, 0.07, -0.084, -0.029, 0.067],
    [-0.042, 0.06, 0.031, 0.795, -0.027, -0.012, 0.022, -0.027, -0.009, 0.021],
    [0.117, -0.167, -0.086, -0.027, 0.922, 0.034, -0.062, 0.075, 0.026, -0.059],
    [0.051, -0.073, -0.038, -0.012, 0.034, 0.914, -0.027, 0.033, 0.011, -0.026],
    [-0.095, 0.135, 0.07, 0.022, -0.062, -0.027, 0.946, -0.06, -0.021, 0.047],
    [0.114, -0.163, -0.084, -0.027, 0.075, 0.033, -0.06, 0.948, 0.025, -0.057],
    [0.039, -0.056, -0.029, -0.009, 0.026, 0.011, -0.021, 0.025, 0.72, -0.02],
    [-0.09, 0.129, 0.067, 0.021, -0.059, -0.026, 0.047, -0.057, -0.02, 1.003]])
MOMENTUM = [8.58e15, 2.16e33, -1.73e31, 2.78e31, -8.5e30, -1.11e31, 2.85e30, 2.72e31, 1.86e31, 9.54e30]


def test_an_overflowing_kinetic_energy_is_infinite_not_minus_infinite():
    matrix, momentum = jnp.asarray(INVERSE_MASS_MATRIX, jnp.float32), jnp.asarray(MOMENTUM, jnp.float32)
    assert not np.isfinite(metrics.gaussian_euclidean(matrix).kinetic_energy(momentum))  # BlackJAX's: overflow
    assert finite_energy(matrix).kinetic_energy(momentum) == np.inf
    small = jnp.ones(10, jnp.float32)
    assert finite_energy(matrix).kinetic_energy(small) == metrics.gaussian_euclidean(matrix).kinetic_energy(small)


def _wall(x):
    """N(0, I) with +inf beyond x0 = 1.5 (a singularity, in floating point): HMC must treat it as outside
    the support, so x0 is a standard normal truncated at 1.5. Accepted once, a chain could never leave."""
    return jnp.where(x[0] > 1.5, jnp.inf, -0.5 * jnp.sum(x**2))


def _run_chains(positions):
    samples, info = run_chains(jax.random.key(0), _wall, positions, num_warmup=500, num_samples=1000)
    return np.asarray(samples), np.asarray(info.is_divergent)


def _numpyro_float32(positions):
    mcmc = MCMC(AdaptiveHMC(potential_fn=lambda x: -_wall(x)), num_warmup=500, num_samples=1000, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    with jax.enable_x64(False):
        mcmc.run(jax.random.key(0), init_params=positions.astype(jnp.float32), extra_fields=("diverging",))
    return (np.asarray(mcmc.get_samples(group_by_chain=True)),
            np.asarray(mcmc.get_extra_fields(group_by_chain=True)["diverging"]))


def _uniform_steps_hmc(positions):
    kernel = uniform_steps_hmc(_wall, step_size=0.8, inverse_mass_matrix=jnp.ones(2), num_integration_steps=4)
    states = jax.vmap(kernel.init)(positions, jax.random.split(jax.random.key(1), 4))

    def one_step(states, key):
        states, info = jax.vmap(kernel.step)(jax.random.split(key, 4), states)
        return states, (states.position, info.is_divergent)

    _, (draws, divergent) = jax.lax.scan(one_step, states, jax.random.split(jax.random.key(2), 2000))
    return np.asarray(draws).swapaxes(0, 1), np.asarray(divergent)


@pytest.mark.parametrize("route", [_run_chains, _numpyro_float32, _uniform_steps_hmc],
                         ids=["run_chains", "numpyro_float32", "uniform_steps_hmc"])
def test_a_proposal_at_infinite_density_is_a_divergence_never_accepted(route):
    samples, divergent = route(jnp.zeros((4, 2)))
    assert samples[..., 0].max() <= 1.5
    assert divergent.any()
    ratio = norm.pdf(1.5) / norm.cdf(1.5)  # the truncated normal's mean is -ratio
    assert_moments_match(samples, [-ratio, 0.0], [np.sqrt(1.0 - 1.5 * ratio - ratio**2), 1.0])
