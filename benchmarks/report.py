"""Paper-style report of a benchmark results file: Markdown plus PNG figures beside it.

    ./dev run python -m benchmarks.report benchmarks/results/<name>.json

writes ``<name>_report.md`` and ``<name>_fig*.png`` next to the JSON (the
benchmark run calls this at its end unless ``--no-figures``).  Everything is
read back from the results file (and ``<name>_tuning.npz``, the AHMC tuning
history the run saved), so the report can be rebuilt without sampling again.

What it holds, after Wang, Mohamed & de Freitas (ICML 2013):

* per model, a table like the paper's Table 1: ESS per gradient (= per
  leapfrog step) min / median / max over coordinates, as mean +- sd over the
  chains (each chain's ESS alone), plus the pooled numbers of the main report,
  the gradients per draw and, for AHMC, the arm each chain ended on;
* box plots of those per-chain numbers per model and sampler (Figure 2);
* AHMC against NUTS chain by chain, min (red) / median (blue) / max (black),
  on both axes the same starting point (Figure 3);
* the LGCP latent field: truth, counts, and each sampler's posterior mean and
  variance (Figure 4);
* the tuner's learned reward surface with the arms tried, and a slice of the
  GP with the acquisition (thesis Figures 4.1 and 4.2), for the first AHMC run;
* the open issues' targets on the strict metric, met or missed (benchmarks.targets).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_report", "chain_numbers"]

# Figure 3 pairs: the AHMC and NUTS of the same framework (same backend, same starting points per chain).
PAIRS = (("ahmc_blackjax", "blackjax_nuts"), ("ahmc_numpyro", "numpyro_nuts"), ("ahmc_pymc", "pymc_nuts"),
         ("ahmc_pymc_pooled", "pymc_nuts"),
         ("ahmc_blackjax_dense", "blackjax_nuts_dense"), ("ahmc_numpyro_dense", "numpyro_nuts_dense"),
         ("ahmc_pymc_dense", "pymc_nuts_dense"))
STATS = ("min", "median", "max")


def _ok(results, model=None):
    return [r for r in results["runs"] if r["status"] == "ok" and (model is None or r["model"] == model)]


def _fmt(value, digits=3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}g}"


def chain_numbers(record: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per-chain ESS per gradient: ``{"min", "median", "max"}`` -> array over chains."""
    chains = record["metrics"]["per_chain"]
    return {s: np.array([c["ess_per_grad"][s] for c in chains], dtype=float) for s in STATS}


# --------------------------------------------------------------------------- #
# Tables
# --------------------------------------------------------------------------- #


def _span(values, digits) -> str:
    """``lo-hi`` of the chains' values (one value when they agree)."""
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}g}" if lo == hi else f"{lo:.{digits}g}-{hi:.{digits}g}"


def _arm_cells(record) -> tuple[str, str]:
    """Gradients per draw in sampling, and the tuned arm (step size / L at the last draw, over chains)."""
    per_draw = record["metrics"].get("grads", {}).get("per_draw")
    extra = record.get("extra", {})
    eps, steps = extra.get("final_step_size"), extra.get("final_num_steps")
    arm = f"{_span(eps, 3)} / {_span(steps, 4)}" if eps and steps else "-"
    return _fmt(per_draw), arm


