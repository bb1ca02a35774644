"""Strict ESS per second as the chains spread over 1 to 8 devices, ahmc beside NumPyro's NUTS.

    python -m benchmarks.devices [--model pima] [--chains 8] [--devices 1 2 4 8] [--out FILE]

Each device count runs in its own process (JAX fixes the device count when it starts): on a machine
without accelerators the devices are simulated CPU devices (``--xla_force_host_platform_device_count``),
on a GPU machine the flag changes nothing and the first ``count`` of ``jax.devices()`` (the GPUs) are used;
the script is the same.  Per device count and sampler: strict ESS (min over coordinates of min(bulk ESS of x, of
(x - mean)^2)), total wall time with compilation, and their ratio.  ahmc runs through its public API,
``run_chains(..., shard_chains(positions, devices))``; NumPyro's NUTS with ``chain_method="vectorized"`` from the
same sharded positions, and with ``"parallel"`` (``pmap``, a chain per device, so only when the chains
do not exceed the devices).  Simulated devices share this machine's cores: they test the program, not
the speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

NUM_WARMUP, NUM_SAMPLES = 1000, 1000


def _strict_ess(draws):
    from benchmarks.metrics import strict_ess

    return strict_ess(draws)


def _timed(run):
    start = time.perf_counter()
    draws = run()
    return draws, time.perf_counter() - start


def _one_device_count(model_name: str, num_chains: int, seed: int, count: int) -> list[dict]:
    import jax
    import numpy as np
    from numpyro.infer import MCMC, NUTS

    from ahmc.adapters.blackjax import run_chains, shard_chains
    from benchmarks.models import get_model, initial_positions
    from benchmarks.samplers import numpyro_potential, run_chees

    model = get_model(model_name)
    positions = initial_positions(model, num_chains, seed)
    key = jax.random.key(seed)
    devices = jax.devices()[:count]
    if len(devices) < count:
        raise SystemExit(f"--devices {count}: only {len(devices)} device(s) here")
    rows = []

    def ahmc():
        samples, _ = run_chains(key, model.logdensity_fn, shard_chains(positions, devices), NUM_WARMUP, NUM_SAMPLES)
        return jax.block_until_ready(samples)

    def nuts(chain_method, init):
        mcmc = MCMC(NUTS(potential_fn=numpyro_potential(model.logdensity_fn)), num_warmup=NUM_WARMUP,
                    num_samples=NUM_SAMPLES, num_chains=num_chains, chain_method=chain_method, progress_bar=False)
        mcmc.run(key, init_params=init)
        return jax.block_until_ready(mcmc.get_samples(group_by_chain=True))

    runs = {"ahmc run_chains (sharded)": ahmc,
            "NumPyro NUTS vectorized (sharded)": lambda: nuts("vectorized", shard_chains(positions, devices))}
    if num_chains <= count:
        runs["NumPyro NUTS parallel"] = lambda: nuts("parallel", positions)
    if count == 1:  # BlackJAX's ChEES as the benchmark runs it (one device, its own chains)
        runs["BlackJAX ChEES (one device)"] = lambda: run_chees(key, model, positions, NUM_WARMUP, NUM_SAMPLES,
                                                              num_chains=num_chains).draws
    for name, run in runs.items():
        draws, seconds = _timed(run)
        ess = _strict_ess(np.asarray(draws))
        rows.append({"devices": count, "sampler": name, "strict_ess": ess, "wall_s": seconds,
                     "ess_per_s": ess / seconds})
    return rows


def _child(args) -> None:
    json.dump(_one_device_count(args.model, args.chains, args.seed, args.count), sys.stdout)


def _table(rows: list[dict]) -> str:
    lines = ["| devices | sampler | strict ESS | wall s | ESS/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['devices']} | {r['sampler']} | {r['strict_ess']:.0f} | {r['wall_s']:.1f} | {r['ess_per_s']:.1f} |"
              for r in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pima")
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    rows = []
    for count in args.devices:
        flags = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={count}"
        env = {**os.environ, "XLA_FLAGS": flags.strip(), "JAX_ENABLE_X64": "1"}
        command = [sys.executable, "-m", "benchmarks.devices", "--child", "--model", args.model,
                   "--chains", str(args.chains), "--seed", str(args.seed), "--count", str(count)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"{count} device(s) failed:\n{done.stderr[-3000:]}")
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "chains": args.chains, "seed": args.seed,
                       "num_warmup": NUM_WARMUP, "num_samples": NUM_SAMPLES, "rows": rows}, f, indent=1)
    print(_table(rows))


if __name__ == "__main__":
    main()
