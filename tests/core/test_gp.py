"""The GP inside the tuner against a dense textbook computation."""

import numpy as np
import pytest

from ahmc.core import gp_ucb, search_space

NOISE = 0.1
LENGTHSCALE = 0.2


def dense_posterior(space, observations):
    """Rasmussen & Williams (2.25)-(2.26), one row per single evaluation."""
    grid = np.stack(
        np.meshgrid(space.step_size_unit, space.num_steps_unit, indexing="ij"), axis=-1
    ).reshape(-1, 2)
    arms = np.array([a for a, _, _ in observations])
    x = grid[arms]
    y = np.array([r for _, r, _ in observations])
    noise = np.array([NOISE / w for _, _, w in observations])

    def k(a, b):
        d2 = ((a[:, None, :] - b[None, :, :]) / LENGTHSCALE) ** 2
        return np.exp(-0.5 * d2.sum(-1))

    system = k(x, x) + np.diag(noise)
    k_star = k(grid, x)
    mean = k_star @ np.linalg.solve(system, y)
    var = 1.0 - np.einsum("ij,ji->i", k_star, np.linalg.solve(system, k_star.T))
    return mean.reshape(space.shape), var.reshape(space.shape)


def drive(tuner, arms, rewards, weights=None):
    state = tuner.init()
    infos = []
    for t, (arm, reward) in enumerate(zip(arms, rewards)):
        state = state._replace(arm=np.int32(arm))
        w = 1.0 if weights is None else weights[t]
        state, info = tuner.update(state, reward, uniform=1.0, weight=w)
        infos.append(info)
    return state, infos


@pytest.fixture
def space():
    return search_space((0.01, 1.0), (1, 30), num_step_sizes=40)


def test_pooled_duplicates_equal_separate_observations(space):
    rng = np.random.default_rng(1)
    tuner = gp_ucb(space, noise_variance=NOISE, lengthscale=LENGTHSCALE)
    distinct = rng.choice(space.num_arms, size=12, replace=False)
    arms = rng.choice(distinct, size=60)  # many repeats
    rewards = rng.normal(1.0, 0.3, size=60)
    state, _ = drive(tuner, arms, rewards)

    mean, var = dense_posterior(space, list(zip(arms, rewards, np.ones(60))))
    surrogate = tuner.surrogate(state)
    np.testing.assert_allclose(surrogate.mean, mean, atol=1e-8, rtol=0)
    np.testing.assert_allclose(tuner.settle(state).grid_variance, var, atol=1e-8, rtol=0)
    np.testing.assert_allclose(surrogate.sd, np.sqrt(np.clip(var, 0, None)) / state.scale, atol=1e-8)
    assert int((state.buffer.count > 0).sum()) == len(set(arms.tolist()))


def test_weighted_reward_equals_noise_divided_by_weight(space):
    rng = np.random.default_rng(2)
    tuner = gp_ucb(space, noise_variance=NOISE, lengthscale=LENGTHSCALE)
    arms = rng.choice(space.num_arms, size=20)
    rewards = rng.normal(size=20)
    weights = rng.integers(1, 5, size=20).astype(float)
    state, _ = drive(tuner, arms, rewards, weights)
    mean, var = dense_posterior(space, list(zip(arms, rewards, weights)))
    np.testing.assert_allclose(tuner.surrogate(state).mean, mean, atol=1e-8)
    np.testing.assert_allclose(tuner.settle(state).grid_variance, var, atol=1e-8)


def test_eviction_forgets_exactly_the_evicted_arm(space):
    rng = np.random.default_rng(3)
    capacity = 5
    tuner = gp_ucb(space, capacity=capacity, noise_variance=NOISE, lengthscale=LENGTHSCALE)
    distinct = rng.choice(space.num_arms, size=9, replace=False)
    arms = rng.choice(distinct, size=80)
    rewards = rng.normal(size=80)
    state = tuner.init()
    kept = {}  # arm -> its observations still in the GP
    num_evictions = 0
    for arm, reward in zip(arms, rewards):
        before = set(state.buffer.arm[state.buffer.count > 0].tolist())
        state, info = tuner.update(state._replace(arm=np.int32(arm)), reward, uniform=1.0)
        after = set(state.buffer.arm[state.buffer.count > 0].tolist())
        for gone in before - after:
            kept.pop(gone)
            num_evictions += 1
        assert bool(info.is_evicting) == bool(before - after)
        kept.setdefault(int(arm), []).append((int(arm), reward, 1.0))
        assert len(after) <= capacity
    assert num_evictions > 5
    observations = [o for obs in kept.values() for o in obs]
    mean, var = dense_posterior(space, observations)
    np.testing.assert_allclose(tuner.surrogate(state).mean, mean, atol=1e-8)
    np.testing.assert_allclose(tuner.settle(state).grid_variance, var, atol=1e-8)


def test_eviction_drops_the_least_visited_then_oldest(space):
    tuner = gp_ucb(space, capacity=3)
    state = tuner.init()
    for arm in [10, 10, 20, 30, 30, 40]:  # 20 has one visit: evicted for 40
        state, _ = tuner.update(state._replace(arm=np.int32(arm)), 1.0, uniform=1.0)
    assert sorted(state.buffer.arm.tolist()) == [10, 30, 40]
    for arm in [50]:  # 10, 30 have two visits, 40 one: 40 goes
        state, _ = tuner.update(state._replace(arm=np.int32(arm)), 1.0, uniform=1.0)
    assert sorted(state.buffer.arm.tolist()) == [10, 30, 50]


def test_acquisition_is_the_ucb_with_the_standard_deviation(space):
    """u = s * mu + p_i * sqrt(beta_{i+1}) * sigma (sd, not variance), maximised over the grid."""
    from ahmc.core.tuner import adapt_probability, ucb_beta

    rng = np.random.default_rng(5)
    tuner = gp_ucb(space, noise_variance=NOISE, lengthscale=LENGTHSCALE)
    arms = rng.choice(space.num_arms, size=6, replace=False)
    rewards = rng.uniform(0.5, 2.0, size=6)
    state, infos = drive(tuner, arms, rewards)
    mean, var = dense_posterior(space, list(zip(arms, rewards, np.ones(6))))
    i = 6
    expected = (4.0 / rewards.max()) * mean + adapt_probability(i) * np.sqrt(ucb_beta(i)) * np.sqrt(var)
    np.testing.assert_allclose(tuner.surrogate(state).acquisition, expected, atol=1e-8)
    assert int(infos[-1].proposed_arm) == int(np.argmax(expected))
    # few data, p_i = 1: exploration matters, so sd and variance pick different arms here
    with_variance = (4.0 / rewards.max()) * mean + np.sqrt(ucb_beta(i)) * var
    assert int(np.argmax(with_variance)) != int(np.argmax(expected))
