"""R-hat at an equal gradient budget: the AHMC runs of a benchmark file whose max R-hat is >= 1.01,
re-run with as many draws as the best NUTS's sampling gradients buy them.

    ./dev run python -m benchmarks.rhat_budget plan benchmarks/results/bench_full_refresh.json
    ./dev run python -m benchmarks.rhat_budget table benchmarks/results/bench_full_refresh.json OUT.json ...

The benchmark compares samplers at equal numbers of draws.  AHMC's draws cost fewer gradients than
NUTS's (2-4x on the models where its R-hat misses 1.01), so at equal draws it has less ESS, which is
what R-hat follows.  ``plan`` prints, for each such run, the ``benchmarks.run`` command that repeats
it with the same seed and warm-up (so the same warm-up, then more draws) and ``ceil(N g_NUTS / g_AHMC)``
draws, where ``g`` are the sampling gradients of the AHMC run and of the best NUTS per gradient on
that model (the report's "best NUTS") over the ``N`` draws of the file.  ``table`` puts those runs
beside the file's: R-hat and min ESS at equal draws and at the equal budget, and NUTS's.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from .report import AHMC, NUTS, _best

THRESHOLD = 1.01


def _ok(runs):
    return [r for r in runs if r.get("status") == "ok"]


def budget_draws(ahmc_run, nuts_run) -> int:
    """Draws per chain for which ``ahmc_run``'s sampling gradients match ``nuts_run``'s."""
    per_draw = ahmc_run["metrics"]["grads"]["sampling"] / ahmc_run["num_samples"]
    return math.ceil(nuts_run["metrics"]["grads"]["sampling"] / per_draw)


def best_nuts(runs, model):
    """The report's best NUTS on ``model``: its run with the largest min ESS per gradient (None if none)."""
    here = [r for r in _ok(runs) if r["model"] == model]
    _, name = _best(here, NUTS)
    return next((r for r in here if r["sampler"] == name), None)


def plan(results) -> list[dict]:
    """One entry per AHMC run with max R-hat >= 1.01 that has a NUTS run beside it."""
    entries = []
    for run in _ok(results["runs"]):
        if run["sampler"] not in AHMC or run["metrics"]["rhat_max"] < THRESHOLD:
            continue
        nuts = best_nuts(results["runs"], run["model"])
        if nuts is None:
            continue
        draws = budget_draws(run, nuts)
        command = (f"./dev bench --full --models {run['model']} --samplers {run['sampler']} "
                   f"--num-warmup {run['num_warmup']} --num-samples {draws} --seed {results['environment']['seed']} "
                   f"--no-figures --output benchmarks/results/rhat_budget_<name>.json")
        entries.append({"model": run["model"], "sampler": run["sampler"], "nuts": nuts["sampler"],
                        "draws": draws, "command": command, "run": run, "nuts_run": nuts})
    return entries


def table(results, budget_files) -> str:
    budget = {}
    for path in budget_files:
        for run in _ok(json.loads(Path(path).read_text())["runs"]):
            budget[run["model"], run["sampler"]] = run
    lines = ["| model | sampler | draws: equal / equal budget | sampling gradients at the budget / NUTS's | "
             "max R-hat: equal draws / equal budget | min ESS: equal draws / equal budget | "
             "best NUTS: draws, max R-hat, min ESS |",
             "|---|---|---|---|---|---|---|"]
    for entry in plan(results):
        key = entry["model"], entry["sampler"]
        run, nuts, again = entry["run"], entry["nuts_run"], budget.get(key)
        m, n = run["metrics"], nuts["metrics"]
        if again:
            spent = again["metrics"]["grads"]["sampling"] / n["grads"]["sampling"]
            at_budget = (f"{again['num_samples']} | {spent:.3f}x | {m['rhat_max']:.3f} / "
                         f"**{again['metrics']['rhat_max']:.3f}** | {m['ess_bulk']['min']:.0f} / "
                         f"{again['metrics']['ess_bulk']['min']:.0f}")
        else:
            at_budget = f"(not run: {entry['draws']}) | - | {m['rhat_max']:.3f} / - | {m['ess_bulk']['min']:.0f} / -"
        lines.append(f"| {key[0]} | {key[1]} | {run['num_samples']} / {at_budget} | "
                     f"{entry['nuts']}: {nuts['num_samples']}, {n['rhat_max']:.3f}, {n['ess_bulk']['min']:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] not in ("plan", "table"):
        raise SystemExit(__doc__)
    results = json.loads(Path(argv[1]).read_text())
    if argv[0] == "plan":
        for entry in plan(results):
            print(f"# {entry['model']} / {entry['sampler']}: {entry['draws']} draws = {entry['nuts']}'s sampling gradients")
            print(entry["command"])
    else:
        print(table(results, argv[2:]))


if __name__ == "__main__":
    main()
