"""High-dimensional classification with a BNN tuned by a 10-fold cross-validation reward.

In place of the thesis's Dexter set (section 4.2): breast cancer Wisconsin
(569 cases, 30 features; benchmarks/data/breast_cancer.csv), a fixed random
test split of 169 cases, features standardized with training statistics.  The
network has two tanh layers of 20 and 8 units like the thesis's; adaptive HMC
runs 10 fold chains sharing one (step size, L), tuned on minus the held-out
classification error of each round's draws.  Reports the test error of the
fold networks (mean, median), of their majority vote, and of NumPyro NUTS
(10 chains on all training cases) given the same gradient evaluations per chain.

    python examples/bnn_classification.py            # full run
    python examples/bnn_classification.py --quick    # smoke run
"""

import argparse
import csv
import json
import pathlib
import sys
import time

import jax
import numpy as np

from ahmc.adapters.bnn import make_bnn
from ahmc.adapters.numpyro_predictive import cross_validate, nuts_at_budget, predictive_average

DATA = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "breast_cancer.csv"
FULL = dict(hidden=(20, 8), num_folds=10, num_warmup=1000, num_samples=2000, num_test=169, max_tree_depth=10)
QUICK = dict(hidden=(4,), num_folds=3, num_warmup=100, num_samples=60, num_test=169, max_tree_depth=6)


def load_split(num_test, seed=2003):
    """Standardized train/test split (fixed permutation); y: 0 = malignant, 1 = benign."""
    with open(DATA) as handle:
        rows = list(csv.reader(handle))[1:]
    table = np.asarray(rows, dtype=np.float64)
    X, y = table[:, :-1], table[:, -1].astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    test, train = order[:num_test], order[num_test:]
    mean, sd = X[train].mean(0), X[train].std(0)
    scale = lambda A: ((A - mean) / sd).astype(np.float32)  # noqa: E731
    return scale(X[train]), y[train], scale(X[test]), y[test]


def error_rate(probability, y):
    return float(np.mean((np.asarray(probability) > 0.5).astype(np.int32) != y))


def main(quick=False, seed=0, output=None, super_transitions=None, **overrides):
    settings = {**(QUICK if quick else FULL), **overrides}
    X, y, X_test, y_test = load_split(settings["num_test"])
    model = make_bnn("classification", hidden=settings["hidden"])
    key_ahmc, key_nuts = jax.random.split(jax.random.key(seed))

    start = time.perf_counter()
    cv = cross_validate(model, X, y, rng_key=key_ahmc, num_folds=settings["num_folds"],
                        loss="classification_error", num_warmup=settings["num_warmup"],
                        num_samples=settings["num_samples"], super_transitions=super_transitions,
                        max_tree_depth=settings["max_tree_depth"])
    ahmc_seconds = time.perf_counter() - start
    fold_probs, _ = cv.predict(X_test)
    fold_errors = [error_rate(p, y_test) for p in np.asarray(fold_probs)]
    votes = (np.asarray(fold_probs) > 0.5).mean(0)
    vote_error = float(np.mean((votes > 0.5).astype(np.int32) != y_test))  # ties (even folds) go to class 0
    grads = cv.num_gradients
    budget = grads["metric_phase"] + grads["gp_warmup"] + grads["sampling"]

    start = time.perf_counter()
    nuts_samples, nuts_grads = nuts_at_budget(model, X, y, rng_key=key_nuts, num_chains=settings["num_folds"],
                                              num_warmup=settings["num_warmup"], num_gradients=budget,
                                              budget_includes_warmup=True,
                                              max_tree_depth=settings["max_tree_depth"])
    nuts_seconds = time.perf_counter() - start
    nuts_prob, _ = predictive_average(model, nuts_samples, X_test)
    history = cv.history
    result = {
        "settings": {**settings, "seed": seed, "super_transitions": super_transitions, "quick": quick,
                     "num_train": int(len(y))},
        "majority_class_error": float(np.mean(y_test != np.bincount(y).argmax())),
        "ahmc": {"test_error_fold_mean": float(np.mean(fold_errors)),
                 "test_error_fold_median": float(np.median(fold_errors)),
                 "test_error_majority_vote": vote_error, "test_error_folds": fold_errors,
                 "test_error_pooled_draws": error_rate(np.asarray(fold_probs).mean(0), y_test),
                 "cv_error": cv.cv_loss, "gradients_per_chain": {**grads, "total": budget},
                 "seconds": ahmc_seconds, "num_draws_per_chain": int(cv.run.positions.shape[1]),
                 "final_arm": {"step_size_factor": float(history["step_size_factor"][-1]),
                               "num_steps": int(history["num_steps"][-1])}},
        "nuts": {"test_error": error_rate(nuts_prob, y_test),
                 "gradients_per_chain": {**nuts_grads, "total": nuts_grads["warmup"] + nuts_grads["sampling"]},
                 "seconds": nuts_seconds},
    }
    a = result["ahmc"]
    print(f"breast cancer BNN: test error  AHMC fold mean {a['test_error_fold_mean']:.4f}, "
          f"median {a['test_error_fold_median']:.4f}, majority vote {a['test_error_majority_vote']:.4f}  "
          f"NUTS {result['nuts']['test_error']:.4f}  (majority class {result['majority_class_error']:.3f})")
    print(f"gradients per chain: AHMC {budget:.0f}, NUTS {result['nuts']['gradients_per_chain']['total']:.0f}")
    if output is not None:
        write_results(result, pathlib.Path(output), " ".join(["python"] + sys.argv))
    return result


def write_results(result, path, command):
    result = {"command": command, "machine": "2 shared CPU cores", **result}
    path.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    a, n = result["ahmc"], result["nuts"]
    lines = [
        "# Breast cancer: BNN (20, 8) test classification error", "",
        f"Command: `{command}` (on 2 shared CPU cores)", "", f"Settings: {result['settings']}", "",
        "| method | test error | gradients / chain | seconds |", "|---|---|---|---|",
        f"| AHMC fold networks, mean | {a['test_error_fold_mean']:.4f} | {a['gradients_per_chain']['total']:.0f} | "
        f"{a['seconds']:.0f} |",
        f"| AHMC fold networks, median | {a['test_error_fold_median']:.4f} | | |",
        f"| AHMC majority vote of the fold networks | {a['test_error_majority_vote']:.4f} | | |",
        f"| NumPyro NUTS (all training cases) | {n['test_error']:.4f} | {n['gradients_per_chain']['total']:.0f} | "
        f"{n['seconds']:.0f} |",
        f"| always the majority class | {result['majority_class_error']:.4f} | | |", "",
    ]
    path.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--super-transitions", type=int, default=None)
    parser.add_argument("--num-warmup", type=int, default=None)
    parser.add_argument("--num-samples", type=int, default=None)
    parser.add_argument("--output", default=None, help="results path without suffix (writes .json and .md)")
    args = parser.parse_args()
    overrides = {name: value for name, value in (("num_warmup", args.num_warmup), ("num_samples", args.num_samples))
                 if value is not None}
    main(quick=args.quick, seed=args.seed, output=args.output, super_transitions=args.super_transitions, **overrides)
