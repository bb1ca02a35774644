"""Time one tuner update (GP update + acquisition over the grid) with a full buffer.

Setting of the foundation issue: 128 distinct arms in the buffer, a 200 x 100
grid of (step size, L), NumPy eager and jax.jit on CPU.  Each timed update
scores a round and maximises the UCB over all 20,000 arms; half the updates
hit a stored arm, half bring a new one and so evict a stored one.

    ./dev run python -m benchmarks.core_timing [--repeats 200]

Writes benchmarks/results/core_timing.json.
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from ahmc.core import gp_ucb, search_space

from .run import _cpu_model

RESULTS = os.path.join(os.path.dirname(__file__), "results", "core_timing.json")


def full_state(tuner, xp, dtype, rng):
    state = tuner.init(xp=xp, dtype=dtype)
    arms = rng.choice(tuner.space.num_arms, size=128, replace=False)
    for arm in arms:
        state, _ = tuner.update(state._replace(arm=xp.asarray(arm, dtype=xp.int32)), rng.uniform(), 1.0)
    return state, arms


def time_updates(update, state, arms, rng, repeats, xp, block):
    new_arms = rng.choice(tuner_space_size, size=repeats)
    times = []
    for r in range(repeats):
        arm = arms[r % len(arms)] if r % 2 == 0 else new_arms[r]
        s = state._replace(arm=xp.asarray(arm, dtype=xp.int32))
        start = time.perf_counter()
        out, _ = update(s, xp.asarray(rng.uniform()), xp.asarray(0.0))
        block(out)
        times.append(time.perf_counter() - start)
    return np.array(times)


def main(repeats):
    global tuner_space_size
    space = search_space((1e-3, 1.0), (1, 100))
    tuner = gp_ucb(space, capacity=128)
    tuner_space_size = space.num_arms
    rng = np.random.default_rng(0)
    rows = {}

    state, arms = full_state(tuner, np, np.float64, rng)
    t = time_updates(tuner.update, state, arms, rng, repeats, np, lambda x: None)
    rows["numpy_float64"] = t

    import jax
    import jax.numpy as jnp

    for name, x64 in (("jax_jit_float64", True), ("jax_jit_float32", False)):
        with jax.enable_x64(x64):
            dtype = jnp.float64 if x64 else jnp.float32
            state, arms = full_state(tuner, jnp, dtype, rng)
            update = jax.jit(tuner.update)
            start = time.perf_counter()
            jax.block_until_ready(update(state, 0.5, 0.0))
            compile_seconds = time.perf_counter() - start
            t = time_updates(update, state, arms, rng, repeats, jnp, jax.block_until_ready)
            rows[name] = t
            rows[name + "_compile_s"] = compile_seconds

    summary = {
        name: {"median_ms": float(np.median(t) * 1e3), "p90_ms": float(np.quantile(t, 0.9) * 1e3)}
        for name, t in rows.items()
        if not name.endswith("_compile_s")
    }
    for name, value in rows.items():
        if name.endswith("_compile_s"):
            summary[name.removesuffix("_compile_s")]["compile_s"] = value
    record = {
        "what": "one tuner update + acquisition, buffer full (128 arms), grid 200 x 100",
        "targets_ms": {"jax_jit": 1.0, "numpy": 5.0},
        "results": summary,
        "command": "./dev run python -m benchmarks.core_timing " + " ".join(sys.argv[1:]),
        "repeats": repeats,
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "jax": jax.__version__,
        },
        "date": time.strftime("%Y-%m-%d"),
    }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as fh:
        json.dump(record, fh, indent=2)
    for name, row in summary.items():
        print(f"{name:18s} median {row['median_ms']:.3f} ms   p90 {row['p90_ms']:.3f} ms")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=200)
    main(parser.parse_args().repeats)
