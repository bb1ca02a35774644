"""ahmc's BlackJAX adapter used the way BlackJAX users write every sampler.

``alg = adaptive_hmc(logdensity_fn)``; ``state = alg.init(position, key)`` with ONE chain's position;
``jax.vmap`` over keys and states for several chains.  The many-chain forms (``pooled_adaptive_hmc``,
``run_chains``, ``gpucb_adaptation(...).run``) take a leading chain axis and refuse anything else.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ahmc.adapters.blackjax import (
    adaptive_hmc,
    gpucb_adaptation,
    pooled_adaptive_hmc,
    run_chains,
)
from ahmc.core.snapshot import WarmStartWarning
from tests.reference import assert_moments_match

NUM_CHAINS = 4
# The ill-scaled Gaussian of the issue: scales 0.01..100, means linspace(-3, 3).
SCALES = np.logspace(-2, 2, 10)
MEANS = np.linspace(-3.0, 3.0, 10)


def ill_scaled(x):
    return -0.5 * jnp.sum(((x - MEANS) / SCALES) ** 2)


def vmapped_run(sampler, positions, key, num_steps):
    keys = jax.random.split(key, positions.shape[0] if hasattr(positions, "shape") else NUM_CHAINS)
    states = jax.vmap(sampler.init)(positions, keys)

    @jax.jit
    def run(states, key):
        def body(states, key):
            states, info = jax.vmap(sampler.step)(jax.random.split(key, NUM_CHAINS), states)
            return states, (states.position, info)

        return jax.lax.scan(body, states, jax.random.split(key, num_steps))

    return run(states, jax.random.fold_in(key, 1))


def test_one_chain_init_and_vmap_sample_the_target():
    num_warmup, num_draws = 600, 1200
    sampler = adaptive_hmc(ill_scaled, num_warmup=num_warmup)
    positions = MEANS + SCALES * jax.random.normal(jax.random.key(1), (NUM_CHAINS, 10))
    state = sampler.init(positions[0], jax.random.key(0))
    assert state.position.shape == (10,)  # one chain's state, as BlackJAX's kernels keep it
    states, (draws, info) = vmapped_run(sampler, positions, jax.random.key(2), num_warmup + num_draws)
    assert info.step_size.shape == (num_warmup + num_draws, NUM_CHAINS)
    draws = np.swapaxes(np.asarray(draws)[num_warmup:], 0, 1)
    assert_moments_match(draws, MEANS, SCALES, min_ess=100, max_rhat=1.05)
    # independent tuners: the chains' arms differ
    arms = np.asarray(info.step_size)[-1]
    assert len(np.unique(arms)) > 1


def pytree_logdensity(p):
    return -0.5 * (jnp.sum(p["a"] ** 2) + p["b"] ** 2 / 4.0)  # sds 1, 1, 1 and 2


def pytree_run(num_warmup, num_steps):
    """One chain's pytree position through init (its shapes kept), then vmapped chains: (draws, info)."""
    sampler = adaptive_hmc(pytree_logdensity, num_warmup=num_warmup)
    position = {"a": jnp.zeros(3), "b": jnp.asarray(0.5)}
    state = sampler.init(position, jax.random.key(0))
    assert state.position["a"].shape == (3,) and state.position["b"].shape == ()
    positions = jax.tree.map(lambda x: jnp.stack([x + 0.1 * i for i in range(NUM_CHAINS)]), position)
    _, (draws, info) = vmapped_run(sampler, positions, jax.random.key(3), num_steps)
    return draws, info


@pytest.mark.slow  # the fast pytree check is test_pytree_position_one_chain_runs
def test_pytree_position_one_chain():
    draws, _ = pytree_run(200, 1000)
    a = np.swapaxes(np.asarray(draws["a"])[200:], 0, 1)
    b = np.swapaxes(np.asarray(draws["b"])[200:], 0, 1)
    assert_moments_match(np.concatenate([a, b[..., None]], axis=-1), np.zeros(4), [1, 1, 1, 2],
                         min_ess=100, max_rhat=1.05)


def test_pytree_position_one_chain_runs():
    """A pytree position through init and the vmapped step keeps its structure, shapes and finiteness."""
    draws, info = pytree_run(30, 40)
    assert draws["a"].shape == (40, NUM_CHAINS, 3) and draws["b"].shape == (40, NUM_CHAINS)
    assert np.isfinite(np.asarray(draws["a"])).all() and np.asarray(info.is_accepted).any()


def test_one_chain_rmhmc_vmaps():
    sampler = adaptive_hmc(lambda x: -0.5 * jnp.sum(x**2), num_warmup=20, metric="softabs")
    positions = jax.random.normal(jax.random.key(4), (NUM_CHAINS, 2))
    states, (draws, info) = vmapped_run(sampler, positions, jax.random.key(5), 30)
    assert states.position.shape == (NUM_CHAINS, 2) and info.num_gradient_evals.shape == (30, NUM_CHAINS)
    assert np.isfinite(np.asarray(draws)).all()


