"""Robot arm (Neal 1992; Wang's thesis 4.1): a BNN tuned by an 8-fold cross-validation reward.

Data from the published formula, 200 training and 200 test cases (fixed seed);
a network with one tanh layer of 16 units; adaptive HMC on 8 fold chains, the
shared (step size, L) tuned on minus the held-out mean squared error of each
round's draws.  Reports the test MSE (summed over the two outputs, averaged
over cases) of the ensemble of all fold draws, the mean and median of the
fold networks' test MSEs, and NumPyro NUTS (8 chains on all 200 cases) given
the same number of gradient evaluations per chain.  Noise floor: 2 x 0.05^2.

    python examples/robot_arm.py            # full run (long on 2 cores)
    python examples/robot_arm.py --quick    # seconds-to-minutes smoke run
"""

import argparse
import json
import pathlib
import sys
import time

import jax
import numpy as np

from ahmc.adapters.bnn import make_bnn
from ahmc.adapters.numpyro_predictive import cross_validate, nuts_at_budget, predictive_average

FULL = dict(hidden=16, num_folds=8, num_warmup=1000, num_samples=4000, max_tree_depth=10)
BOX = ("step_size_factors", "num_steps_cap", "max_integration_time")  # optional search-box overrides
QUICK = dict(hidden=4, num_folds=3, num_warmup=100, num_samples=60, max_tree_depth=6)


def robot_arm_data(num_cases, rng):
    """Inputs and noisy arm positions: y1 = 2 cos x1 + 1.3 cos(x1 + x2), y2 likewise with sin."""
    x1 = rng.uniform(0.453, 1.932, num_cases) * rng.choice([-1.0, 1.0], num_cases)
    x2 = rng.uniform(0.534, 3.142, num_cases)
    y = np.stack([2.0 * np.cos(x1) + 1.3 * np.cos(x1 + x2), 2.0 * np.sin(x1) + 1.3 * np.sin(x1 + x2)], axis=1)
    y = y + 0.05 * rng.normal(size=y.shape)
    return np.stack([x1, x2], axis=1).astype(np.float32), y.astype(np.float32)


def test_mse(prediction, y):
    return float(np.mean(np.sum((np.asarray(prediction) - y) ** 2, axis=1)))


