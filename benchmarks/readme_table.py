"""Print the README's tables from a benchmark results file.

    ./dev run python -m benchmarks.readme_table benchmarks/results/<name>.json
    ./dev run python -m benchmarks.readme_table --summary ahmc_blackjax benchmarks/results/bench_full.json
    ./dev run python -m benchmarks.readme_table --summary ahmc_blackjax run.json --nuts-from bench_full.json

The first prints every sampler's row; ``--summary SAMPLER`` prints one AHMC
sampler per model against the best NUTS and NumPyro's NUTS (the full run's table).
``--nuts-from OTHER.json`` also counts the NUTS rows of another run with the same
mode, seed, chains and draws toward "best NUTS" (per gradient only: the chains are
the same, so a NUTS run of another day draws the same numbers; per-second ratios
stay within ``run.json``).
"""

import json
import sys

from .report import NUTS  # every NUTS variant (diagonal and dense): the "best NUTS" of a model


def table(path):
    results = json.load(open(path))
    runs = [r for r in results["runs"] if r["status"] == "ok"]
    lines = ["| model | sampler | min ESS/grad | vs best NUTS | x^2: min ESS/grad, vs best NUTS "
             "| min ESS/grad incl. warm-up | min ESS/s | max R-hat |",
             "|---|---|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        best = max((r["metrics"]["ess_per_grad"]["min"] for r in mine if r["sampler"] in NUTS), default=None)
        best_sq = max((r["metrics"].get("ess_per_grad_squares", {}).get("min", 0.0) for r in mine
                       if r["sampler"] in NUTS), default=None)
        for r in mine:
            m = r["metrics"]
            ratio = m["ess_per_grad"]["min"] / best if best else float("nan")
            squares = m.get("ess_per_grad_squares", {}).get("min", float("nan"))
            ratio_sq = squares / best_sq if best_sq else float("nan")
            lines.append(f"| {model} | {r['sampler']} | {m['ess_per_grad']['min']:.3g} | {ratio:.2f}x | "
                         f"{squares:.3g}, {ratio_sq:.2f}x | "
                         f"{m['ess_per_grad_with_warmup']['min']:.3g} | {m['ess_per_second']['min']:.3g} | "
                         f"{m['rhat_max']:.3f} |")
    failed = [r for r in results["runs"] if r["status"] != "ok"]
    for r in failed:
        lines.append(f"| {r['model']} | {r['sampler']} | failed: {str(r.get('error', r.get('reason', '')))[:60]} | | | | | |")
    return "\n".join(lines)


SAME_RUN_SETTINGS = ("num_chains", "num_warmup", "num_samples", "dtype")


def other_nuts(results, path):
    """``{model: {sampler: min ESS/grad}}`` of the NUTS rows in ``path``, a run made like ``results``."""
    other = json.load(open(path))
    differ = [key for key in SAME_RUN_SETTINGS if other["settings"].get(key) != results["settings"].get(key)]
    if other.get("mode") != results.get("mode") or other["environment"].get("seed") != results["environment"].get("seed"):
        differ.append("mode/seed")
    if differ:
        raise SystemExit(f"--nuts-from {path}: not made like the summarized run ({', '.join(differ)} differ)")
    rows: dict = {}
    for r in other["runs"]:
        if r["sampler"] in NUTS and r["status"] == "ok":
            rows.setdefault(r["model"], {})[r["sampler"]] = r["metrics"]["ess_per_grad"]["min"]
    return rows


def summary(path, sampler, nuts_from=None):
    """One row per model: ``sampler`` against the best NUTS (per gradient) and NumPyro's NUTS (per second).

    ``nuts_from``: another run's NUTS rows also count toward the best NUTS (see the module docstring);
    a sampler in both runs counts with this run's row.
    """
    results = json.load(open(path))
    extra = other_nuts(results, nuts_from) if nuts_from else {}
    lines = ["| model | d | min ESS/grad | best NUTS (which) | ratio | min ESS/s vs NumPyro NUTS "
             "| max R-hat | max \\|z\\| (means) |",
             "|---|---|---|---|---|---|---|---|"]
    for model, info in results["models"].items():
        runs = {r["sampler"]: r for r in results["runs"] if r["model"] == model}
        mine = runs.get(sampler)
        if mine is None or mine["status"] != "ok":
            reason = "not run" if mine is None else f"{mine['status']}: {mine.get('reason', '')}"
            lines.append(f"| {model} | {info['dim']} | {reason[:70]} | | | | | |")
            continue
        m = mine["metrics"]
        nuts = dict(extra.get(model, {}))
        nuts.update({name: r["metrics"]["ess_per_grad"]["min"] for name, r in runs.items()
                     if name in NUTS and r["status"] == "ok"})
        best = max(nuts, key=nuts.get) if nuts else None
        numpyro = runs.get("numpyro_nuts")
        per_second = (f"{m['ess_per_second']['min'] / numpyro['metrics']['ess_per_second']['min']:.2f}x"
                      if numpyro is not None and numpyro["status"] == "ok" else "-")
        z = m.get("max_abs_z_reference", m.get("max_abs_z_mean"))
        lines.append(
            f"| {model} | {info['dim']} | {m['ess_per_grad']['min']:.3g} | "
            + (f"{nuts[best]:.3g} ({best}) | {m['ess_per_grad']['min'] / nuts[best]:.2f}x | " if best else "- | - | ")
            + f"{per_second} | {m['rhat_max']:.3f} | {'-' if z is None else f'{z:.2f}'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        print(summary(sys.argv[3], sys.argv[2], sys.argv[5] if sys.argv[4:5] == ["--nuts-from"] else None))
    else:
        print(table(sys.argv[1]))
