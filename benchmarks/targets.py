"""The open issues' targets, met or missed, computed from a results file on the strict metric.

    ./dev run python -m benchmarks.targets benchmarks/results/bench_full.json

Issue 61 (the lean engine) asks, per second of total wall time: the NumPyro kernel and the BlackJAX
routine at 1.3x the better of NumPyro's two NUTS configurations on every model and 1.5x as a geometric
mean, the compiled PyMC route at or above ``pm.sample(nuts_sampler="numpyro")`` and nutpie, and a compile
time at most 1.5x NUTS's in the same framework. Issue 63 (the modern peers) asks, per gradient with
warm-up counted, 1.5x the best converged peer of any kind as a geometric mean and 1x on every model, and
per second 1x the best converged peer on every model. Correctness sits beside them: max R-hat below 1.01
and the largest |z| of means and variances against the reference at most 4. Each row is one route and
one target; a document asks for the table with ``<!-- results NAME targets -->`` (benchmarks.headline).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from .headline import (CONVERGED_RHAT, ROUTES, _best, _cell, _geomean, _load, _runs, is_peer, per_gradient,
                       per_second)

NUMPYRO_NUTS = ("numpyro_nuts", "numpyro_nuts_vectorized")
# The same framework's NUTS, for the compile-time bound (its faster-compiling configuration).
COMPILE_PEERS = {"ahmc_numpyro": NUMPYRO_NUTS, "ahmc_blackjax": ("blackjax_nuts",),
                 "ahmc_pymc_jax": ("pymc_numpyro", "pymc_numpyro_vectorized")}
MAX_ABS_Z = 4.0


def _converged_peers(runs: dict, model: str) -> list[str]:
    return [name for (m, name), run in runs.items()
            if m == model and is_peer(name) and run["metrics"]["rhat_max"] < CONVERGED_RHAT]


def _compile_ratio(runs: dict, model: str, route: str, peers) -> tuple[float | None, str | None]:
    """``route``'s compile time over the faster-compiling of ``peers`` (a ratio, lower is better)."""
    times = [(runs[model, n]["timing"].get("compile_s"), n) for n in peers if (model, n) in runs]
    times = [(t, n) for t, n in times if t]
    mine = runs[model, route]["timing"].get("compile_s")
    if not times or mine is None:
        return None, None
    fastest, name = min(times)
    return mine / fastest, name


def _max_abs_z(metrics: dict) -> float | None:
    """The largest |z| of the means and variances against the reference (or the long reference run)."""
    found = [metrics[k] for k in ("max_abs_z_reference", "max_abs_z_reference_sq", "max_abs_z_mean",
                                  "max_abs_z_var") if metrics.get(k) is not None]
    return max(found) if found else None


def _per_model(results: dict, route: str, kind: str) -> list[tuple[str, float, str | None]]:
    """``(model, value, against)`` for one route and one kind of comparison, on every model it ran."""
    runs, out = _runs(results), []
    for model in results["models"]:
        if (model, route) not in runs:
            continue
        mine = runs[model, route]
        if kind == "compile":
            value, name = _compile_ratio(runs, model, route, COMPILE_PEERS.get(route, ()))
        elif kind == "rhat":
            value, name = mine["metrics"]["rhat_max"], None
        elif kind == "z":
            value, name = _max_abs_z(mine["metrics"]), None
        else:
            score = per_gradient if kind.endswith("gradient") else per_second
            peers = {"numpyro_second": NUMPYRO_NUTS, "framework_second": ROUTES[route]}.get(kind)
            best, name = _best(runs, model, peers or _converged_peers(runs, model), score)
            value = score(mine) / best if best else None
        if value is not None and math.isfinite(value):
            out.append((model, value, name))
    return out


