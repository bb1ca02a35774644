"""The bad-input battery: each bad input gets a ValueError whose message names the argument and the fix,
before anything compiles, in every adapter."""

from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
import pymc as pm  # noqa: E402

from ahmc.adapters import blackjax as ahmc_blackjax  # noqa: E402
from ahmc.adapters import numpyro as ahmc_numpyro  # noqa: E402
from ahmc.adapters import pymc as ahmc_pymc  # noqa: E402


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


def numpyro_model():
    numpyro.sample("x", dist.Normal(0.0, 1.0).expand([2]))


def pymc_step(cls):
    def build(**options):
        with pm.Model():
            pm.Normal("x", 0, 1, shape=2)
            return cls(**options)

    return build


ADAPTERS = {
    "blackjax.adaptive_hmc": lambda **o: ahmc_blackjax.adaptive_hmc(logdensity, **o),
    "blackjax.pooled_adaptive_hmc(metric=)": lambda **o: ahmc_blackjax.pooled_adaptive_hmc(
        logdensity, 2, metric="softabs", **o),
    "blackjax.gpucb_adaptation": lambda **o: ahmc_blackjax.gpucb_adaptation(logdensity, **o).run(
        jax.random.key(0), jnp.zeros((2, 2)), 10),
    # checked when the routine is made, as BlackJAX's window_adaptation(...) is, not only in run
    "blackjax.gpucb_adaptation(...)": lambda **o: ahmc_blackjax.gpucb_adaptation(logdensity, **o),
    "blackjax.run_chains": lambda **o: ahmc_blackjax.run_chains(jax.random.key(0), logdensity, jnp.zeros((2, 2)), 10,
                                                                10, **o),
    "numpyro.AdaptiveHMC": lambda **o: ahmc_numpyro.AdaptiveHMC(numpyro_model, **o),
    "numpyro.AdaptiveRMHMC": lambda **o: ahmc_numpyro.AdaptiveRMHMC(numpyro_model, **o),
    "pymc.AdaptiveHMC": pymc_step(ahmc_pymc.AdaptiveHMC),
    "pymc.AdaptiveRMHMC": pymc_step(ahmc_pymc.AdaptiveRMHMC),
}

BAD = [
    ({"step_size_bound": (0.1, 1.0)}, r"unknown option 'step_size_bound'; did you mean 'step_size_bounds'\?"),
    ({"num_step_bounds": (1, 10)}, r"unknown option 'num_step_bounds'; did you mean 'num_steps_bounds'\?"),
    ({"step_size_bounds": (0.1, 1.0), "num_steps_bounds": (1.5, 10.5)},
     r"num_steps_bounds must be a pair of whole numbers.*\(1\.5, 10\.5\)"),
    ({"step_size_bounds": (0.1, 1.0), "num_steps_bounds": (2.9, 6.2)},
     r"num_steps_bounds must be a pair of whole numbers.*\(2\.9, 6\.2\)"),
    ({"step_size_bounds": (0.1, 1.0), "num_steps_bounds": (0.5, 10)},
     r"num_steps_bounds must be a pair of whole numbers.*\(0\.5, 10\)"),
    ({"divergence_retry": 1}, r"divergence_retry must be a whole number >= 2 .* or None \(off\); got 1"),
    ({"divergence_retry": 2.5}, r"divergence_retry must be a whole number >= 2 .*; got 2\.5"),
    # a NUTS user's options name ahmc's equivalent, not the nearest spelling ('log_step_size')
    ({"step_size": 0.1}, r"unknown option 'step_size' \(a NUTS option\); use initial_step_size"),
    ({"target_accept_prob": 0.9}, r"'target_accept_prob' \(a NUTS option\); use target_acceptance_rate"),
    ({"max_tree_depth": 8}, r"'max_tree_depth' \(a NUTS option\); use num_steps_cap"),
    # the driver's arguments name the driver, not the nearest option ('chain_data')
    ({"chain_method": "vectorized"}, r"'chain_method' is not a tuning option .* MCMC\(\.\.\., chain_method=\.\.\.\)"),
    ({"tune": 500}, r"'tune' is not a tuning option .* pm\.sample\(tune=\.\.\.\)"),
]


@pytest.mark.parametrize(("options", "match"), BAD, ids=lambda v: str(v)[:40] if isinstance(v, dict) else "")
@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_bad_option_gets_a_clear_error(adapter, options, match):
    with pytest.raises(ValueError, match=match):
        ADAPTERS[adapter](**options)


