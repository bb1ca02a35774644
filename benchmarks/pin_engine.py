"""Pin the JAX engine's draws and info over many option sets: a refactor of the engine must keep them.

A maintainer's check of internals (like ``engine_overhead``), not a benchmark::

    ./dev run python -m benchmarks.pin_engine record /tmp/before.pkl   # on the commit before the change
    ./dev run python -m benchmarks.pin_engine compare /tmp/before.pkl  # after it: prints every mismatch

``--cases default,dense`` pins a few of the option sets (all by default, ~3 minutes).
"""

from __future__ import annotations

import argparse
import pickle

import jax
import jax.numpy as jnp
import numpy as np

from ahmc.adapters._jax_engine import build_engine
from ahmc.adapters._jax_run import _scan, sample
from ahmc.adapters._jax_rmhmc import build_rmhmc_engine

SD = jnp.array([0.1, 1.0, 3.0])
def gauss(x):
    return -0.5 * jnp.sum((x / SD) ** 2)
def gauss_data(x, m):
    return -0.5 * jnp.sum(((x - m) / SD) ** 2)
def mixture(x):  # a trap for one chain
    a = -0.5 * jnp.sum((x / SD) ** 2)
    b = -0.5 * jnp.sum(((x - 30.0) / 0.01) ** 2) - 200.0
    return jnp.logaddexp(a, b)
def hook(draws, n, s):
    return jnp.mean(draws[:, 0, 0] ** 2), s + 1

CASES = {
    "default": dict(),
    "unpooled": dict(pooled=False),
    "dense": dict(dense_mass=True),
    "dense_auto": dict(dense_mass="auto"),
    "transition": dict(jump_estimate="transition"),
    "user_box": dict(step_size_bounds=(0.05, 0.5), num_steps_bounds=(1, 20), adapt_mass_matrix=False),
    "user_box_mm": dict(step_size_bounds=(0.05, 0.5), num_steps_bounds=(1, 20)),
    "user_L": dict(num_steps_bounds=(2, 16)),
    "moments": dict(objective="esjd_moments"),
    "paper": dict(paper_preset=True, step_size_bounds=(0.05, 0.5), num_steps_bounds=(1, 20)),
    "independent_counts": dict(shared_num_steps=False),
    "minfrac": dict(min_steps_fraction=0.5),
    "sequential": dict(sequential_chains=True),
    "freeze": dict(freeze_after="warmup"),
    "noexploit": dict(exploit_after_warmup=False, k=3),
    "super": dict(super_transitions=30),
    "hook": dict(round_end_fn=hook, round_end_state=jnp.asarray(0)),
    "hook_super": dict(round_end_fn=hook, round_end_state=jnp.asarray(0), super_transitions=30),
    "chain_data": dict(chain_data=jnp.zeros((4, 3)) + jnp.arange(4.0)[:, None]),
    "unpooled_transition": dict(pooled=False, jump_estimate="transition", dense_mass=True),
}

def run_case(name, opts):
    """Draws and info of one option set: through ``sample`` (one program) and a scan of ``step``."""
    fn = gauss_data if "chain_data" in opts else gauss
    pos = jax.random.normal(jax.random.key(3), (4, 3)) * 2.0
    out = {}
    # through sample (one program)
    if "hook" not in name and "chain_data" not in name:
        s, info, st = sample(jax.random.key(5), fn, pos, 300, 200, **opts)
        out["sample"] = (np.asarray(s), jax.tree.map(np.asarray, info._asdict()))
    # through step scans
    eng = build_engine(fn, num_warmup=300, **opts)
    st = eng.init(pos, jax.random.key(1))
    st, (p, info) = _scan(eng.step, jax.random.key(2), st, 500, True)
    out["step"] = (np.asarray(p), jax.tree.map(np.asarray, info._asdict()))
    return out


def _scan_info(engine, positions, num_steps):
    state = engine.init(positions, jax.random.key(1))
    _, (draws, info) = _scan(engine.step, jax.random.key(2), state, num_steps, True)
    return {"step": (np.asarray(draws), jax.tree.map(np.asarray, info._asdict()))}


def run_all(cases=None) -> dict:
    """Draws and info of every case (``cases``: names, None for all, with ``rmhmc`` and ``restart``)."""
    names = list(CASES) + ["rmhmc", "restart"] if cases is None else list(cases)
    res = {}
    for name in names:
        if name == "rmhmc":
            positions = jax.random.normal(jax.random.key(3), (4, 3)) * 2.0
            res[name] = _scan_info(build_rmhmc_engine(gauss, num_warmup=200, metric="diagonal_softabs"), positions, 300)
        elif name == "restart":  # one chain starts in a negligible-mass trap
            positions = jnp.concatenate([jnp.full((1, 3), 30.0), jax.random.normal(jax.random.key(3), (3, 3))])
            res[name] = _scan_info(build_engine(mixture, num_warmup=300), positions, 500)
        else:
            res[name] = run_case(name, CASES[name])
        print(name, flush=True)
    return res


def mismatches(reference: dict, result: dict) -> list[str]:
    """The (case, route) pairs whose draws or any info field differ from the reference's."""
    bad = []
    for name in result:
        for route, (draws, info) in result[name].items():
            ref_draws, ref_info = reference[name][route]
            same = np.array_equal(ref_draws, draws, equal_nan=True) and all(
                np.array_equal(ref_info[k], info[k], equal_nan=True) for k in ref_info)
            if not same:
                bad.append(f"{name}/{route}")
    return bad


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("record", "compare"))
    parser.add_argument("path")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    args = parser.parse_args(argv)
    result = run_all(None if args.cases is None else args.cases.split(","))
    if args.mode == "record":
        with open(args.path, "wb") as f:
            pickle.dump(result, f)
        return []
    with open(args.path, "rb") as f:
        bad = mismatches(pickle.load(f), result)
    print("mismatches:", len(bad), *bad)
    return bad


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
