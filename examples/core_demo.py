"""The core tuner alone, on a noisy synthetic reward surface (NumPy only).

The "sampler" here is a known function of (step size, L) plus 15% noise, so
we can see whether the annealed GP-UCB tuner finds the good region.

    ./dev run python examples/core_demo.py [--rounds 300] [--seed 0]
"""

import argparse

import numpy as np

from ahmc.core import gp_ucb, search_space


def true_reward(step_size, num_steps):
    """Best near eps = 0.2, L = 25; falls off in log(eps) and L."""
    return np.exp(-0.5 * ((np.log(step_size / 0.2) / 0.8) ** 2 + ((num_steps - 25) / 15.0) ** 2))


def main(rounds=300, seed=0):
    rng = np.random.default_rng(seed)
    space = search_space(step_size=(1e-3, 1.0), num_steps=(1, 100))
    tuner = gp_ucb(space)
    state = tuner.init()
    print(f"grid: {space.shape[0]} step sizes x {space.shape[1]} values of L")
    print(" round   step_size    L   reward   p_adapt   moved")
    for _ in range(rounds):
        step_size, num_steps = tuner.arm(state)
        reward = true_reward(step_size, num_steps) * (1 + 0.15 * rng.normal())
        state, info = tuner.update(state, reward, rng.uniform())
        i = int(info.round)
        if i <= 10 or bool(info.arm_changed) and i > 100 or i % 50 == 0:
            print(f"{i:6d}   {step_size:9.4f}  {int(num_steps):3d}   {reward:6.3f}   "
                  f"{float(info.adapt_probability):7.3f}   {'yes' if info.arm_changed else ''}")

    surrogate = tuner.surrogate(state)
    best = np.unravel_index(np.argmax(surrogate.mean), surrogate.mean.shape)
    eps_best, l_best = surrogate.step_sizes[best[0]], surrogate.num_steps[best[1]]
    step_size, num_steps = tuner.arm(state)
    grid_eps, grid_l = np.meshgrid(space.step_sizes, space.num_steps, indexing="ij")
    optimum = true_reward(grid_eps, grid_l).max()
    print(f"\ndistinct arms tried: {int(info.num_arms)}")
    print(f"final arm:           eps = {step_size:.4f}, L = {int(num_steps)} "
          f"(true reward {true_reward(step_size, num_steps) / optimum:.1%} of the optimum)")
    print(f"surrogate optimum:   eps = {eps_best:.4f}, L = {int(l_best)}, "
          f"mean {surrogate.mean[best]:.3f} +- {surrogate.sd[best]:.3f}")
    print("true optimum:        eps = 0.2000, L = 25")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    main(**vars(parser.parse_args()))
