"""The headline tables on the strict metric, written into the README and docs/benchmarks.md.

    ./dev run python -m benchmarks.headline benchmarks/results/bench_quick.json [more.json ...]

The strict ESS of a run is the minimum over coordinates of the smaller of the bulk ESS of ``x`` and
of ``(x - mean)^2``. Per gradient it is divided by every gradient of the run, warm-up included;
per second by the run's total wall time: compilation, warm-up and sampling. Each AHMC route is
compared with the best peer of its framework in the same run: NumPyro's NUTS in the better of its
two chain methods for the JAX routes, PyMC's NUTS and nutpie for the PyMC routes, and the best of
every NUTS per gradient; a line under each table gives the per-gradient ratio against the best of every
sampler that converged, ChEES, MEADS and adjusted MCLMC included.

A document marks where a run's tables go with ``<!-- results NAME -->`` and ``<!-- /results -->``
lines, NAME the results file's stem (``bench_quick``); ``<!-- results NAME summary -->`` asks for one
table with a row per route (the README's), ``<!-- results NAME targets -->`` for the open issues' targets
met or missed (benchmarks.targets). The benchmark rewrites what lies between
(``update_documents``), so no number in the docs is typed by hand.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "benchmarks.md")
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"(<!-- results (\w+)( summary| targets)? -->\n)(.*?)(<!-- /results -->)", re.S)

# (AHMC route, the peers it is measured against per second); per gradient the peer is every NUTS.
ROUTES = {
    "ahmc_numpyro": ("numpyro_nuts", "numpyro_nuts_vectorized"),
    "ahmc_blackjax": ("numpyro_nuts", "numpyro_nuts_vectorized", "blackjax_nuts"),
    "ahmc_pymc": ("pymc_nuts", "nutpie"),
    "ahmc_pymc_jax": ("pymc_nuts", "nutpie", "pymc_numpyro", "pymc_numpyro_vectorized"),
}
# How a user calls each route (the README's summary names them so).
ROUTE_CALLS = {"ahmc_numpyro": "NumPyro `AdaptiveHMC`", "ahmc_blackjax": "BlackJAX `run_chains`",
               "ahmc_pymc": "PyMC step `AdaptiveHMC`", "ahmc_pymc_jax": "PyMC `sample_numpyro_ahmc`"}
ALL_NUTS = ("numpyro_nuts", "numpyro_nuts_vectorized", "blackjax_nuts", "pymc_nuts", "nutpie", "pymc_numpyro",
            "pymc_numpyro_vectorized",
            # the dense variants, run by name only (benchmarks.samplers.DENSE_SAMPLERS)
            "blackjax_nuts_dense", "numpyro_nuts_dense", "pymc_nuts_dense", "nutpie_low_rank")
# Per gradient the posterior is the same in every framework, so each route also faces every other sampler
# that converged (ChEES, MEADS, adjusted MCLMC, every NUTS): a run whose max R-hat reaches this is left out.
CONVERGED_RHAT = 1.01


def strict_ess(record: dict) -> float:
    metrics = record["metrics"]
    return min(metrics["ess_bulk"]["min"], metrics.get("ess_bulk_squares", {}).get("min", math.inf))


def total_wall_s(record: dict) -> float:
    timing = record["timing"]
    return timing.get("compile_s", 0.0) + timing["warmup_s"] + timing["sampling_s"]


def per_gradient(record: dict) -> float:
    grads = record["metrics"]["grads"]
    return strict_ess(record) / (grads["warmup"] + grads["sampling"])


def per_second(record: dict) -> float:
    return strict_ess(record) / total_wall_s(record)


def run_us_per_gradient(record: dict) -> float:
    """Microseconds of running (warm-up and sampling, compilation left out) per gradient: the cost of an
    iteration at a given number of gradients, tuner and loop included."""
    grads = record["metrics"]["grads"]
    timing = record["timing"]
    return 1e6 * (timing["warmup_s"] + timing["sampling_s"]) / max(grads["warmup"] + grads["sampling"], 1)


def _runs(results: dict) -> dict:
    return {(r["model"], r["sampler"]): r for r in results["runs"] if r["status"] == "ok"}


def _best(runs: dict, model: str, names, score) -> tuple[float | None, str | None]:
    scored = [(score(runs[model, n]), n) for n in names if (model, n) in runs]
    scored = [s for s in scored if math.isfinite(s[0])]
    return max(scored) if scored else (None, None)


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine is not None and theirs else None


def _cell(value, suffix="", digits=3) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}g}{suffix}"


def _geomean(values) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def route_rows(results: dict, route: str) -> list[dict]:
    """One row per model where ``route`` ran: its strict figures and ratios against its peers."""
    runs, rows = _runs(results), []
    for model in results["models"]:
        if (model, route) not in runs:
            continue
        mine = runs[model, route]
        peer_s, peer = _best(runs, model, ROUTES[route], per_second)
        nuts_g, nuts = _best(runs, model, ALL_NUTS, per_gradient)
        peer_compile = runs[model, peer]["timing"].get("compile_s") if peer else None
        peer_us = run_us_per_gradient(runs[model, peer]) if peer else None
        rows.append({"model": model, "dim": results["models"][model]["dim"],
                     "per_second": per_second(mine), "peer": peer, "peer_per_second": peer_s,
                     "ratio_second": _ratio(per_second(mine), peer_s),
                     "per_gradient": per_gradient(mine), "nuts": nuts, "nuts_per_gradient": nuts_g,
                     "ratio_gradient": _ratio(per_gradient(mine), nuts_g),
                     "compile_s": mine["timing"].get("compile_s"), "peer_compile_s": peer_compile,
                     "us_per_gradient": run_us_per_gradient(mine), "peer_us_per_gradient": peer_us,
                     "rhat": mine["metrics"]["rhat_max"]})
    return rows


def is_peer(sampler: str) -> bool:
    """Every sampler that is not one of ahmc's own (its routes and ARMHMC)."""
    return not sampler.startswith("ahmc") and sampler != "armhmc"


