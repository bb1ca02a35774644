"""Noisy synthetic reward surfaces on the unit box with a known maximum."""

import numpy as np


def bump_surface(seed):
    """A sum of two Gaussian bumps with random centres; returns f(unit_eps, unit_L)."""
    rng = np.random.default_rng(1000 + seed)
    centres = rng.uniform(0.1, 0.9, size=(2, 2))
    widths = rng.uniform(0.15, 0.3, size=(2, 2))
    heights = np.array([1.0, rng.uniform(0.4, 0.8)])

    def f(u, v):
        u, v = np.asarray(u), np.asarray(v)
        out = 0.0
        for c, w, h in zip(centres, widths, heights):
            out = out + h * np.exp(-0.5 * (((u - c[0]) / w[0]) ** 2 + ((v - c[1]) / w[1]) ** 2))
        return out

    return f


def run_tuner(tuner, f, num_rounds, seed, noise_sd=0.1, lazy=False):
    """Drive the tuner with rewards f(arm) * (1 + noise); return (state, true values per round).

    ``lazy=True``: the eager NumPy update (same states to rounding, ``test_lazy_update_gives_the_same_states``)
    for the long runs."""
    space = tuner.space
    rng = np.random.default_rng(seed)
    h = space.shape[1]
    state = tuner.init()
    values, arms = [], []
    for _ in range(num_rounds):
        arm = int(state.arm)
        value = f(space.step_size_unit[arm // h], space.num_steps_unit[arm % h])
        reward = value * (1.0 + noise_sd * rng.normal())
        state, _ = tuner.update(state, reward, rng.uniform(), lazy=lazy)
        values.append(value)
        arms.append(arm)
    return state, np.array(values), np.array(arms)


def grid_maximum(space, f):
    u, v = np.meshgrid(space.step_size_unit, space.num_steps_unit, indexing="ij")
    return f(u, v).max()