def main(quick=False, seed=0, output=None, super_transitions=None, **overrides):
    settings = {**(QUICK if quick else FULL), **overrides}
    rng = np.random.default_rng(1992)
    X, y = robot_arm_data(200, rng)
    X_test, y_test = robot_arm_data(200, rng)
    # Standardize with training statistics; errors are reported in the original units.
    mx, sx, my, sy = X.mean(0), X.std(0), y.mean(0), y.std(0)
    Xs, ys, Xs_test = (X - mx) / sx, (y - my) / sy, (X_test - mx) / sx
    model = make_bnn("regression", hidden=(settings["hidden"],), num_outputs=2)
    key_ahmc, key_nuts = jax.random.split(jax.random.key(seed))

    start = time.perf_counter()
    cv = cross_validate(model, Xs, ys, rng_key=key_ahmc, num_folds=settings["num_folds"], loss="mse",
                        num_warmup=settings["num_warmup"], num_samples=settings["num_samples"],
                        super_transitions=super_transitions, max_tree_depth=settings["max_tree_depth"],
                        **{k: settings[k] for k in BOX if k in settings})
    ahmc_seconds = time.perf_counter() - start
    fold_means, _ = cv.predict(Xs_test)
    fold_means = np.asarray(fold_means) * sy + my
    fold_mse = [test_mse(m, y_test) for m in fold_means]
    grads = cv.num_gradients
    budget = grads["metric_phase"] + grads["gp_warmup"] + grads["sampling"]

    start = time.perf_counter()
    nuts_samples, nuts_grads = nuts_at_budget(
        model, Xs, ys, rng_key=key_nuts, num_chains=settings["num_folds"], num_warmup=settings["num_warmup"],
        num_gradients=budget, budget_includes_warmup=True, max_tree_depth=settings["max_tree_depth"])
    nuts_seconds = time.perf_counter() - start
    nuts_mean, _ = predictive_average(model, nuts_samples, Xs_test)
    history = cv.history
    sampling = ~history["is_warmup"]
    result = {
        "settings": {**settings, "seed": seed, "super_transitions": super_transitions, "quick": quick},
        "noise_floor": 2 * 0.05**2,
        "predict_mean_mse": test_mse(np.broadcast_to(y.mean(0), y_test.shape), y_test),
        "ahmc": {"test_mse_ensemble": test_mse(fold_means.mean(0), y_test),
                 "test_mse_fold_mean": float(np.mean(fold_mse)), "test_mse_fold_median": float(np.median(fold_mse)),
                 "test_mse_folds": fold_mse, "cv_mse_standardized": cv.cv_loss,
                 "gradients_per_chain": {**grads, "total": budget}, "seconds": ahmc_seconds,
                 "num_draws_per_chain": int(cv.run.positions.shape[1]),
                 "final_arm": {"step_size_factor": float(history["step_size_factor"][-1]),
                               "num_steps": int(history["num_steps"][-1])},
                 "warmup_step_size": cv.run.step_size.tolist(),
                 "sampling_acceptance": float(np.mean(history["acceptance_rate"][sampling]))},
        "nuts": {"test_mse": test_mse(np.asarray(nuts_mean) * sy + my, y_test),
                 "gradients_per_chain": {**nuts_grads, "total": nuts_grads["warmup"] + nuts_grads["sampling"]},
                 "seconds": nuts_seconds},
    }
    print(f"robot arm: test MSE  AHMC ensemble {result['ahmc']['test_mse_ensemble']:.5f}  "
          f"(fold networks mean {result['ahmc']['test_mse_fold_mean']:.5f}, "
          f"median {result['ahmc']['test_mse_fold_median']:.5f})  "
          f"NUTS {result['nuts']['test_mse']:.5f}  predicting the mean {result['predict_mean_mse']:.3f}  "
          f"noise floor {result['noise_floor']:.4f}")
    print(f"gradients per chain: AHMC {budget:.0f}, NUTS {result['nuts']['gradients_per_chain']['total']:.0f}")
    if output is not None:
        write_results(result, pathlib.Path(output), " ".join(["python"] + sys.argv))
    return result


def write_results(result, path, command):
    result = {"command": command, "machine": "2 shared CPU cores", **result}
    path.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    a, n = result["ahmc"], result["nuts"]
    lines = [
        "# Robot arm: BNN test mean squared error", "", f"Command: `{command}` (on 2 shared CPU cores)", "",
        f"Settings: {result['settings']}", "",
        "| method | test MSE | gradients / chain | seconds |", "|---|---|---|---|",
        f"| AHMC, CV reward (ensemble of fold draws) | {a['test_mse_ensemble']:.5f} | "
        f"{a['gradients_per_chain']['total']:.0f} | {a['seconds']:.0f} |",
        f"| AHMC fold networks, mean / median | {a['test_mse_fold_mean']:.5f} / {a['test_mse_fold_median']:.5f} | | |",
        f"| NumPyro NUTS (all training cases) | {n['test_mse']:.5f} | {n['gradients_per_chain']['total']:.0f} | "
        f"{n['seconds']:.0f} |",
        f"| predicting the training mean | {result['predict_mean_mse']:.4f} | | |", "",
        f"Noise floor {result['noise_floor']:.4f}; thesis: adaptive HMC 0.00498 +- 0.00012, Neal's HMC 0.00554.", "",
    ]
    path.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--super-transitions", type=int, default=None)
    parser.add_argument("--num-warmup", type=int, default=None)
    parser.add_argument("--num-samples", type=int, default=None)
    parser.add_argument("--step-size-factors", type=float, nargs=2, default=None)
    parser.add_argument("--num-steps-cap", type=int, default=None)
    parser.add_argument("--max-integration-time", type=float, default=None)
    parser.add_argument("--output", default=None, help="results path without suffix (writes .json and .md)")
    args = parser.parse_args()
    overrides = {name: getattr(args, name) for name in ("num_warmup", "num_samples") + BOX
                 if getattr(args, name) is not None}
    main(quick=args.quick, seed=args.seed, output=args.output, super_transitions=args.super_transitions, **overrides)