def table1(results, model) -> list[str]:
    """The paper's Table 1 for one model: per-chain ESS/grad, mean +- sd over chains, x 100; then the
    gradients per draw and, for AHMC, the arm the tuner ended on (a chain at ``L = 1`` makes every
    transition a single leapfrog step)."""
    lines = ["| sampler | chains | min | median | max | pooled min / median / max | max R-hat | max \\|z\\| | "
             "grads / draw | final arm: step size / L |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in _ok(results, model):
        per_chain = chain_numbers(r)
        cells = [f"{100 * np.mean(v):.3g} ± {100 * np.std(v, ddof=1) if v.size > 1 else 0:.2g}"
                 for v in (per_chain[s] for s in STATS)]
        m = r["metrics"]
        pooled = " / ".join(_fmt(100 * m["ess_per_grad"][s]) for s in STATS)
        z = m.get("max_abs_z_reference", m.get("max_abs_z_mean"))
        per_draw, arm = _arm_cells(r)
        lines.append(f"| {r['sampler']} | {m['num_chains']} | {' | '.join(cells)} | {pooled} | "
                     f"{_fmt(m['rhat_max'], 4)} | {_fmt(z)} | {per_draw} | {arm} |")
    return lines


# --------------------------------------------------------------------------- #
# Figures
# --------------------------------------------------------------------------- #


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_boxes(results, models):
    """Figure 2: per model (rows) and statistic (columns), box plots over chains of ESS/grad per sampler."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(models), 3, figsize=(12, 2.6 * len(models) + 0.6), squeeze=False,
                             layout="constrained")
    for row, model in enumerate(models):
        runs = _ok(results, model)
        names = [r["sampler"] for r in runs]
        per_chain = [chain_numbers(r) for r in runs]
        for col, stat in enumerate(STATS):
            ax = axes[row, col]
            data = [np.where(np.isfinite(p[stat]), p[stat], np.nan) for p in per_chain]
            data = [d[np.isfinite(d)] for d in data]
            if names:
                ax.boxplot(data, tick_labels=names, showfliers=True)
                ax.tick_params(axis="x", labelrotation=45, labelsize=7)
            ax.set_title(f"{model}: {stat} ESS/grad", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
    return fig


def figure_scatter(results, models):
    """Figure 3: AHMC (y) against NUTS (x) per chain; min red, median blue, max black; diagonal."""
    plt = _pyplot()
    from matplotlib.ticker import NullFormatter

    panels = []
    for model in models:
        runs = {r["sampler"]: r for r in _ok(results, model)}
        for ahmc, nuts in PAIRS:
            if ahmc in runs and nuts in runs and len(runs[ahmc]["metrics"]["per_chain"]) == len(
                    runs[nuts]["metrics"]["per_chain"]):
                panels.append((model, ahmc, nuts, chain_numbers(runs[ahmc]), chain_numbers(runs[nuts])))
    if not panels:
        return None
    columns = min(4, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 3.3 * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (model, ahmc, nuts, a, n) in zip(axes.flat, panels):
        values = []
        for stat, color in zip(STATS, ("red", "blue", "black")):
            ax.scatter(n[stat], a[stat], color=color, s=18, label=stat)
            values += [v for v in (*n[stat], *a[stat]) if np.isfinite(v) and v > 0]
        if values:
            lo, hi = min(values) / 1.5, max(values) * 1.5
            ax.plot([lo, hi], [lo, hi], color="0.5", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            for axis in (ax.xaxis, ax.yaxis):  # decade labels only: minor labels overlap on a log axis
                axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{nuts} ESS/grad", fontsize=8)
        ax.set_ylabel(f"{ahmc} ESS/grad", fontsize=8)
        ax.set_title(model, fontsize=9)
        ax.legend(fontsize=6)
    return fig


def figure_field(results, model):
    """Figure 4: true LGCP field and counts, then each sampler's posterior mean and variance of the field."""
    from .models import get_model

    runs = [r for r in _ok(results, model) if "field" in r["metrics"]]
    if not runs:
        return None
    truth = get_model(model).truth  # the simulation is seeded: the same field as in the run
    grid = truth["grid"]
    plt = _pyplot()
    fig, axes = plt.subplots(len(runs) + 1, 2, figsize=(7, 3.2 * (len(runs) + 1)), squeeze=False,
                             layout="constrained")
    means = [np.asarray(r["metrics"]["field"]["mean"]) for r in runs]
    variances = [np.asarray(r["metrics"]["field"]["var"]) for r in runs]
    lo, hi = min(truth["x"].min(), *(m.min() for m in means)), max(truth["x"].max(), *(m.max() for m in means))
    image = axes[0, 0].imshow(truth["x"].reshape(grid, grid), vmin=lo, vmax=hi, cmap="viridis")
    axes[0, 0].set_title("true latent field x", fontsize=9)
    fig.colorbar(image, ax=axes[0, 0])
    image = axes[0, 1].imshow(truth["y"].reshape(grid, grid), cmap="Greys")
    axes[0, 1].set_title(f"counts y ({int(truth['y'].sum())} points)", fontsize=9)
    fig.colorbar(image, ax=axes[0, 1])
    vmax = max(v.max() for v in variances)
    for row, (r, mean, var) in enumerate(zip(runs, means, variances), start=1):
        image = axes[row, 0].imshow(mean.reshape(grid, grid), vmin=lo, vmax=hi, cmap="viridis")
        axes[row, 0].set_title(f"{r['sampler']}: posterior mean", fontsize=9)
        fig.colorbar(image, ax=axes[row, 0])
        image = axes[row, 1].imshow(var.reshape(grid, grid), vmin=0, vmax=vmax, cmap="magma")
        axes[row, 1].set_title(f"{r['sampler']}: posterior variance", fontsize=9)
        fig.colorbar(image, ax=axes[row, 1])
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    return fig


def load_tuning(path: Path):
    """The TuningHistory saved by the run (``<name>_tuning.npz``) and the options it ran with."""
    from ahmc.adapters.diagnostics import history_from_blackjax

    with np.load(path) as saved:
        info = {key[len("info_"):]: saved[key] for key in saved.files if key.startswith("info_")}
        if "chains_first" not in saved.files:  # runs before 2026-12-02 saved (iterations, chains)
            info = {key: value.T if value.ndim == 2 else value for key, value in info.items()}
        box = (saved["step_size_box"], saved["num_steps_box"])
        options = json.loads(str(saved["options"]))
    known = ("capacity", "lengthscale", "noise_variance", "alpha", "delta", "schedule", "k", "decay",
             "num_step_sizes", "max_integration_time", "step_size_factors", "metric_fraction", "round_length",
             "adapt_mass_matrix", "log_step_size")
    options = {k: v for k, v in options.items() if k in known}
    return history_from_blackjax(info, search_box=box, **options)


def figure_tuning(path: Path, title: str):
    """Thesis Figures 4.1 and 4.2: reward surface with the arms, and a GP slice with the acquisition."""
    from ahmc.adapters.plots import plot_reward_surface, plot_surrogate_slice

    history = load_tuning(path)
    plt = _pyplot()
    fig = plt.figure(figsize=(12, 4.8), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=(1.1, 1))
    plot_reward_surface(history, tuner=0, ax=left.subplots())
    plot_surrogate_slice(history, along="step_size", tuner=0, axes=right.subplots(2, 1, sharex=True,
                                                                                   height_ratios=(2, 1)))
    fig.suptitle(title, fontsize=10)
    return fig


# --------------------------------------------------------------------------- #
# The report
# --------------------------------------------------------------------------- #


def _save_small_png(fig, path: Path) -> None:
    """The figure as a 256-colour PNG: plots need no more, and the committed results stay small
    (tests/test_docs.py bounds them; a scatter of many arms saved in RGBA took 380 kB)."""
    import io

    from PIL import Image  # matplotlib's own dependency

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=90, format="png")
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    image.save(path, optimize=True)