def every_peer_ratios(results: dict, route: str) -> tuple[list[float], list[str]]:
    """``route``'s strict ESS per gradient over the best converged sampler of any kind, per model, and the
    models where it is behind (``"pima 0.72x (chees)"``)."""
    runs, ratios, losses = _runs(results), [], []
    for model in results["models"]:
        if (model, route) not in runs:
            continue
        peers = [name for (m, name), run in runs.items()
                 if m == model and is_peer(name) and run["metrics"]["rhat_max"] < CONVERGED_RHAT]
        best, name = _best(runs, model, peers, per_gradient)
        ratio = _ratio(per_gradient(runs[model, route]), best)
        if ratio is not None:
            ratios.append(ratio)
            if ratio < 1:
                losses.append(f"{model} {ratio:.2f}x ({name})")
    return ratios, losses


def every_peer_line(results: dict, route: str) -> str:
    """One sentence: ``route``'s strict ESS per gradient against the best converged sampler of any kind."""
    ratios, losses = every_peer_ratios(results, route)
    if not ratios:
        return ""
    return (f"Per gradient against every sampler that converged (max R-hat < {CONVERGED_RHAT}; ChEES, MEADS and "
            f"adjusted MCLMC included): geometric mean {_cell(_geomean(ratios), 'x', 2)}, "
            + (f"behind on {len(losses)} of {len(ratios)}: {', '.join(losses)}." if losses
               else f"ahead on all {len(ratios)}."))


def _route_means(rows: list[dict]):
    """``(per second, per gradient, models behind per second)``: a route's geometric-mean ratios over its rows."""
    second, gradient = (_geomean(r[k] for r in rows) for k in ("ratio_second", "ratio_gradient"))
    behind = [f"{r['model']} {r['ratio_second']:.2f}x" for r in rows
              if r["ratio_second"] is not None and r["ratio_second"] < 1]
    return second, gradient, behind


