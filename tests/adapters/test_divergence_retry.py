"""The finer retry of a divergent transition (``divergence_retry``, delayed rejection) keeps the target.

A 2-d funnel, ``v ~ N(0, 1.5^2)`` and ``x | v ~ N(0, e^v)``, with a step size that is unstable in
its neck (about a quarter of the mass diverges there), so most transitions that start in the
neck retry.  Chains started at exact draws must still hold exact draws after any number of
transitions if the kernel leaves the target invariant: their final states are independent, so
the moments' Monte Carlo errors are the plain ``sd / sqrt(n)``.  Accepting the retry without the
ghost trajectory's check moves mass out of the neck and fails this (checked by mutation).
"""

import math
from typing import Any, NamedTuple

import numpy as np
import pytest

pytest.importorskip("blackjax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import blackjax.mcmc.integrators as integrators  # noqa: E402

from ahmc.adapters._jax_kernel import build_chain_kernel  # noqa: E402

SD_V = 1.5
NUM_CHAINS = 4000


def funnel(z):
    v, x = z[0], z[1]
    return -0.5 * (v / SD_V) ** 2 - 0.5 * x**2 * jnp.exp(-v) - 0.5 * v


class _State(NamedTuple):
    position: Any
    logdensity: Any
    logdensity_grad: Any
    inverse_mass_matrix: Any
    whitening: Any = None


def exact_draws(key, n):
    kv, kx = jax.random.split(key)
    v = SD_V * jax.random.normal(kv, (n,))
    x = jnp.exp(v / 2) * jax.random.normal(kx, (n,))
    return jnp.stack([v, x], axis=1)


def run(retry_factor, num_transitions=20, step_size=1.2, num_steps=6, seed=0):
    """The final states of ``NUM_CHAINS`` chains started at exact draws, and how many transitions retried."""
    kernel = build_chain_kernel(funnel, kernel=None, integrator=integrators.velocity_verlet,
                                divergence_threshold=1000.0, min_steps_fraction=0.0, shared_num_steps=False,
                                sequential_chains=False, by_trajectory=False, retry_factor=retry_factor)
    key = jax.random.key(seed)
    position = exact_draws(jax.random.fold_in(key, 1), NUM_CHAINS)
    logdensity, grad = jax.vmap(jax.value_and_grad(funnel))(position)
    state = _State(position, logdensity, grad, jnp.ones(2))
    eps = jnp.full((NUM_CHAINS,), step_size)
    max_steps = jnp.full((NUM_CHAINS,), num_steps, jnp.int32)

    @jax.jit
    def one(state, key):
        new, info, num, retried = kernel.step(key, state, eps, max_steps, None)
        state = state._replace(position=new.position, logdensity=new.logdensity, logdensity_grad=new.logdensity_grad)
        return state, (jnp.sum(retried), jnp.sum(info.is_divergent), jnp.sum(num))

    keys = jax.random.split(jax.random.fold_in(key, 2), num_transitions)
    counts = []
    for k in keys:
        state, c = one(state, k)
        counts.append(c)
    return np.asarray(state.position), np.asarray(counts)


def z_scores(draws):
    """Standard scores of the moments of v (mean, variance, the neck's mass below v = -1.5)
    against the truth; the chains' final states are independent draws."""
    v = draws[:, 0]
    n = v.size
    checks = [(v, 0.0, SD_V), (v**2, SD_V**2, SD_V**2 * np.sqrt(2.0))]
    neck = (v < -1.5).astype(float)
    p = 0.5 * (1 + math.erf(-1.5 / SD_V / math.sqrt(2)))
    checks.append((neck, p, np.sqrt(p * (1 - p))))
    return [float((values.mean() - truth) / (sd / np.sqrt(n))) for values, truth, sd in checks]


def test_the_retry_keeps_the_target_where_plain_hmc_would_stick():
    draws, counts = run(retry_factor=8)
    retried, divergent, gradients = counts.sum(axis=0)
    # the neck diverges often: a fifth of the transitions retry, and most of those no longer diverge
    assert retried > 0.1 * NUM_CHAINS * len(counts)
    assert divergent < 0.5 * retried
    # the retry's gradients are counted: eps / 8 for 8x the steps, then the ghost's n steps
    assert gradients > 9 * retried
    assert max(abs(z) for z in z_scores(draws)) < 4.5, z_scores(draws)


def test_the_pymc_step_retry_keeps_the_target():
    """The PyMC step's own retry (NumPy, PyMC's leapfrog), the same check at its tuned arm: dropping the
    ghost's check gives z = 10 on the mean of v (mutation)."""
    pm = pytest.importorskip("pymc")
    from pymc.blocking import DictToArrayBijection

    from ahmc.adapters.pymc import AdaptiveHMC

    num_chains, step_size, num_steps = 2000, 1.2, 6
    rng = np.random.default_rng(0)
    with pm.Model():
        v = pm.Normal("v", 0.0, SD_V)
        pm.Normal("x", 0.0, pm.math.exp(v / 2))
        step = AdaptiveHMC(rng=np.random.default_rng(1))
    # the step as in its sampling rounds at the arm (eps, L), without the rounds' bookkeeping
    step.tune, step._collect_steps, step._arm, step._min_steps_fraction = False, False, (step_size, num_steps), 0.0
    vs = SD_V * rng.standard_normal(num_chains)
    xs = np.exp(vs / 2) * rng.standard_normal(num_chains)
    final, retried = np.empty((num_chains, 2)), 0
    for i in range(num_chains):
        q = DictToArrayBijection.map({"v": np.array(vs[i]), "x": np.array(xs[i])})
        step.integrator.new_chain()
        for _ in range(10):
            p0 = step.potential.random()
            data = step._hamiltonian_step(step.integrator.compute_state(q, p0), p0, step_size)
            q, retried = data.end.q, retried + data.stats["retried"]
        point = DictToArrayBijection.rmap(q)
        final[i] = point["v"], point["x"]
    assert retried > 0.1 * num_chains * 10
    assert max(abs(z) for z in z_scores(final)) < 4.5, z_scores(final)


@pytest.mark.slow  # 2026-12-05: the default suite took 18-22 min on this host; a default test covers most of it
def test_numpyro_reports_retries_and_counts_their_gradients():
    """Through NumPyro, on a 10-d funnel: retries only after the metric phase, each marked ``retried``, its
    ``num_steps`` the first try's ``n`` plus the retry's ``8 n`` and the ghost's ``n``; without the option
    the same run's first tries diverge and none retries."""
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist
    from numpyro.infer import MCMC

    from ahmc.adapters.numpyro import AdaptiveHMC

    def funnel10():
        v = numpyro.sample("v", dist.Normal(0.0, 3.0))
        numpyro.sample("x", dist.Normal(0.0, jnp.exp(v / 2)).expand([9]))

    fields = {}
    for retry in (8, None):  # three runs' chains: whether a run's chains reach the neck varies by seed and dtype
        runs = []
        for key in (1, 2, 3):
            mcmc = MCMC(AdaptiveHMC(funnel10, divergence_retry=retry), num_warmup=400, num_samples=400, num_chains=4,
                        chain_method="vectorized", progress_bar=False)
            mcmc.warmup(jax.random.key(key), collect_warmup=True,
                        extra_fields=("retried", "num_steps", "max_steps", "diverging"))
            runs.append(mcmc.get_extra_fields(group_by_chain=True))
        fields[retry] = {k: np.concatenate([np.asarray(run[k]) for run in runs]) for k in runs[0]}
    retried, steps = fields[8]["retried"], fields[8]["num_steps"]
    assert not retried[:, :200].any()  # the metric phase (half the warm-up) does not retry
    assert retried[:, 200:].sum() >= 5
    assert np.all(steps[retried] % 10 == 0) and np.all(steps[retried] >= 10)
    assert np.all(steps[~retried] <= fields[8]["max_steps"][~retried])
    assert not fields[None]["retried"].any() and fields[None]["diverging"][:, 200:].sum() >= 5


def test_the_fixed_kernel_after_the_adaptation_retries_too():
    """``uniform_steps_hmc`` (BlackJAX's ``dynamic_hmc`` with ahmc's proposal loop) keeps the target the same
    way, one chain per state under ``jax.vmap``, and reports its retries."""
    from ahmc.adapters.blackjax import uniform_steps_hmc

    kernel = uniform_steps_hmc(funnel, step_size=1.2, inverse_mass_matrix=jnp.ones(2), num_integration_steps=6)
    key = jax.random.key(3)
    positions = exact_draws(jax.random.fold_in(key, 1), NUM_CHAINS)
    states = jax.vmap(kernel.init)(positions, jax.random.split(jax.random.fold_in(key, 2), NUM_CHAINS))
    step = jax.jit(jax.vmap(kernel.step))
    retried = 0
    for k in jax.random.split(jax.random.fold_in(key, 3), 20):
        states, info = step(jax.random.split(k, NUM_CHAINS), states)
        retried += int(np.sum(info.retried))
    assert retried > 0.1 * NUM_CHAINS * 20
    draws = np.asarray(states.position)
    assert max(abs(z) for z in z_scores(draws)) < 4.5, z_scores(draws)
    with pytest.raises(ValueError, match="divergence_retry must be a whole number >= 2"):
        uniform_steps_hmc(funnel, step_size=1.2, inverse_mass_matrix=jnp.ones(2), num_integration_steps=6,
                          divergence_retry=1)