def test_pymc_typo_fails_before_compiling(monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before checking the options")

    import pymc.model.core

    monkeypatch.setattr(pymc.model.core, "compile", no_compile)  # the step's log density and gradient
    with pytest.raises(ValueError, match="did you mean 'step_size_bounds'"):
        pymc_step(ahmc_pymc.AdaptiveHMC)(step_size_bound=(0.1, 1.0))


@pytest.mark.parametrize(
    ("positions", "match"),
    [
        (jnp.zeros((2, 0)), "no coordinates"),
        (jnp.zeros((0, 2)), "0 chains"),
        (jnp.zeros(5), r"read as 5 chains of a scalar"),
        ({}, "empty pytree"),
    ],
)
@pytest.mark.parametrize("metric", [None, "softabs"])
def test_bad_blackjax_positions(metric, positions, match):
    with pytest.raises(ValueError, match=match):
        ahmc_blackjax.run_chains(jax.random.key(0), logdensity, positions, 10, 10, metric=metric)


@pytest.mark.parametrize("key", [0, np.array([0, 1, 2]), jnp.zeros(2, jnp.float32)], ids=["int", "3 ints", "floats"])
@pytest.mark.parametrize("entry", ["run_chains", "gpucb_adaptation"])
def test_a_seed_for_a_key_is_named(entry, key):
    """A seed where BlackJAX takes a key: the message names ``rng_key`` and how to make one."""
    positions = jnp.zeros((2, 2))
    run = (partial(ahmc_blackjax.run_chains, logdensity_fn=logdensity, positions=positions, num_warmup=10)
           if entry == "run_chains" else partial(ahmc_blackjax.gpucb_adaptation(logdensity).run, positions=positions,
                                                 num_steps=10))
    with pytest.raises(ValueError, match=r"rng_key must be a JAX key, e\.g\. jax\.random\.key\(0\)"):
        run(rng_key=key)


def test_rmhmc_in_float32_warns():
    assert not jax.config.jax_enable_x64
    with pytest.warns(UserWarning, match="RMHMC is running in float32.*jax_enable_x64"):
        ahmc_blackjax.pooled_adaptive_hmc(logdensity, 2, num_warmup=10, metric="softabs").init(jnp.zeros((2, 2), jnp.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from ahmc.adapters.blackjax import constant_metric

        ahmc_blackjax.pooled_adaptive_hmc(logdensity, 2, num_warmup=10, metric=constant_metric(np.eye(2))).init(
            jnp.zeros((2, 2), jnp.float32))


def test_improper_flat_posterior_is_named_in_jax_adapters():
    """A flat log density: the warm-up's step size grows without bound; the warning says why, not 'stuck'."""
    with pytest.warns(UserWarning, match="improper posterior") as record:
        ahmc_blackjax.run_chains(jax.random.key(0), lambda x: 0.0 * jnp.sum(x), jnp.zeros((4, 2)), 300, 10)
    assert not any("stuck" in str(w.message) for w in record)


def test_improper_flat_posterior_is_named_in_the_pymc_step(caplog):
    import logging

    with pm.Model():
        pm.Flat("x", shape=2)
        with caplog.at_level(logging.WARNING, logger="pymc"):
            pm.sample(step=ahmc_pymc.AdaptiveHMC(), tune=300, draws=10, chains=1, cores=1, random_seed=0,
                      progressbar=False, compute_convergence_checks=False)
    assert "improper posterior" in caplog.text and "keep growing" in caplog.text


def test_numpyro_start_outside_the_support_is_named_and_checked_once(monkeypatch):
    """A given ``init_params`` where the density is -inf: a ValueError naming the chain, before the run's program
    compiles. NumPyro's own initialisation already refuses such a start, so ahmc does not check it again."""
    from ahmc.adapters import _jax_run
    from numpyro.infer import MCMC

    def walled():
        x = numpyro.sample("x", dist.Normal(0.0, 1.0).expand([2]))
        numpyro.factor("wall", jnp.where(x[0] > 1.0, -jnp.inf, 0.0))

    checks = []
    check = _jax_run._check_finite
    monkeypatch.setattr(_jax_run, "_check_finite", lambda *args: checks.append(1) or check(*args))

    def mcmc():
        return MCMC(ahmc_numpyro.AdaptiveHMC(walled), num_warmup=20, num_samples=5, num_chains=3,
                    chain_method="vectorized", progress_bar=False)

    with pytest.raises(ValueError, match=r"not finite at the initial position of chain\(s\) \[1\]"):
        mcmc().run(jax.random.key(0), init_params={"x": jnp.array([[0.0, 0.0], [2.0, 0.0], [0.5, 0.0]])})
    assert checks == [1]
    mcmc().run(jax.random.key(0))  # NumPyro's initialize_model found a finite start for every chain
    assert checks == [1]
