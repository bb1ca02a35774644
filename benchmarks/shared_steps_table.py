"""Shared step counts across chains: the tables of BENCHMARKS.md, "Shared step counts across chains".

    ./dev run python -m benchmarks.shared_steps_table          # three seeds, four models
    ./dev run python -m benchmarks.shared_steps_table --full   # seed 0, every model of the full run

Reads the per-seed files of two ``benchmarks.seeds`` studies that differ only in
``shared_num_steps`` (``shared_steps_seeds_off_seed{s}.json``, ``shared_steps_seeds_on_seed{s}.json``).
ESS per second is taken as a ratio to NumPyro's NUTS of the same run, which cancels part of the
machine's drift between the two studies.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("pima", "breast_cancer", "lgcp_16", "stochastic_volatility")
SAMPLERS = ("ahmc_blackjax", "ahmc_numpyro")
SEEDS = (0, 1, 2)


def _runs(tag: str, seed: int) -> dict:
    data = json.loads((RESULTS / f"shared_steps_seeds_{tag}_seed{seed}.json").read_text())
    return {(r["model"], r["sampler"]): r for r in data["runs"] if r["status"] == "ok"}


def rows() -> list[dict]:
    runs = {(tag, s): _runs(tag, s) for tag in ("off", "on") for s in SEEDS}
    out = []
    for model in MODELS:
        for sampler in SAMPLERS:
            row = {"model": model, "sampler": sampler}
            for tag in ("off", "on"):
                mine = [runs[(tag, s)][(model, sampler)] for s in SEEDS]
                nuts = [runs[(tag, s)][(model, "numpyro_nuts")] for s in SEEDS]
                row[tag] = {
                    "ess_per_grad": [r["metrics"]["ess_per_grad"]["min"] for r in mine],
                    "ess_per_second_vs_nuts": [r["metrics"]["ess_per_second"]["min"] / n["metrics"]["ess_per_second"]["min"]
                                               for r, n in zip(mine, nuts)],
                    "sampling_s": [r["timing"]["sampling_s"] for r in mine],
                    "rhat_max": [r["metrics"]["rhat_max"] for r in mine],
                }
            out.append(row)
    return out


def markdown(table: list[dict]) -> str:
    lines = ["| model | sampler | min ESS/grad, off / on (mean) | min ESS/s / NumPyro NUTS's, off / on, per seed | "
             "mean, off / on | sampling s, off / on (mean) | max R-hat, off / on |",
             "|---|---|---|---|---|---|---|"]
    for row in table:
        off, on = row["off"], row["on"]
        seeds = ", ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(off["ess_per_second_vs_nuts"], on["ess_per_second_vs_nuts"]))
        lines.append(
            f"| {row['model']} | {row['sampler']} | {np.mean(off['ess_per_grad']):.3g} / {np.mean(on['ess_per_grad']):.3g} | "
            f"{seeds} | {np.mean(off['ess_per_second_vs_nuts']):.2f} / {np.mean(on['ess_per_second_vs_nuts']):.2f} | "
            f"{np.mean(off['sampling_s']):.3g} / {np.mean(on['sampling_s']):.3g} | "
            f"{max(off['rhat_max']):.3f} / {max(on['rhat_max']):.3f} |")
    return "\n".join(lines)


def full_markdown() -> str:
    """Every model of the full run: ``bench_full_unshared.json`` (off; the full run before sharing became
    the default) against ``shared_steps_full.json`` (on), seed 0.

    ESS per gradient of the off arm is what a re-run reproduces exactly; ESS per second is a ratio to
    NumPyro's NUTS of the same run in each file."""
    unshared = json.loads((RESULTS / "bench_full_unshared.json").read_text())["runs"]
    off = {(r["model"], r["sampler"]): r for r in unshared if r["status"] == "ok"}
    on = {(r["model"], r["sampler"]): r for r in json.loads((RESULTS / "shared_steps_full.json").read_text())["runs"]
          if r["status"] == "ok"}
    models = list(dict.fromkeys(model for model, _ in on))
    lines = ["| model | sampler | min ESS/grad, off / on | min ESS/s / NumPyro NUTS's, off / on | sampling s, off / on "
             "| max R-hat, off / on |", "|---|---|---|---|---|---|"]
    for model in models:
        for sampler in SAMPLERS:
            if (model, sampler) not in on or (model, sampler) not in off:
                continue
            a, b = off[(model, sampler)], on[(model, sampler)]
            na, nb = off[(model, "numpyro_nuts")], on[(model, "numpyro_nuts")]
            per_s = [x["metrics"]["ess_per_second"]["min"] / n["metrics"]["ess_per_second"]["min"]
                     for x, n in ((a, na), (b, nb))]
            lines.append(
                f"| {model} | {sampler} | {a['metrics']['ess_per_grad']['min']:.3g} / {b['metrics']['ess_per_grad']['min']:.3g} | "
                f"{per_s[0]:.2f} / {per_s[1]:.2f} | {a['timing']['sampling_s']:.3g} / {b['timing']['sampling_s']:.3g} | "
                f"{a['metrics']['rhat_max']:.3f} / {b['metrics']['rhat_max']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(full_markdown() if "--full" in sys.argv[1:] else markdown(rows()))
