"""One implementation, three ways to run it: NumPy, jax.numpy eager, jax.jit (and vmap)."""

import numpy as np
import pytest

from ahmc.core import gp_ucb, search_space
from ahmc.core.objectives import normalized_esjd, round_init, round_update

jax = pytest.importorskip("jax")
jnp = jax.numpy

from .surfaces import bump_surface  # noqa: E402

NUM_ROUNDS = 150


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def tuner():
    return gp_ucb(search_space((1e-3, 1.0), (1, 50), num_step_sizes=60), capacity=32)


def _rewards_and_uniforms(seed, n=NUM_ROUNDS):
    rng = np.random.default_rng(seed)
    return rng.normal(size=n), rng.uniform(size=n)


def _run(tuner, xp, update, seed):
    """Feed rewards that depend on the arm, so diverging arms show up."""
    f = bump_surface(seed)
    space = tuner.space
    h = space.shape[1]
    noise, uniforms = _rewards_and_uniforms(seed)
    state = tuner.init(xp=xp, dtype=xp.float64)
    arms = []
    for t in range(NUM_ROUNDS):
        arm = int(state.arm)
        reward = f(space.step_size_unit[arm // h], space.num_steps_unit[arm % h]) * (1 + 0.1 * noise[t])
        state, info = update(state, xp.asarray(reward), xp.asarray(uniforms[t]))
        arms.append(arm)
    return arms, state


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_numpy_jax_eager_and_jit_agree(tuner, seed):
    arms_np, state_np = _run(tuner, np, tuner.update, seed)
    arms_eager, state_eager = _run(tuner, jnp, tuner.update, seed)
    arms_jit, state_jit = _run(tuner, jnp, jax.jit(tuner.update), seed)
    assert arms_np == arms_eager == arms_jit
    assert len(set(arms_np)) > 5  # the test would be vacuous with a fixed arm
    for other in (state_eager, state_jit):
        np.testing.assert_allclose(np.asarray(other.grid_variance), state_np.grid_variance, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(np.asarray(other.buffer.mean_reward), state_np.buffer.mean_reward, rtol=1e-6)
    surrogate_np = tuner.surrogate(state_np)
    surrogate_jit = jax.jit(tuner.surrogate)(state_jit)
    np.testing.assert_allclose(np.asarray(surrogate_jit.mean), surrogate_np.mean, rtol=1e-6, atol=1e-9)


def test_vmap_over_tuners_equals_a_loop(tuner):
    num_tuners, num_rounds = 8, 40
    rng = np.random.default_rng(7)
    rewards = rng.normal(size=(num_rounds, num_tuners))
    uniforms = rng.uniform(size=(num_rounds, num_tuners))
    batched_update = jax.jit(jax.vmap(tuner.update))
    state = jax.vmap(lambda _: tuner.init(xp=jnp, dtype=jnp.float64))(jnp.arange(num_tuners))
    loop_states = [tuner.init(xp=np, dtype=np.float64) for _ in range(num_tuners)]
    for t in range(num_rounds):
        # reward depends on the arm so the tuners diverge from each other
        arm_effect = np.asarray(state.arm) % 7 / 7.0
        r = rewards[t] + arm_effect
        state, info = batched_update(state, jnp.asarray(r), jnp.asarray(uniforms[t]))
        for c in range(num_tuners):
            loop_states[c], _ = tuner.update(loop_states[c], r[c], uniforms[t, c])
    np.testing.assert_array_equal(np.asarray(state.arm), [int(s.arm) for s in loop_states])
    np.testing.assert_allclose(
        np.asarray(state.grid_variance), np.stack([s.grid_variance for s in loop_states]), rtol=1e-6, atol=1e-9
    )
    assert len(set(np.asarray(state.arm).tolist())) > 1


def test_jit_keeps_shapes_and_dtypes(tuner):
    state = tuner.init(xp=jnp, dtype=jnp.float64)
    new_state, _ = jax.jit(tuner.update)(state, 1.0, 0.5)
    assert jax.tree.structure(state) == jax.tree.structure(new_state)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(new_state)):
        assert a.shape == b.shape and a.dtype == b.dtype


def test_float32_state_stays_float32_and_finite(tuner):
    with jax.enable_x64(False):
        state = tuner.init(xp=jnp, dtype=jnp.float32)
        update = jax.jit(tuner.update)
        rng = np.random.default_rng(0)
        for reward in list(rng.uniform(size=50)) + [np.nan]:
            state, _ = update(state, reward, rng.uniform())
        assert state.grid_variance.dtype == jnp.float32
        assert bool(jnp.all(jnp.isfinite(state.grid_variance)))


def test_objectives_agree_across_backends():
    rng = np.random.default_rng(3)
    positions = rng.normal(size=(11, 4))
    scale = rng.uniform(0.5, 2.0, size=4)
    results = []
    for xp in (np, jnp):
        stats = round_init(xp=xp, dtype=xp.float64)
        step = jax.jit(round_update) if xp is jnp else round_update
        for t in range(10):
            stats = step(stats, xp.asarray(positions[t]), xp.asarray(positions[t + 1]), 3, 0.9, False, xp.asarray(scale))
        results.append(float(normalized_esjd(stats, 5)))
    assert results[0] == pytest.approx(results[1], rel=1e-12)
    expected = np.mean(np.sum(((positions[1:] - positions[:-1]) / scale) ** 2, axis=1)) / np.sqrt(5)
    assert results[0] == pytest.approx(expected, rel=1e-12)
