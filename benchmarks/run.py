"""Run the benchmark: every selected sampler on every selected model; write JSON + Markdown.

    ./dev run python -m benchmarks.run                       # quick mode (all models, all samplers)
    ./dev run python -m benchmarks.run --full
    ./dev run python -m benchmarks.run --models pima,ripley --samplers blackjax_nuts,numpyro_nuts
    ./dev run python -m benchmarks.run --output runs/nuts_quick.json --seed 0

Per (model, sampler): ``--chains`` chains (4) from the same starting points
(``init + Uniform(-2, 2)``) and the same PRNG key for every sampler,
``--num-warmup`` warm-up and ``--num-samples`` kept draws per chain (1000 and
1000; the quick mode may use fewer for expensive models, and the report says
so).  JAX runs in float64 unless ``--float32``.  A sampler that raises (a
missing package included) is recorded as failed with the reason, and the run
goes on.  The JSON holds every number (``benchmarks/metrics.py``) and the
environment; the Markdown report next to it (same name, ``.md``) is also
printed.

Modes: the quick default (about 10-15 minutes for every sampler on a quiet
2-core machine) runs the three logistic regressions, the three Gaussians and
the LGCP on a 16 x 16 grid, all at 1000 + 1000; ``--full`` adds the nine
posteriordb posteriors (scored against their reference means), stochastic
volatility (d = 1003) and the LGCP on the paper's 64 x 64 grid (4096 cells, d = 16384 by circulant embedding).  A model can set ``Model.quick_draws`` to
run shorter in quick mode, and ``Model.full_draws`` to run longer in full mode (stochastic
volatility: 2000 + 8000 for every sampler, where 1000 + 1000 converges for none; the 64 x 64 LGCP:
1000 + 4000, where no sampler's R-hat over 16384 coordinates stayed below 1.01); the report says so.  PyMC samplers run only
on models with a PyMC version (``models.PYMC_MODEL_NAMES``); elsewhere they are
recorded as skipped.  The JSON is rewritten after every run, so an interrupted
run keeps what finished; at the end ``benchmarks/report.py`` writes the
paper-style report with figures beside it (``--no-figures`` to skip).

Samplers are registered in ``benchmarks.samplers.SAMPLERS`` and models in
``benchmarks.models.MODELS``; ``--list`` prints both.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
import zlib
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .metrics import summarize
from .models import MODELS, PYMC_MODEL_NAMES, get_model, initial_positions
from .headline import ALL_NUTS as NUTS
from .headline import earlier_note, made_by
from .samplers import BY_NAME_SAMPLERS, DENSE_SAMPLERS, SAMPLERS

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCHEMA_VERSION = 1

# The models and samplers of each mode (all registered ones unless listed here).
# Stochastic volatility (d = 1003) needs far more than 1000 + 1000 iterations for any sampler
# to converge (R-hat 1.05-1.2 at that length for NUTS and AHMC alike), and NUTS takes minutes
# there: it runs in --full mode (or by name with --models), not in the quick default.
# The quick default is the paper's logistic regressions, the Gaussians and the small LGCP: about 20 minutes
# on a 2-core machine with every peer (14 before the compiled PyMC routes joined on 2026-12-06).  The
# posteriordb set (about 25 minutes more for every sampler; diamonds alone takes NUTS ~10 minutes) joins in
# --full or by name.
QUICK_MODELS = ["pima", "ripley", "breast_cancer", "std_gauss_10", "diag_gauss_10", "corr_gauss_2", "lgcp_16"]
FULL_MODELS = list(MODELS)
# ARMHMC (O(d^3) per metric evaluation) joins in --full or by name: on breast cancer (d = 31) it
# takes minutes, which the quick default cannot afford.
RMHMC_SAMPLERS = ("armhmc",)
RMHMC_MODEL_NAMES = ("pima", "ripley", "breast_cancer")
# The dense-mass-matrix variants (benchmarks.samplers.DENSE_SAMPLERS) run by name only, on models up
# to DENSE_MAX_DIM: an O(d^2) matrix and an O(d^3) factorisation per iteration or window.
DENSE_MAX_DIM = 200
# The *_auto variants and ahmc_pymc_pooled (benchmarks.samplers.BY_NAME_SAMPLERS) also run by name only.
DEFAULT_SAMPLERS = [name for name in SAMPLERS if name not in DENSE_SAMPLERS and name not in BY_NAME_SAMPLERS]
QUICK_SAMPLERS = [name for name in DEFAULT_SAMPLERS if name not in RMHMC_SAMPLERS]
NUTS_SAMPLERS = NUTS  # the baselines of the ratio column
PYMC_SAMPLERS = ("ahmc_pymc", "ahmc_pymc_jax", "pymc_nuts", "nutpie",  # need the model's PyMC version
                 "pymc_numpyro", "pymc_numpyro_vectorized",
                 "ahmc_pymc_dense", "pymc_nuts_dense", "nutpie_low_rank", "ahmc_pymc_auto", "ahmc_pymc_pooled")
# Above this dimension the per-coordinate ESS and R-hat arrays stay out of the JSON (lgcp_64 has
# 16384 coordinates: about 0.7 MB per run); the min / median / max summaries are kept.
PER_COORDINATE_MAX_DIM = 4096

PACKAGES = (
    "ahmc", "jax", "jaxlib", "blackjax", "numpyro", "arviz_base", "arviz_stats",
    "numpy", "scipy", "optax", "pymc", "pytensor", "numba", "nutpie",
)  # fmt: skip


# --------------------------------------------------------------------------- #
# Environment
# --------------------------------------------------------------------------- #


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    import jax

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    status = _git("status", "--porcelain")
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, "-m", "benchmarks.run", *argv]),
        "seed": args.seed,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "nproc": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(device) for device in jax.devices()],
        "jax_enable_x64": bool(jax.config.jax_enable_x64),
        "packages": versions,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
    }


def save_study(args: argparse.Namespace, argv: list[str], script: str, rows: list, markdown: Callable,
               output) -> dict[str, Any]:
    """Write a side study's rows with the environment as ``output`` (JSON) and ``markdown(results)`` beside it.

    For the scripts beside the main benchmark (``benchmarks.<script>``); ``args.seed`` is recorded.
    """
    env = environment(args, argv)
    env["command"] = env["command"].replace("benchmarks.run", f"benchmarks.{script}")
    results = {"environment": env, "models": rows}
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=1))
    output.with_suffix(".md").write_text(markdown(results))
    print(f"wrote {output} and {output.with_suffix('.md')}")
    return results


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #


def _model_key(seed: int, name: str):
    import jax

    return jax.random.fold_in(jax.random.key(seed), zlib.crc32(name.encode()) & 0x7FFFFFFF)


def model_checks(model, draws: np.ndarray) -> dict[str, Any]:
    """Accuracy numbers that need the model: z against a posteriordb reference, the LGCP field.

    ``max_abs_z_reference``: the largest |z| of the posterior means against the
    reference (``tests/reference.py``: z = (mean - ref) / sqrt(mcse^2 + mcse_ref^2),
    sample MCSE from bulk ESS), with every z in ``z_reference``;
    ``max_abs_z_reference_sq`` the same for the mean squares.  ``field``: the
    posterior mean and variance of each LGCP cell (for the paper's Figure 4).
    """
    out: dict[str, Any] = {}
    if model.derived_fn is None or not np.all(np.isfinite(draws)):
        return out
    derived = model.derived_fn(draws)
    if model.reference is not None:
        from tests.reference import zscores_against_reference

        z = zscores_against_reference(derived, model.reference)
        z_sq = zscores_against_reference(derived, model.reference, moment="mean_squared")
        out["z_reference"] = z
        out["max_abs_z_reference"] = float(np.nanmax(np.abs(list(z.values()))))
        out["max_abs_z_reference_sq"] = float(np.nanmax(np.abs(list(z_sq.values()))))
    if model.truth is not None and "x" in derived:
        field = derived["x"].reshape(-1, derived["x"].shape[-1])
        out["field"] = {"mean": field.mean(axis=0).tolist(), "var": field.var(axis=0, ddof=1).tolist()}
    return out


def skip_reason(sampler_name: str, model) -> str | None:
    """Why ``sampler_name`` does not run on ``model`` (None if it does)."""
    if sampler_name in PYMC_SAMPLERS and model.name not in PYMC_MODEL_NAMES:
        return f"no PyMC version of {model.name} (benchmarks/pymc_models.py)"
    if sampler_name in DENSE_SAMPLERS and model.dim > DENSE_MAX_DIM:
        return f"dense mass matrix: d = {model.dim} > {DENSE_MAX_DIM}"
    if sampler_name in RMHMC_SAMPLERS and model.name not in RMHMC_MODEL_NAMES:
        return ("ARMHMC runs where the paper applies it, the logistic regressions (Fisher metric); "
                "docs/rmhmc.md runs it on others")
    return None


def run_one(sampler_name, model, positions, num_warmup, num_samples, seed, options, keep=None) -> dict[str, Any]:
    """Run one sampler on one model; never raises (a failure is recorded with its reason).

    ``keep``: a dict that receives what the runner keeps in memory for the
    report's figures (``SamplerRun.keep``, e.g. the tuner history).
    """
    record: dict[str, Any] = {
        "model": model.name,
        "sampler": sampler_name,
        "num_chains": int(positions.shape[0]),
        "num_warmup": num_warmup,
        "num_samples": num_samples,
        "options": options,
    }
    reason = skip_reason(sampler_name, model)
    if reason is not None:
        record.update(status="skipped", reason=reason, elapsed_s=0.0)
        return record
    start = time.perf_counter()
    try:
        runner = SAMPLERS[sampler_name]
        run = runner(_model_key(seed, model.name), model, positions, num_warmup, num_samples, **options)
        record["metrics"] = metrics = summarize(
            run.draws,
            run.num_grads_warmup,
            run.num_grads_sampling,
            run.num_divergent_warmup,
            run.num_divergent_sampling,
            warmup_s=run.timing["warmup_s"],
            sampling_s=run.timing["sampling_s"],
            mean=model.mean,
            sd=model.sd,
        )
        metrics.update(model_checks(model, run.draws))
        if model.dim > PER_COORDINATE_MAX_DIM:
            del metrics["ess_bulk_per_coordinate"], metrics["rhat_per_coordinate"]
            metrics["per_coordinate_omitted"] = True
        record["timing"] = run.timing
        record["extra"] = run.extra
        record["status"] = "ok"
        if keep is not None and run.keep:
            keep.update(run.keep)
    except Exception as error:  # noqa: BLE001 - the run must go on
        record["status"] = "failed"
        record["reason"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc(limit=8)
    finally:
        record["elapsed_s"] = time.perf_counter() - start
        free_compiled_programs()
    return record


def free_compiled_programs() -> None:
    """Drop JAX's in-memory caches of compiled programs once a run is done (no later run reuses them).

    Each compiled XLA program holds memory maps of its own, and JAX's caches keep every program
    alive: a process that runs many samplers would reach Linux's ``vm.max_map_count`` (65530 by
    default), at which point XLA's compiler segfaults (seen in the test suite on 2026-11-28).
    """
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
        gc.collect()


RESUME_MUST_MATCH = ("num_chains", "num_warmup", "num_samples", "dtype", "sampler_options")


def _previous_runs(args, results) -> dict:
    """Finished runs of an earlier invocation writing ``args.output`` (``--resume``).

    Returns ``{(model, sampler): record}`` plus ``"models"`` (their headers).  The
    earlier run must have the same mode, seed and settings, else the numbers would
    not be comparable; its command, date and commit are kept in
    ``environment["earlier_invocations"]``, and its total time is added to this one's.
    """
    path = args.output
    if not path.exists():
        return {}
    earlier = json.loads(path.read_text())
    mismatched = [key for key in RESUME_MUST_MATCH if earlier["settings"].get(key) != results["settings"][key]]
    if earlier.get("mode") != results["mode"] or earlier["environment"].get("seed") != args.seed:
        mismatched.append("mode/seed")
    if mismatched:
        raise SystemExit(
            f"--resume: {path} was made with different {', '.join(mismatched)}; "
            "use the same settings, or another --output.")
    env = earlier["environment"]
    invocations = env.pop("earlier_invocations", [])
    invocations.append({key: env.get(key) for key in ("command", "date_utc", "git_commit", "git_dirty", "cpu_model")})
    results["environment"]["earlier_invocations"] = invocations
    results["earlier_elapsed_s"] = earlier.get("total_elapsed_s", 0.0) + earlier.get("earlier_elapsed_s", 0.0)
    if "tuning" in earlier and (path.parent / earlier["tuning"]["file"]).exists():  # else this run saves one
        results["tuning"] = earlier["tuning"]
    kept = {(run["model"], run["sampler"]): run for run in earlier["runs"] if run["status"] in ("ok", "skipped")}
    kept["models"] = earlier["models"]
    return kept


def _release_compiled_code() -> None:
    """Drop JAX's compiled executables after every run.

    JAX keeps every executable, with its code's memory mappings, for the life
    of the process, and a full run compiles hundreds of them.  A full run died
    in its 116th run with "LLVM ERROR: Unable to allocate section memory" while
    the machine had free memory (most likely the process's mappings reached
    the kernel's limit, ``vm.max_map_count`` = 65530; not confirmed).  No
    executable is reused across runs, so dropping them costs nothing.
    """
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


def warm_up_pytensor(sampler_names) -> float:
    """Pay PyTensor's first use in this process before any PyMC sampler is timed; returns the seconds spent.

    The first model PyTensor compiles in a process loads its compiled-module cache and linker (measured on
    Pima: 1.6 s of "compile" for whichever PyMC sampler came first, 0.2 s for the next). A user's session pays
    that once, whatever the sampler, so no sampler is charged for it: a throwaway model's log density and
    gradient are compiled first. Each model's own compilation stays in its samplers' times."""
    if not set(sampler_names) & set(PYMC_SAMPLERS):
        return 0.0
    start = time.perf_counter()
    import pymc as pm

    with pm.Model() as throwaway:
        pm.Normal("x", 0.0, 1.0, shape=3)
    logp_dlogp = throwaway.logp_dlogp_function(ravel_inputs=True)
    logp_dlogp.set_extra_values({})
    logp_dlogp(np.zeros(3))
    return time.perf_counter() - start


def _draws_for(model, args) -> tuple[int, int, str | None]:
    num_warmup, num_samples = args.num_warmup, args.num_samples
    note = None
    if not args.full and model.quick_draws is not None and not args.draws_given:
        num_warmup, num_samples = model.quick_draws
        note = f"quick mode: {model.name} uses {num_warmup} warm-up / {num_samples} draws per chain"
    if args.full and model.full_draws is not None and not args.draws_given:
        num_warmup, num_samples = model.full_draws
        note = f"full mode: {model.name} uses {num_warmup} warm-up / {num_samples} draws per chain"
    return num_warmup, num_samples, note


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    model_names = args.models
    sampler_names = args.samplers
    options = args.sampler_options
    results: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "mode": "full" if args.full else "quick",
        "settings": {
            "models": model_names,
            "samplers": sampler_names,
            "num_chains": args.chains,
            "num_warmup": args.num_warmup,
            "num_samples": args.num_samples,
            "dtype": "float32" if args.float32 else "float64",
            "sampler_options": options,
        },
        "environment": environment(args, argv),
        "notes": [],
        "models": {},
        "runs": [],
    }
    previous = _previous_runs(args, results) if args.resume else {}
    results["environment"]["pytensor_warm_up_s"] = warm_up_pytensor(sampler_names)
    total = len(model_names) * len(sampler_names)
    done = 0
    clock = time.perf_counter()
    for model_name in model_names:
        if all((model_name, name) in previous for name in sampler_names):  # finished before: keep it
            header = results["models"][model_name] = previous["models"][model_name]
            if (header["num_warmup"], header["num_samples"]) != (args.num_warmup, args.num_samples):
                results["notes"].append(f"{'full' if args.full else 'quick'} mode: {model_name} uses "
                                        f"{header['num_warmup']} warm-up / {header['num_samples']} draws per chain")
            results["runs"].extend(previous[model_name, name] for name in sampler_names)
            done += len(sampler_names)
            print(f"{model_name}: kept from {args.output.name} (--resume)", flush=True)
            continue
        try:
            model = get_model(model_name)
        except Exception as error:  # noqa: BLE001 - a model that cannot be built fails its runs, the rest go on
            reason = f"building the model failed: {type(error).__name__}: {error}"
            results["models"][model_name] = {"description": "(not built)", "dim": None,
                                             "num_warmup": args.num_warmup, "num_samples": args.num_samples}
            for sampler_name in sampler_names:
                done += 1
                results["runs"].append({"model": model_name, "sampler": sampler_name, "status": "failed",
                                        "reason": reason, "elapsed_s": 0.0})
            print(f"{model_name}: {reason}", flush=True)
            continue
        num_warmup, num_samples, note = _draws_for(model, args)
        if note:
            results["notes"].append(note)
        results["models"][model_name] = {
            "description": model.description,
            "dim": model.dim,
            "num_warmup": num_warmup,
            "num_samples": num_samples,
        }
        positions = initial_positions(model, args.chains, args.seed)
        if args.float32:
            positions = positions.astype(np.float32)
        for sampler_name in sampler_names:
            done += 1
            if (model_name, sampler_name) in previous:
                results["runs"].append(previous[model_name, sampler_name])
                continue
            print(
                f"[{done}/{total}] {model_name} / {sampler_name}: {args.chains} chains, "
                f"{num_warmup} warm-up + {num_samples} draws ...",
                end="",
                flush=True,
            )
            keep: dict[str, Any] = {}
            record = run_one(
                sampler_name, model, positions, num_warmup, num_samples, args.seed, options.get(sampler_name, {}),
                keep=keep,
            )
            _release_compiled_code()
            record["made"] = made_by(results["environment"])
            results["runs"].append(record)
            if "tuning" in keep and "tuning" not in results:  # the first AHMC tuning history, for the report
                path = save_tuning(keep["tuning"], args.output)
                results["tuning"] = {"model": model_name, "sampler": sampler_name, "file": path.name}
            if args.output is not None:  # partial results survive an interrupted run
                write_json(results, args.output)
            if record["status"] == "skipped":
                print(f" skipped: {record['reason']}", flush=True)
            elif record["status"] == "ok":
                m, t = record["metrics"], record["timing"]
                print(
                    f" {record['elapsed_s']:.1f} s (compile {t['compile_s']:.1f} s); "
                    f"ESS/grad min {m['ess_per_grad']['min']:.4f}, max R-hat {m['rhat_max']:.3f}",
                    flush=True,
                )
            else:
                print(f" FAILED after {record['elapsed_s']:.1f} s: {record['reason']}", flush=True)
    results["total_elapsed_s"] = time.perf_counter() - clock
    return results


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #


def _fmt(value, digits=3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def _triple(d: dict[str, float], digits=3) -> str:
    return " / ".join(_fmt(d[k], digits) for k in ("min", "median", "max"))


def _total_s(results) -> float:
    return results["total_elapsed_s"] + results.get("earlier_elapsed_s", 0.0)


def markdown_report(results: dict[str, Any]) -> str:
    env = results["environment"]
    settings = results["settings"]
    lines = [
        f"# Benchmark ({results['mode']} mode)",
        "",
        f"`{env['command']}` -- {env['date_utc']}, seed {env['seed']}, {settings['dtype']}, "
        f"{settings['num_chains']} chains; {env['cpu_model']}, {env['nproc']} CPUs, JAX {env['packages'].get('jax')} "
        f"on {env['jax_backend']}, BlackJAX {env['packages'].get('blackjax')}, NumPyro {env['packages'].get('numpyro')}, "
        f"PyMC {env['packages'].get('pymc')}, nutpie {env['packages'].get('nutpie')}; "
        f"git {str(env['git_commit'])[:10]}{' (dirty)' if env['git_dirty'] else ''}. "
        + (f"Total {_total_s(results) / 60:.1f} min." if "total_elapsed_s" in results
         else "**Interrupted: the models below are those that finished.**")
        + earlier_note(results),
        "",
        "ESS: ArviZ bulk ESS over all chains, per coordinate; min / median / max over coordinates. "
        "Per gradient = per leapfrog step of the sampling phase (paper's ESS/L); 'w/ warm-up' also counts "
        "warm-up gradients. ESS/s uses sampling wall time with compilation (JAX; PyTensor/Numba for the "
        "PyMC samplers) taken out (compile time apart); the PyMC samplers run their chains on one core "
        "by default. Chains: NumPyro's NUTS one after another (its default on a one-device CPU, "
        "unless the run's options say otherwise), BlackJAX's NUTS and the JAX AHMC samplers vmap-ed. "
        "'vs NUTS' = min ESS/grad over the best NUTS baseline's on that model. "
        "'x^2': min ESS/grad of the squared deviations (x - mean)^2 (variances), and the same ratio "
        "against the best NUTS on that measure; draws that alternate around the mean raise the ESS of x "
        "but not of x^2.",
        "",
    ]
    for note in results["notes"]:
        lines.append(f"- {note}")
    if results["notes"]:
        lines.append("")
    header = (
        "| sampler | ESS/grad min / med / max | vs NUTS | x^2: min ESS/grad, vs NUTS | min ESS/grad w/ warm-up | min ESS | "
        "min ESS/s | grads/draw | max R-hat | div (warm-up, sampling) | compile s | sampling s |"
    )
    num_columns = header.count("|") - 1
    for model_name, model_info in results["models"].items():
        runs = [r for r in results["runs"] if r["model"] == model_name]
        best_nuts = max(
            (r["metrics"]["ess_per_grad"]["min"] for r in runs if r["status"] == "ok" and r["sampler"] in NUTS_SAMPLERS),
            default=None,
        )
        best_nuts_squares = max(
            (r["metrics"]["ess_per_grad_squares"]["min"] for r in runs
             if r["status"] == "ok" and r["sampler"] in NUTS_SAMPLERS and "ess_per_grad_squares" in r["metrics"]),
            default=None,
        )
        lines += [
            f"## {model_name}: {model_info['description']} (d = {model_info['dim']}; "
            f"{model_info['num_warmup']} warm-up + {model_info['num_samples']} draws per chain)",
            "",
            header,
            "|" + "---|" * num_columns,
        ]
        for r in runs:
            if r["status"] != "ok":
                reason = r["reason"].splitlines()[0][:160].replace("|", "\\|")
                label = "skipped" if r["status"] == "skipped" else "FAILED"
                lines.append(f"| {r['sampler']} | {label}: {reason} |" + " |" * (num_columns - 2))
                continue
            m, t = r["metrics"], r["timing"]
            ratio = None
            if best_nuts and best_nuts > 0 and math.isfinite(m["ess_per_grad"]["min"]):
                ratio = m["ess_per_grad"]["min"] / best_nuts
            squares = m.get("ess_per_grad_squares", {}).get("min")  # absent in results written before it existed
            ratio_squares = None
            if squares is not None and best_nuts_squares and best_nuts_squares > 0 and math.isfinite(squares):
                ratio_squares = squares / best_nuts_squares
            sampling_s = _fmt(t["sampling_s"]) + ("*" if t.get("sampling_time_estimated") else "")
            lines.append(
                f"| {r['sampler']} | {_triple(m['ess_per_grad'])} | {_fmt(ratio)} | {_fmt(squares)}, {_fmt(ratio_squares)} | "
                f"{_fmt(m['ess_per_grad_with_warmup']['min'])} | {_fmt(m['ess_bulk']['min'], 4)} | "
                f"{_fmt(m['ess_per_second']['min'])} | {_fmt(m['grads']['per_draw'])} | {_fmt(m['rhat_max'], 4)} | "
                f"{m['divergences']['warmup']}, {m['divergences']['sampling']} | {_fmt(t['compile_s'])} | {sampling_s} |"
            )
        z = [
            (r["sampler"], r["metrics"].get("max_abs_z_mean"), r["metrics"].get("max_abs_z_var"))
            for r in runs
            if r["status"] == "ok" and r["metrics"].get("max_abs_z_mean") is not None
        ]
        if z:
            lines += ["", "Exact moments, largest |z| (mean, variance): " + "; ".join(
                f"{name} {_fmt(zm)}, {_fmt(zv)}" for name, zm, zv in z
            ) + "."]
        z_ref = [(r["sampler"], r["metrics"]["max_abs_z_reference"], r["metrics"]["max_abs_z_reference_sq"])
                 for r in runs if r["status"] == "ok" and "max_abs_z_reference" in r["metrics"]]
        if z_ref:
            lines += ["", "posteriordb reference, largest |z| (means, mean squares): " + "; ".join(
                f"{name} {_fmt(zm)}, {_fmt(zs)}" for name, zm, zs in z_ref
            ) + "."]
        lines.append("")
    if any(r.get("timing", {}).get("sampling_time_estimated") for r in results["runs"]):
        lines += ["\\* sampling time estimated: warm-up and sampling ran in one call and the time is apportioned by "
                  "gradient counts (or, for PyMC with cores > 1, by the chains' per-phase spans).", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #


def _names(text: str, known: dict, what: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="full mode (default: quick)")
    parser.add_argument("--models", type=lambda s: _names(s, MODELS, "model"), default=None,
                        help=f"comma-separated subset of: {', '.join(MODELS)}")
    parser.add_argument("--samplers", type=lambda s: _names(s, SAMPLERS, "sampler"), default=None,
                        help=f"comma-separated subset of: {', '.join(SAMPLERS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--num-warmup", type=int, default=None, help="warm-up iterations per chain (1000)")
    parser.add_argument("--num-samples", type=int, default=None, help="kept draws per chain (1000)")
    parser.add_argument("--float32", action="store_true", help="run JAX in float32 (default float64)")
    parser.add_argument("--sampler-options", type=json.loads, default={},
                        help='JSON: {"sampler": {"option": value}}, passed to the runner')
    parser.add_argument("--output", type=Path, default=None,
                        help="JSON path (default benchmarks/results/bench_<mode>.json); the .md goes beside it")
    parser.add_argument("--resume", action="store_true",
                        help="keep the finished (model, sampler) runs already in --output (same settings) "
                             "and run only the rest: finishes an interrupted run")
    parser.add_argument("--list", action="store_true", help="list models and samplers, then exit")
    parser.add_argument("--no-figures", dest="figures", action="store_false",
                        help="skip the paper-style report with figures (benchmarks/report.py)")
    args = parser.parse_args(argv)
    args.draws_given = args.num_warmup is not None or args.num_samples is not None
    args.num_warmup = 1000 if args.num_warmup is None else args.num_warmup
    args.num_samples = 1000 if args.num_samples is None else args.num_samples
    if args.models is None:
        args.models = FULL_MODELS if args.full else QUICK_MODELS
    if args.samplers is None:
        args.samplers = DEFAULT_SAMPLERS if args.full else QUICK_SAMPLERS
    if args.output is None:
        args.output = RESULTS_DIR / f"bench_{'full' if args.full else 'quick'}.json"
    unknown = [name for name in args.sampler_options if name not in SAMPLERS]
    if unknown:
        parser.error(f"--sampler-options names unknown samplers: {unknown}")
    return args


def save_tuning(tuning: dict[str, Any], output: Path) -> Path:
    """Save a tuning history (EngineInfo arrays, search box, options) beside the results file."""
    path = output.with_name(output.stem + "_tuning.npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"info_{name}": np.asarray(value) for name, value in tuning["info"].items()}
    np.savez_compressed(path, step_size_box=np.asarray(tuning["search_box"][0]),
                        num_steps_box=np.asarray(tuning["search_box"][1]),
                        options=np.asarray(json.dumps(tuning["options"])), chains_first=np.asarray(True),
                        **arrays)
    return path


def write_json(results: dict[str, Any], path: Path) -> None:
    """Compact JSON (the committed results stay small: docs/benchmarks.md): long lists of numbers (per
    coordinate, per chain, an LGCP field) keep 4 significant digits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    compact = _rounded(json.loads(json.dumps(results, default=_json_default, allow_nan=True)))
    path.write_text(json.dumps(compact, separators=(",", ":"), allow_nan=True) + "\n")


def _rounded(value, long_list: int = 16):
    """``value`` with the floats of every list longer than ``long_list`` at 4 significant digits."""
    if isinstance(value, dict):
        return {key: _rounded(item, long_list) for key, item in value.items()}
    if isinstance(value, list):
        if len(value) > long_list:
            return [float(f"{item:.4g}") if isinstance(item, float) else _rounded(item, long_list) for item in value]
        return [_rounded(item, long_list) for item in value]
    return value


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.list:
        for name in MODELS:
            print(f"model    {name}: {get_model(name).description}")
        for name, runner in SAMPLERS.items():
            print(f"sampler  {name}: {(runner.__doc__ or '').strip().splitlines()[0]}")
        return {}

    import jax

    jax.config.update("jax_enable_x64", not args.float32)
    results = run_benchmark(args, argv)
    results["complete"] = True
    write_json(results, args.output)
    report = markdown_report(results)
    markdown_path = args.output.with_suffix(".md")
    markdown_path.write_text(report + "\n")
    print()
    print(report)
    print(f"wrote {args.output} and {markdown_path}")
    if args.figures:
        from .report import write_report

        print(f"wrote {write_report(args.output)}")
    if args.output.resolve().parent == RESULTS_DIR:  # the committed runs: their tables go into the docs
        from .headline import update_documents

        for path in update_documents():
            print(f"updated the results tables in {path}")
    return results


if __name__ == "__main__":
    main()