def route_table(results: dict, route: str) -> list[str]:
    rows = route_rows(results, route)
    if not rows:
        return []
    lines = [f"**{route}**", "",
             "| model | d | strict ESS/s | best peer per second | ratio | strict ESS/grad | best NUTS per gradient "
             "| ratio | compile s (peer) | run µs/grad (peer) | max R-hat |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['dim']} | {_cell(r['per_second'])} | {_cell(r['peer_per_second'])} ({r['peer']}) "
            f"| {_cell(r['ratio_second'], 'x', 2)} | {_cell(r['per_gradient'])} | "
            f"{_cell(r['nuts_per_gradient'])} ({r['nuts']}) | {_cell(r['ratio_gradient'], 'x', 2)} | "
            f"{_cell(r['compile_s'], '', 2)} ({_cell(r['peer_compile_s'], '', 2)}) | "
            f"{_cell(r['us_per_gradient'], '', 2)} ({_cell(r['peer_us_per_gradient'], '', 2)}) | {r['rhat']:.3f} |")
    second, gradient, losses = _route_means(rows)
    lines += ["", f"Geometric mean: {_cell(second, 'x', 2)} per second, {_cell(gradient, 'x', 2)} per gradient. "
              + (f"Behind its peer per second on {len(losses)} of {len(rows)}: {', '.join(losses)}."
                 if losses else f"Ahead of its peer per second on all {len(rows)} models."), ""]
    every = every_peer_line(results, route)
    return lines + ([every, ""] if every else [])


_MISSING = "No `{name}` is committed yet: `./dev bench` writes it.\n"


def _load(json_path) -> dict | None:
    """A results file's contents, or None where none is committed."""
    json_path = Path(json_path)
    return json.loads(json_path.read_text()) if json_path.exists() else None


def headline_markdown(json_path: Path) -> str:
    """The tables of one results file (or a line saying none is committed)."""
    return _render(json_path, _tables)


def summary_markdown(json_path) -> str:
    """One table, a row per route: the geometric means of :func:`route_table` and the models behind."""
    return _render(json_path, _summary)


def _render(json_path, render) -> str:
    results = _load(json_path)
    return _MISSING.format(name=Path(json_path).name) if results is None else render(json_path, results)


def _tables(json_path, results: dict) -> str:
    lines = [f"{_run_line(json_path, results)}; `{_command(results['environment']['command'])}`. "
             "Strict ESS: min over coordinates of min(bulk ESS of x, of (x - mean)^2); per gradient with "
             "warm-up counted, per second of total wall time with compilation. Run µs/grad: the run's time "
             "without compilation over its gradients, beside the per-second peer's."
             + earlier_note(results), ""]
    for route in ROUTES:
        lines += route_table(results, route)
    return "\n".join(lines).rstrip() + "\n"


def _run_line(json_path, results: dict) -> str:
    """Which run a table is from: file, mode, date, commit, seed, chains and draws, precision, machine."""
    env, settings = results["environment"], results["settings"]
    return (f"`{Path(json_path).name}`: {results['mode']} mode, {str(env['date_utc'])[:10]}, commit "
            f"`{str(env['git_commit'])[:7]}`, seed {env['seed']}, {settings['num_chains']} chains x "
            f"({settings['num_warmup']} warm-up + {settings['num_samples']} draws), {settings['dtype']}, "
            f"{env['cpu_model']} with {env['nproc']} cores")


def _command(command: str) -> str:
    return re.sub(r"\S*/benchmarks/results/", "benchmarks/results/", command)


def made_by(env) -> dict:
    """Where and when a run record is made, kept in it (``record["made"]``): a file resumed over
    several invocations (``--resume``) can then say which runs were timed on which machine and commit."""
    return {key: env.get(key) for key in ("date_utc", "git_commit", "git_dirty", "cpu_model")}