def test_single_chain_forms_refuse_pooled():
    with pytest.raises(ValueError, match="pooled= does not apply.*pooled_adaptive_hmc"):
        adaptive_hmc(ill_scaled, pooled=True)


def test_pooled_form_checks_the_chain_count():
    sampler = pooled_adaptive_hmc(ill_scaled, NUM_CHAINS, num_warmup=100)
    with pytest.raises(ValueError, match="num_chains=4.*leading axis of size 3"):
        sampler.init(jnp.zeros((3, 10)), jax.random.key(0))
    with pytest.raises(ValueError, match=r"read as 10 chains of a scalar.*x\[None\]"):
        pooled_adaptive_hmc(ill_scaled, 10).init(jnp.zeros(10), jax.random.key(0))
    with pytest.raises(ValueError, match="num_chains must be a positive integer"):
        pooled_adaptive_hmc(ill_scaled, 0)
    state = sampler.init(jnp.asarray(MEANS) + jnp.zeros((NUM_CHAINS, 10)), jax.random.key(0))
    state, info = jax.jit(sampler.step)(jax.random.key(1), state)
    assert state.position.shape == (NUM_CHAINS, 10) and info.step_size.shape == (NUM_CHAINS,)


@pytest.mark.parametrize("entry", ["run_chains", "gpucb_adaptation"])
def test_batch_entry_points_refuse_one_chains_position(entry):
    position = jnp.asarray(MEANS)  # one chain's (10,) position where a (chains, 10) batch is expected
    with pytest.raises(ValueError, match=r"read as 10 chains of a scalar.*x\[None\]"):
        if entry == "run_chains":
            run_chains(jax.random.key(0), ill_scaled, position, 10, 10)
        else:
            gpucb_adaptation(ill_scaled).run(jax.random.key(0), position, 10)


def test_one_dimensional_targets_keep_working():
    """A 1-d target whose log density is elementwise is not ambiguous: (chains,) positions run."""
    samples, _ = run_chains(jax.random.key(0), lambda x: -0.5 * x**2, jnp.zeros(NUM_CHAINS) + 0.1, 60, 20)
    assert samples.shape == (NUM_CHAINS, 20)


@pytest.mark.parametrize(
    ("positions", "match"),
    [
        (jnp.zeros((NUM_CHAINS, 0)), "no coordinates"),
        (jnp.zeros((0, 3)), "0 chains"),
        ({}, "empty pytree"),
        ({"a": jnp.zeros((4, 2)), "b": jnp.zeros((3,))}, "same size on every leaf"),
    ],
)
def test_bad_positions_get_clear_errors(positions, match):
    with pytest.raises(ValueError, match=match):
        run_chains(jax.random.key(0), lambda p: 0.0, positions, 10, 10)


def test_run_chains_compiles_once_per_shape_and_puts_chains_first():
    """One compiled program per engine and shape: the second call compiles nothing (and draws the same);
    info's fields have the samples' axis order, (chains, iterations)."""
    from ahmc.adapters import _jax_run

    def fresh(x):  # a log density no other test compiled
        return ill_scaled_3(x)

    positions = jnp.zeros((NUM_CHAINS, 3)) + 0.1
    before = _jax_run._spec_run_jit._cache_size()
    first, info = run_chains(jax.random.key(0), fresh, positions, 60, 20)
    assert _jax_run._spec_run_jit._cache_size() == before + 1
    again, _ = run_chains(jax.random.key(0), fresh, positions, 60, 20)
    assert _jax_run._spec_run_jit._cache_size() == before + 1
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))  # same key, same draws
    assert np.shape(first)[:2] == (NUM_CHAINS, 20)
    assert all(np.shape(field) == (NUM_CHAINS, 80) for field in info)
    assert not np.asarray(info.is_warmup)[:, 60:].any() and np.asarray(info.is_warmup)[:, :60].all()
    run_chains(jax.random.key(0), fresh, jnp.zeros((NUM_CHAINS + 1, 3)) + 0.1, 60, 20)  # a new shape
    assert _jax_run._spec_run_jit._cache_size() == before + 2


