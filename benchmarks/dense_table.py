"""Dense against diagonal mass matrices: the table of BENCHMARKS.md, "Dense mass matrix".

    ./dev run python -m benchmarks.dense_table

The diagonal ``ahmc_blackjax`` and the diagonal NUTS come from the full run made before
``shared_num_steps`` became the default (``bench_full_unshared.json``, as the dense runs were), the
dense samplers from ``bench_lr_dense.json`` and ``bench_dense_others.json`` (same seed, settings and
starting points; where a sampler is in several files the full run's record is used).
"""

from __future__ import annotations

import json
from pathlib import Path

from .report import NUTS
from .samplers import DENSE_SAMPLERS

RESULTS = Path(__file__).resolve().parent / "results"
FILES = ("bench_full_unshared.json", "bench_lr_dense.json", "bench_dense_others.json")
MODELS = ("pima", "ripley", "breast_cancer", "std_gauss_10", "diag_gauss_10", "corr_gauss_2", "eight_schools",
          "kidiq", "earnings", "sblrc", "arK", "garch", "gp_pois_regr", "diamonds", "gauss_mix")
NUTS_DENSE = tuple(name for name in NUTS if name in DENSE_SAMPLERS)
NUTS_DIAGONAL = tuple(name for name in NUTS if name not in DENSE_SAMPLERS)


def load_runs(files=FILES) -> tuple[dict, dict]:
    """``{(model, sampler): record}`` over the files (first file wins) and the first file's models."""
    runs, models = {}, None
    for name in files:
        results = json.loads((RESULTS / name).read_text())
        models = models or results["models"]
        for record in results["runs"]:
            if record["status"] == "ok":
                runs.setdefault((record["model"], record["sampler"]), record)
    return runs, models


def table(runs, models) -> list[str]:
    def value(model, sampler):
        record = runs.get((model, sampler))
        return None if record is None else record["metrics"]["ess_per_grad"]["min"]

    def best(model, names):
        return max(((value(model, s), s) for s in names if value(model, s) is not None), default=(None, None))

    lines = ["| model | d | ahmc_blackjax diag | dense | dense / diag | best diagonal NUTS (which) | "
             "best dense NUTS (which) | dense ahmc_blackjax / best NUTS of either kind | "
             "ahmc_numpyro_dense / best | max R-hat diag, dense |", "|---|---|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        diag, dense, numpyro = (value(model, s) for s in ("ahmc_blackjax", "ahmc_blackjax_dense", "ahmc_numpyro_dense"))
        (best_diag, diag_name), (best_dense, dense_name) = best(model, NUTS_DIAGONAL), best(model, NUTS_DENSE)
        top = max(v for v in (best_diag, best_dense) if v is not None)
        rhat = [runs[(model, s)]["metrics"]["rhat_max"] for s in ("ahmc_blackjax", "ahmc_blackjax_dense")]
        lines.append(f"| {model} | {models[model]['dim']} | {diag:.3g} | {dense:.3g} | {dense / diag:.2f}x | "
                     f"{best_diag:.3g} ({diag_name}) | {best_dense:.3g} ({dense_name}) | {dense / top:.2f}x | "
                     f"{numpyro / top:.2f}x | {rhat[0]:.3f}, {rhat[1]:.3f} |")
    return lines


def main():
    print("\n".join(table(*load_runs())))


if __name__ == "__main__":
    main()
