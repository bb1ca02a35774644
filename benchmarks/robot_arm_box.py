"""Robot arm: does the thesis-style search box (small step sizes, long trajectories) matter?

    ./dev run python -m benchmarks.robot_arm_box --num-warmup 500 --num-samples 1000 \\
        --output benchmarks/results/robot_arm_box

Runs the cross-validated AHMC of ``examples/robot_arm.py`` (same data, network,
folds and seed) once per search box and reports the test MSE of the ensemble of
fold draws, the gradients per chain and the arms the GP chose in sampling:

- ``default``: step-size factors (0.5, 3), ``L <= min(ceil(4 pi / eps*), 1024)``;
- ``thesis``: factors (0.1, 3) and ``L <= 4096`` (``max_integration_time = 16 pi``), the
  spirit of the thesis's box (eps from 0.01, L up to 5020), in units of each fold's
  warm-up step size.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shlex
import sys
import time
from pathlib import Path

import jax
import numpy as np

from ahmc.adapters.bnn import make_bnn
from ahmc.adapters.numpyro_predictive import cross_validate

BOXES = {
    "default": {},
    "thesis": dict(step_size_factors=(0.1, 3.0), num_steps_cap=4096, max_integration_time=16 * math.pi),
}


def load_example():
    path = Path(__file__).resolve().parents[1] / "examples" / "robot_arm.py"
    spec = importlib.util.spec_from_file_location("robot_arm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_box(example, box, num_warmup, num_samples, seed):
    rng = np.random.default_rng(1992)  # the example's data
    X, y = example.robot_arm_data(200, rng)
    X_test, y_test = example.robot_arm_data(200, rng)
    mx, sx, my, sy = X.mean(0), X.std(0), y.mean(0), y.std(0)
    model = make_bnn("regression", hidden=(16,), num_outputs=2)
    key_ahmc, _ = jax.random.split(jax.random.key(seed))
    start = time.perf_counter()
    cv = cross_validate(model, (X - mx) / sx, (y - my) / sy, rng_key=key_ahmc, num_folds=8, loss="mse",
                        num_warmup=num_warmup, num_samples=num_samples, **box)
    seconds = time.perf_counter() - start
    fold_means = np.asarray(cv.predict((X_test - mx) / sx)[0]) * sy + my
    h = cv.history
    sampling = ~h["is_warmup"]
    grads = cv.num_gradients
    return {
        "box": {k: list(v) if isinstance(v, tuple) else v for k, v in box.items()},
        "test_mse_ensemble": example.test_mse(fold_means.mean(0), y_test),
        "test_mse_fold_mean": float(np.mean([example.test_mse(m, y_test) for m in fold_means])),
        "gradients_per_chain": grads["metric_phase"] + grads["gp_warmup"] + grads["sampling"],
        "seconds": seconds,
        "largest_L_in_box": int(cv.run.tuner.space.num_steps[-1]),
        "sampling_L_quartiles": np.percentile(h["num_steps"][sampling], [25, 50, 75]).tolist(),
        "sampling_factor_quartiles": np.percentile(h["step_size_factor"][sampling], [25, 50, 75]).tolist(),
        "final_arm": [float(h["step_size_factor"][-1]), int(h["num_steps"][-1])],
        "warmup_step_size_median": float(np.median(cv.run.step_size)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-warmup", type=int, default=500)
    parser.add_argument("--num-samples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="benchmarks/results/robot_arm_box")
    args = parser.parse_args()
    example = load_example()
    results = {name: run_box(example, box, args.num_warmup, args.num_samples, args.seed)
               for name, box in BOXES.items()}
    command = "python -m benchmarks.robot_arm_box " + shlex.join(sys.argv[1:])
    out = {"command": command, "machine": "2 shared CPU cores", "seed": args.seed,
           "num_warmup": args.num_warmup, "num_samples": args.num_samples, "results": results}
    path = Path(args.output)
    path.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# Robot arm: default against thesis-style search box", "",
             f"Command: `{command}` (on 2 shared CPU cores); {args.num_warmup} warm-up + "
             f"{args.num_samples} draws per fold chain, seed {args.seed}.", "",
             "| box | test MSE (ensemble) | fold mean | largest L | sampling L quartiles | "
             "factor quartiles | gradients / chain | seconds |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} {r['box']} | {r['test_mse_ensemble']:.5f} | {r['test_mse_fold_mean']:.5f} | "
                     f"{r['largest_L_in_box']} | {[round(v) for v in r['sampling_L_quartiles']]} | "
                     f"{[round(v, 2) for v in r['sampling_factor_quartiles']]} | "
                     f"{r['gradients_per_chain']:.0f} | {r['seconds']:.0f} |")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
