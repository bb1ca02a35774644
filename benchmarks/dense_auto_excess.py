"""What ``dense_mass="auto"`` sees: the correlation excess of each model's warm-up covariance.

    ./dev run python -m benchmarks.dense_auto_excess --models pima,ripley,std_gauss_10 --seed 0

Runs the BlackJAX engine's warm-up with ``dense_mass=True`` (4 chains from the benchmark's starting
points and key, 1000 warm-up iterations: a 500-iteration metric phase whose last Stan window pools
4 x 200 draws) and reports, from the final dense estimate, the condition number of its
correlation matrix, the Marchenko-Pastur noise level for that many draws, their ratio
(:func:`ahmc.core.correlation_excess`; ``"auto"`` keeps the dense matrix at 2 or more) and the
largest |correlation|.  Writes ``--output`` (JSON) and a Markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def excess_row(model_name: str, seed: int, num_warmup: int = 1000, num_chains: int = 4) -> dict:
    import jax
    import jax.numpy as jnp

    from ahmc.adapters import _jax_engine
    from ahmc.adapters.blackjax import _options
    from ahmc.core import correlation_excess
    from blackjax.adaptation.window_adaptation import build_schedule

    from .models import get_model, initial_positions
    from .run import _model_key

    model = get_model(model_name)
    engine = _jax_engine.build_engine(model.logdensity_fn, num_warmup=num_warmup,
                                      **_options(False, {"dense_mass": True}))
    init_key, warm_key, _ = jax.random.split(_model_key(seed, model.name), 3)  # the benchmark runner's split
    state = engine.init(jnp.asarray(initial_positions(model, num_chains, seed)), init_key)
    scan = jax.jit(_jax_engine._scan_impl, static_argnums=(0, 3, 4))
    state, _ = scan(engine.step, warm_key, state, engine.config.metric_phase_length, False)
    ends = np.flatnonzero(np.asarray(build_schedule(engine.config.metric_phase_length))[:, 1])
    draws = num_chains * int(ends[-1] - ends[-2]) if len(ends) > 1 else num_chains * int(ends[0])
    covariance = np.asarray(state.inverse_mass_matrix, dtype=np.float64)
    sd = np.sqrt(np.diag(covariance))
    correlation = covariance / np.outer(sd, sd)
    eigenvalues = np.linalg.eigvalsh(correlation)
    q = np.sqrt(model.dim / draws)
    off_diagonal = np.abs(correlation[np.triu_indices(model.dim, 1)])
    return {"model": model_name, "dim": model.dim, "draws": draws,
            "condition_number": float(eigenvalues[-1] / eigenvalues[0]),
            "noise_level": float(((1 + q) / (1 - q)) ** 2) if q < 1 else float("inf"),
            "excess": float(correlation_excess(covariance, draws)),
            "max_abs_correlation": float(off_diagonal.max()) if off_diagonal.size else 0.0}


def main(argv=None):
    import jax

    jax.config.update("jax_enable_x64", True)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dense_auto_excess", description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(RESULTS / "dense_auto_excess.json"))
    args = parser.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        rows.append(excess_row(name, args.seed))
        print(rows[-1], flush=True)
    command = "python -m benchmarks.dense_auto_excess " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
    Path(args.output).write_text(json.dumps({"command": command, "seed": args.seed, "rows": rows}, indent=1))
    lines = [f"# Correlation excess at the end of the metric phase (seed {args.seed})", "", f"`{command}`", "",
             "| model | d | pooled draws | condition number | noise level | excess (auto: dense at >= 2) | max abs corr |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['dim']} | {r['draws']} | {r['condition_number']:.3g} | {r['noise_level']:.3g} | "
              f"{r['excess']:.3g} | {r['max_abs_correlation']:.2f} |" for r in rows]
    Path(args.output).with_suffix(".md").write_text("\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main()