def test_a_refit_on_new_data_of_the_same_shapes_compiles_nothing():
    """Data given as a ``jax.tree_util.Partial``'s arguments (and a warm start's values) are the compiled
    program's arguments: a refit on other data of the same shapes, cold or from another snapshot, runs the
    same program; the draws follow the data."""
    from ahmc.adapters import _jax_run
    from ahmc.adapters.blackjax import tuning_snapshot

    def regression_density(scales, x):  # a Partial's arguments come first; no other test compiles this
        return -0.5 * jnp.sum((x / scales) ** 2)

    positions = jnp.zeros((NUM_CHAINS, 3)) + 0.1
    first = jax.tree_util.Partial(regression_density, jnp.asarray([0.1, 1.0, 10.0]))
    before = _jax_run._spec_run_jit._cache_size()
    samples, info, state = run_chains(jax.random.key(0), first, positions, 200, 100, return_state=True)
    assert _jax_run._spec_run_jit._cache_size() == before + 1
    wider = jax.tree_util.Partial(regression_density, jnp.asarray([0.12, 1.2, 12.0]))
    refit, _ = run_chains(jax.random.key(0), wider, positions, 200, 100)
    assert _jax_run._spec_run_jit._cache_size() == before + 1  # cold refit: the same program
    assert not np.allclose(np.asarray(refit), np.asarray(samples))
    snapshot = tuning_snapshot(info, state)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WarmStartWarning)  # the snapshots fit: these are warm runs
        run_chains(jax.random.key(1), wider, positions, 100, 100, warm_start=snapshot)
    assert _jax_run._spec_run_jit._cache_size() == before + 2  # the warm program: another warm-up length
    _, refit_info, refit_state = run_chains(jax.random.key(2), wider, positions, 200, 100, return_state=True)
    other = tuning_snapshot(refit_info, refit_state)
    narrower = jax.tree_util.Partial(regression_density, jnp.asarray([0.095, 0.95, 9.5]))
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kwargs: compiles.append(event) if event.endswith("backend_compile_duration") else None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WarmStartWarning)
        again, _ = run_chains(jax.random.key(1), narrower, positions, 100, 100, warm_start=other)
    assert compiles == []  # another snapshot, other data: the checks and the run compile nothing
    assert _jax_run._spec_run_jit._cache_size() == before + 2
    assert np.all(np.isfinite(np.asarray(again)))


@pytest.mark.slow  # 2026-12-05: the default suite took 18-22 min on this host; a default test covers most of it
def test_chain_data_of_the_same_shapes_runs_the_same_program():
    """``chain_data`` (chain c samples ``logdensity_fn(x, data_c)``) is an argument of the program too: other
    values of the same shapes compile nothing, and each chain follows its own data."""
    from ahmc.adapters import _jax_run

    def shifted(x, mean):  # no other test compiles this function
        return -0.5 * jnp.sum((x - mean) ** 2)

    positions = jnp.zeros((NUM_CHAINS, 2))
    means = jnp.arange(NUM_CHAINS * 2, dtype=jnp.float32).reshape(NUM_CHAINS, 2)
    before = _jax_run._spec_run_jit._cache_size()
    run_chains(jax.random.key(0), shifted, positions, 100, 50, chain_data=means)
    samples, _ = run_chains(jax.random.key(0), shifted, positions, 100, 200, chain_data=-means)
    run_chains(jax.random.key(1), shifted, positions, 100, 200, chain_data=means + 1.0)
    assert _jax_run._spec_run_jit._cache_size() == before + 2  # one program per draw count, not per data
    chain_means = np.asarray(samples).mean(axis=1)
    assert np.all(np.abs(chain_means + np.asarray(means)) < 0.6)  # sd of a mean of ~200 draws: ~0.1-0.2


def ill_scaled_3(x):
    return -0.5 * jnp.sum((x / jnp.asarray([0.1, 1.0, 10.0])) ** 2)


def test_the_public_surface_is_small_and_has_no_twins():
    """One set of entry points: RMHMC is ``metric=`` on them, not a second family of functions."""
    import ahmc.adapters.blackjax as module

    assert len(module.__all__) <= 14
    assert all(hasattr(module, name) for name in module.__all__)
    own = [name for name, value in vars(module).items() if callable(value) and not name.startswith("_")
           and getattr(value, "__module__", "") == module.__name__]
    assert "run_chains" in own and not [name for name in own + module.__all__ if "rmhmc" in name.lower()]


def test_compiled_initial_states_still_refuse_a_start_outside_the_support():
    """The initial state compiles as one program; the start's density is checked before it, as op by op."""

    def logdensity(x):
        return jnp.sum(jnp.log(x))

    outside = jnp.array([[1.0, 1.0], [-1.0, 1.0]])
    match = r"not finite at the initial position of chain\(s\) \[1\]"
    with pytest.raises(ValueError, match=match):
        pooled_adaptive_hmc(logdensity, 2).init(outside, jax.random.key(0))
    with pytest.raises(ValueError, match=match):
        gpucb_adaptation(logdensity).run(jax.random.key(0), outside, 10)
    with pytest.raises(ValueError, match=r"chain\(s\) \[0\]"):
        adaptive_hmc(logdensity).init(outside[1], jax.random.key(0))