def earlier_note(results) -> str:
    """For a file that keeps runs of earlier invocations (``--resume``): which runs each invocation made
    (from ``record["made"]``), or, for records older than that field, the earlier invocations' commands."""
    earlier = results["environment"].get("earlier_invocations") or []
    if not earlier:
        return ""
    runs = [run for run in results.get("runs", []) if run.get("status") == "ok"]
    if not runs or any("made" not in run for run in runs):
        return "".join(
            f" Resumed (`--resume`) from `{_command(item['command'])}` ({_origin(item)}), whose finished runs "
            "are kept." for item in earlier)
    groups: dict[str, list] = {}
    for run in runs:
        groups.setdefault(_origin(run["made"]), []).append(run)
    by_time = sorted(groups.items(), key=lambda item: min(str(run["made"].get("date_utc")) for run in item[1]))
    parts = [f"{origin}: {_which_runs(group, runs)}" for origin, group in by_time]
    return " Resumed (`--resume`) across invocations; the runs each made: " + "; ".join(parts) + "."


def _origin(made: dict) -> str:
    """``2026-12-05, git a7b10a693c dirty, Intel(R) Xeon(R) Processor``: date, commit, machine."""
    return (f"{str(made.get('date_utc'))[:10]}, git {str(made.get('git_commit'))[:10]}"
            f"{' dirty' if made.get('git_dirty') else ''}{', ' + made['cpu_model'] if made.get('cpu_model') else ''}")


def _which_runs(group: list, runs: list) -> str:
    """The models of ``group`` (a model whose runs it holds only in part: with those samplers)."""
    names = []
    for model in dict.fromkeys(run["model"] for run in group):
        mine = [run["sampler"] for run in group if run["model"] == model]
        every = [run["sampler"] for run in runs if run["model"] == model]
        names.append(model if len(mine) == len(every) else f"{model} ({', '.join(mine)})")
    return ", ".join(names)


def _summary(json_path, results: dict) -> str:
    lines = [f"{_run_line(json_path, results)}. Strict ESS (min over coordinates of min(bulk ESS of x, of "
             "(x - mean)^2)) per second of total wall time, compilation included, and per gradient, warm-up "
             "included, against the best peer of each route's framework in the same run; geometric means over "
             "the run's models (every model: docs/benchmarks.md).", "",
             "| route | per second vs best peer | behind per second | per gradient vs best NUTS "
             "| per gradient vs best converged sampler (ChEES, MEADS, MCLMC too) | max R-hat |",
             "|---|---|---|---|---|---|"]
    for route in ROUTES:
        rows = route_rows(results, route)
        if not rows:
            continue
        second, gradient, behind = _route_means(rows)
        ratios, losses = every_peer_ratios(results, route)
        lines.append(f"| {ROUTE_CALLS[route]} (`{route}`) | {_cell(second, 'x', 2)} | {len(behind)} of {len(rows)}"
                     + (f": {', '.join(behind)}" if behind else "") + f" | {_cell(gradient, 'x', 2)} | "
                     f"{_cell(_geomean(ratios), 'x', 2)}, behind on {len(losses)} of {len(ratios)} | "
                     f"{max(r['rhat'] for r in rows):.3f} |")
    return "\n".join(lines) + "\n"


def rewrite(text: str, results_dir: Path = RESULTS) -> str:
    """``text`` with every marked block replaced by its results file's tables (or summary, or targets)."""
    from .targets import targets_markdown

    render = {" summary": summary_markdown, " targets": targets_markdown}

    def block(m):
        path = results_dir / f"{m.group(2)}.json"
        return m.group(1) + render.get(m.group(3), headline_markdown)(path) + m.group(5)

    return MARKER.sub(block, text)


def update_documents(documents=DOCUMENTS, results_dir: Path = RESULTS) -> list[Path]:
    changed = []
    for path in documents:
        text = path.read_text()
        new = rewrite(text, results_dir)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        print(headline_markdown(Path(argument)))
    print("updated:", *update_documents())