def write_report(json_path: str | Path) -> Path:
    """Write ``<stem>_report.md`` and its PNG figures beside ``json_path``; returns the Markdown path."""
    json_path = Path(json_path)
    results = json.loads(json_path.read_text())
    stem, folder = json_path.stem, json_path.parent
    env, settings = results["environment"], results["settings"]
    plt = _pyplot()

    def save(fig, suffix) -> str | None:
        if fig is None:
            return None
        name = f"{stem}_{suffix}.png"
        _save_small_png(fig, folder / name)
        plt.close(fig)
        return name

    complete = results.get("complete", False)
    missing: dict[str, list[str]] = {}
    if not complete:  # an interrupted run: report the models that started, and what did not run
        started = {r["model"] for r in results["runs"]}
        for model in results["models"]:
            ran = {r["sampler"] for r in results["runs"] if r["model"] == model}
            missing[model] = [name for name in settings["samplers"] if name not in ran]
        results["models"] = {m: info for m, info in results["models"].items() if m in started}
        not_started = [m for m in settings["models"] if m not in started]
        from .run import markdown_report

        json_path.with_suffix(".md").write_text(markdown_report(results) + "\n")
    from .headline import earlier_note
    from .targets import targets_table
    from .run import _total_s

    models = list(results["models"])
    lines = [
        f"# Benchmark report: AHMC against NUTS ({results['mode']} mode)",
        "",
        f"Command: `{env['command']}` ({env['date_utc']}, seed {env['seed']}, {settings['dtype']}, "
        f"{settings['num_chains']} chains per sampler except ChEES and MEADS), on {env['cpu_model']} with "
        f"{env['nproc']} CPU cores shared with other jobs; git {str(env['git_commit'])[:10]}. "
        + (f"Total {_total_s(results) / 60:.0f} min.{earlier_note(results)}" if complete else
           "**The run was interrupted**: models not started: "
           f"{', '.join(not_started) or 'none'}; samplers that did not run are listed under each model."),
        "",
        f"Numbers: `{json_path.name}`; the full per-run table (ESS/s, compile times, divergences) is "
        f"`{json_path.with_suffix('.md').name}`. ESS per gradient = bulk ESS (ArviZ) per leapfrog step of the "
        "sampling phase, the paper's ESS/L. Per chain: each chain's ESS over its own gradients. "
        f"ChEES runs {_chees_chains(results)}; its ESS pools them and its gradients count them all. MEADS "
        "(BlackJAX's generalized HMC, one gradient per iteration) runs as many chains, in 4 folds. Adjusted MCLMC "
        "(BlackJAX's Metropolis-adjusted microcanonical sampler) tunes each chain in the warm-up's iterations and "
        "counts two gradients per integration step.",
        "",
        "## The open issues' targets, met or missed",
        "",
        "Strict ESS (min over coordinates of min(bulk ESS of x, of (x - mean)^2)) per gradient with warm-up "
        "counted and per second of total wall time; the tables below use the paper's ESS per sampling gradient.",
        "",
        *targets_table(results),
        "",
        "Why each miss, by how much on which model, and what was tried: docs/benchmarks.md, \"Known misses\", "
        "and docs/decisions.md.",
        "",
        "## Per model: ESS per gradient x 100, mean ± sd over chains (as the paper's Table 1)",
        "",
        "The last two columns: leapfrog steps per draw in sampling, and for AHMC the arm each chain ran at "
        "its last draw (one value when the chains agree, else their range). `L` is the largest number of "
        "steps of a transition, which draws its steps uniformly from 1 to `L`; at `L = 1` every transition is "
        "a single leapfrog step.",
        "",
    ]
    for model in models:
        info = results["models"][model]
        lines += [f"### {model}: {info['description']} (d = {info['dim']}, {info['num_warmup']} warm-up + "
                  f"{info['num_samples']} draws per chain)", "", *table1(results, model)]
        skipped = [r for r in results["runs"] if r["model"] == model and r["status"] != "ok"]
        for r in skipped:
            lines.append(f"\n{r['sampler']}: {r['status']} ({r['reason'].splitlines()[0][:200]})")
        if missing.get(model):
            lines.append(f"\nNot run (the run was interrupted): {', '.join(missing[model])}.")
        lines.append("")

    lines += ["## Figures", ""]
    for index in range(0, len(models), 6):
        chunk = models[index:index + 6]
        name = save(figure_boxes(results, chunk), f"fig2_boxes_{index // 6 + 1}")
        lines += [f"Per-chain ESS per gradient (min / median / max over coordinates), {', '.join(chunk)} "
                  "(the paper's Figure 2):", "", f"![boxes]({name})", ""]
    name = save(figure_scatter(results, models), "fig3_ahmc_vs_nuts")
    if name:
        lines += ["AHMC against NUTS of the same framework, one glyph per chain and statistic; above the diagonal "
                  "AHMC is better (the paper's Figure 3):", "", f"![scatter]({name})", ""]
    for model in models:
        if model.startswith("lgcp"):
            name = save(figure_field(results, model), f"fig4_{model}_field")
            if name:
                lines += [f"{model}: the true latent field and counts (top), each sampler's posterior mean "
                          "and variance of the field (the paper's Figure 4):", "", f"![field]({name})", ""]
    tuning = results.get("tuning")
    if tuning and (folder / tuning["file"]).exists():
        title = f"{tuning['sampler']} on {tuning['model']}: learned reward surface and GP slice (pooled tuner)"
        name = save(figure_tuning(folder / tuning["file"], title), "fig_tuning")
        lines += [f"What the tuner learned on {tuning['model']} ({tuning['sampler']}, whole run): the GP mean "
                  "reward over the box with the arms tried (thesis Figure 4.1) and a slice at the chosen L with "
                  "the UCB acquisition (thesis Figure 4.2):", "", f"![tuning]({name})", ""]
    path = folder / f"{stem}_report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _chees_chains(results) -> str:
    """How many chains ChEES ran: "16 chains", or the exceptions by model (fewer where memory is short)."""
    counts = {r["model"]: r.get("extra", {}).get("num_chains") for r in results["runs"]
              if r["sampler"] == "chees" and r["status"] == "ok"}
    usual = max((n for n in counts.values() if n), default=16)
    fewer = [f"{n} on {model}" for model, n in counts.items() if n and n < usual]
    return (f"{usual} chains (its adaptation needs an ensemble"
            + (f"; {', '.join(fewer)}, where {usual} chains' draws would not fit in memory" if fewer else "") + ")")


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        print(write_report(argument))