# (issue, what it asks, routes, kind, the bound, "every" model or the "mean", higher or lower is better)
TARGETS = (
    ("61", "per second >= 1.3x the best NumPyro NUTS, every model", ("ahmc_numpyro", "ahmc_blackjax"),
     "numpyro_second", 1.3, "every", "higher"),
    ("61", "per second >= 1.5x the best NumPyro NUTS, geometric mean", ("ahmc_numpyro", "ahmc_blackjax"),
     "numpyro_second", 1.5, "mean", "higher"),
    ("61", "per second >= 1x PyMC's NUTS through NumPyro and nutpie, every model", ("ahmc_pymc_jax",),
     "framework_second", 1.0, "every", "higher"),
    ("61", "compile time <= 1.5x the same framework's NUTS, every model", tuple(COMPILE_PEERS),
     "compile", 1.5, "every", "lower"),
    ("63", "per gradient >= 1.5x the best converged peer, geometric mean", tuple(ROUTES),
     "peer_gradient", 1.5, "mean", "higher"),
    ("63", "per gradient >= 1x the best converged peer, every model", tuple(ROUTES),
     "peer_gradient", 1.0, "every", "higher"),
    ("63", "per second >= 1x the best converged peer, every model", tuple(ROUTES),
     "peer_second", 1.0, "every", "higher"),
    ("-", f"max R-hat < {CONVERGED_RHAT}, every model", tuple(ROUTES), "rhat", CONVERGED_RHAT, "every", "below"),
    ("-", f"max |z| of means and variances <= {MAX_ABS_Z:g}, every model with a reference", tuple(ROUTES),
     "z", MAX_ABS_Z, "every", "lower"),
)


def _passes(value: float, bound: float, direction: str) -> bool:
    return {"higher": value >= bound, "lower": value <= bound, "below": value < bound}[direction]


def evaluate(results: dict) -> list[dict]:
    """One row per (target, route) that the run measured: the models that pass, the worst, the verdict."""
    rows = []
    for issue, text, routes, kind, bound, scope, direction in TARGETS:
        for route in routes:
            values = _per_model(results, route, kind)
            if not values:
                continue
            passing = [v for v in values if _passes(v[1], bound, direction)]
            worst = (min if direction == "higher" else max)(values, key=lambda v: v[1])
            mean = _geomean(v[1] for v in values) if kind not in ("rhat", "z") else None
            met = _passes(mean, bound, direction) if scope == "mean" else len(passing) == len(values)
            rows.append({"issue": issue, "target": text, "route": route, "kind": kind, "passing": len(passing),
                         "models": len(values), "worst": worst, "mean": mean, "met": met})
    return rows


def _value(kind: str, value: float) -> str:
    """A table cell: R-hat to three decimals, |z| to two, a ratio as ``1.23x``."""
    return {"rhat": f"{value:.3f}", "z": f"{value:.2f}"}.get(kind) or _cell(value, "x", 3)


def targets_table(results: dict) -> list[str]:
    lines = ["| issue | target | route | models passing | worst (against) | geometric mean | verdict |",
             "|---|---|---|---|---|---|---|"]
    for row in evaluate(results):
        model, value, against = row["worst"]
        worst = f"{model} {_value(row['kind'], value)}" + (f" ({against})" if against else "")
        lines.append(f"| {row['issue']} | {row['target']} | `{row['route']}` | {row['passing']} of {row['models']} "
                     f"| {worst} | {_cell(row['mean'], 'x', 2)} | "
                     f"{'met' if row['met'] else '**missed**'} |")
    return lines


def targets_markdown(json_path) -> str:
    """The table for a document's ``<!-- results NAME targets -->`` block."""
    results = _load(json_path)
    if results is None:
        return f"No `{Path(json_path).name}` is committed yet: `./dev bench` writes it.\n"
    commit = str(results["environment"]["git_commit"])[:7]
    return (f"`{Path(json_path).name}` ({results['mode']} mode, commit `{commit}`): "
            "strict ESS per gradient with warm-up counted and per second of total wall time; a peer "
            f"\"converged\" with max R-hat below {CONVERGED_RHAT}.{_chain_note(results)}\n\n"
            + "\n".join(targets_table(results)) + "\n")


def _chain_note(results: dict) -> str:
    """Which samplers ran more chains than the run's setting: per second, where compilation is most of a
    run, more chains are more draws for nearly the same time."""
    usual = results.get("settings", {}).get("num_chains")
    counts: dict[str, set] = {}
    for run in results["runs"]:
        if usual and run["status"] == "ok" and run["metrics"].get("num_chains", usual) != usual:
            counts.setdefault(run["sampler"], set()).add(run["metrics"]["num_chains"])
    more = [f"{name} {max(n)}" + (f" ({min(n)} on some models)" if len(n) > 1 else "")
            for name, n in sorted(counts.items())]
    return (f" Chains: {usual} a sampler, but {', '.join(more)} (their ensembles' adaptation needs them; per "
            "second, where compiling is most of a run, more chains are more draws for about the same time)."
            if more else "")


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        print(targets_markdown(argument))
