"""What the benchmark measures, from draws and gradient counts.

The score of a sampler (DESIGN.md, "Measuring"; paper section 5) is the
effective sample size per gradient evaluation -- the paper's ESS per leapfrog
step -- summarized by its minimum, median and maximum over coordinates (the
minimum matters most).  Here:

* ESS is ArviZ's rank-normalized bulk ESS (``arviz_stats.ess(x, method="bulk")``)
  of each coordinate, all chains pooled.
* ``ess_per_grad``: ESS / gradient evaluations of the sampling phase, all chains.
* ``ess_per_grad_with_warmup``: ESS / (warm-up + sampling gradient evaluations).
* ``ess_per_second``: ESS / sampling wall time (compilation excluded; compile time
  is reported apart).  ``ess_per_second_with_warmup`` divides by warm-up +
  sampling time.
* ``per_chain``: the same ESS per gradient for every chain alone (for the
  paper's box plots and per-chain scatter plots).
* ``ess_bulk_squares`` / ``ess_per_grad_squares``: the same for the squared
  deviations (x - mean)^2, i.e. how well variances are estimated.  A sampler
  whose draws alternate around the mean (lag-1 autocorrelation near -1, e.g.
  HMC with a trajectory of half a period) gets a bulk ESS of x above the
  number of draws but a tiny ESS of (x - mean)^2; reporting both keeps such
  a sampler from looking better than it is.
* ``lag1_autocorrelation``: min / median / max over coordinates of the lag-1
  autocorrelation, averaged over chains.
* ``rhat_max``: the largest rank-normalized split R-hat over coordinates.
* ``divergences``: divergent transitions in warm-up and in sampling.
* ``max_abs_z_mean`` / ``max_abs_z_var``: for targets with known moments, the
  largest |z| of the posterior mean and of the variance, with
  z = (estimate - truth) / MCSE, MCSE = sd(g) / sqrt(ESS_bulk(g)) and
  sd(g) = sd for g = x, sqrt(2) sd^2 for g = (x - mean)^2 (exact for normals).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
from arviz_stats import ess as _arviz_ess
from arviz_stats import rhat as _arviz_rhat

__all__ = ["CompileClock", "bulk_ess", "lag1_autocorrelation", "split_rhat", "strict_ess", "summarize",
           "three_numbers"]


def bulk_ess(draws: np.ndarray) -> np.ndarray:
    """Bulk ESS per coordinate of ``draws`` (chains, draws, dim) -> (dim,)."""
    return np.asarray(_arviz_ess(np.asarray(draws, dtype=np.float64), method="bulk"), dtype=np.float64)


def strict_ess(draws) -> float:
    """The headline's ESS: min over coordinates of min(bulk ESS of x, of (x - mean)^2); draws (chains, draws, dim)."""
    draws = np.asarray(draws, dtype=np.float64)
    squares = (draws - draws.mean(axis=(0, 1))) ** 2
    return float(min(bulk_ess(draws).min(), bulk_ess(squares).min()))


def split_rhat(draws: np.ndarray) -> np.ndarray:
    """Rank-normalized split R-hat per coordinate of ``draws`` (chains, draws, dim) -> (dim,)."""
    return np.asarray(_arviz_rhat(np.asarray(draws, dtype=np.float64)), dtype=np.float64)


def lag1_autocorrelation(draws: np.ndarray) -> np.ndarray:
    """Lag-1 autocorrelation per coordinate, averaged over chains: (chains, draws, dim) -> (dim,)."""
    centred = draws - draws.mean(axis=1, keepdims=True)
    covariance = (centred[:, 1:] * centred[:, :-1]).mean(axis=1)
    variance = (centred**2).mean(axis=1)
    return np.mean(covariance / np.where(variance > 0, variance, math.nan), axis=0)


def three_numbers(values: np.ndarray) -> dict[str, float]:
    """``{"min", "median", "max"}`` of a 1-D array (NaN-aware; NaN when all are NaN)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or np.all(np.isnan(values)):
        return {"min": math.nan, "median": math.nan, "max": math.nan}
    return {
        "min": float(np.nanmin(values)),
        "median": float(np.nanmedian(values)),
        "max": float(np.nanmax(values)),
    }


def _ratio(numerator: np.ndarray, denominator: float | None) -> dict[str, float]:
    if denominator is None or not denominator > 0:
        return three_numbers(np.full_like(numerator, math.nan))
    return three_numbers(numerator / denominator)


def _max_abs_z(draws: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> tuple[float, float]:
    centred = draws - mean
    z_mean = (draws.mean(axis=(0, 1)) - mean) / (sd / np.sqrt(bulk_ess(draws)))
    squares = centred**2
    z_var = (squares.mean(axis=(0, 1)) - sd**2) / (math.sqrt(2.0) * sd**2 / np.sqrt(bulk_ess(squares)))
    return float(np.max(np.abs(z_mean))), float(np.max(np.abs(z_var)))


def summarize(
    draws: np.ndarray,
    num_grads_warmup: np.ndarray,
    num_grads_sampling: np.ndarray,
    num_divergent_warmup: np.ndarray | None = None,
    num_divergent_sampling: np.ndarray | None = None,
    *,
    warmup_s: float | None = None,
    sampling_s: float | None = None,
    mean: np.ndarray | None = None,
    sd: np.ndarray | None = None,
) -> dict[str, Any]:
    """Every number the report shows for one (model, sampler) run.

    Parameters
    ----------
    draws : array (chains, draws, dim)
        Sampling-phase draws.
    num_grads_warmup, num_grads_sampling : int arrays (chains,)
        Gradient evaluations (leapfrog steps) per chain in each phase.
    num_divergent_warmup, num_divergent_sampling : int arrays (chains,), optional
    warmup_s, sampling_s : float, optional
        Wall time of each phase, compilation excluded.
    mean, sd : arrays (dim,), optional
        Exact moments; when given, ``max_abs_z_mean`` and ``max_abs_z_var`` are filled.

    Returns
    -------
    dict
        JSON-ready; see the module docstring for the keys.
    """
    draws = np.asarray(draws, dtype=np.float64)
    if draws.ndim != 3:
        raise ValueError(f"draws must be (chains, draws, dim), got shape {draws.shape}")
    num_chains = draws.shape[0]
    grads_warmup = np.asarray(num_grads_warmup, dtype=np.int64).reshape(num_chains)
    grads_sampling = np.asarray(num_grads_sampling, dtype=np.int64).reshape(num_chains)
    total_warmup, total_sampling = int(grads_warmup.sum()), int(grads_sampling.sum())

    finite = bool(np.all(np.isfinite(draws)))
    ess = bulk_ess(draws) if finite else np.full(draws.shape[2], math.nan)
    squares = (draws - draws.mean(axis=(0, 1))) ** 2
    ess_squares = bulk_ess(squares) if finite else np.full(draws.shape[2], math.nan)
    rhat = split_rhat(draws) if finite else np.full(draws.shape[2], math.nan)
    per_chain = []
    for chain in range(num_chains):
        chain_ess = bulk_ess(draws[chain : chain + 1]) if finite else np.full(draws.shape[2], math.nan)
        per_chain.append(
            {
                "ess_bulk": three_numbers(chain_ess),
                "ess_per_grad": _ratio(chain_ess, float(grads_sampling[chain])),
                "grads_sampling": int(grads_sampling[chain]),
                "grads_warmup": int(grads_warmup[chain]),
            }
        )

    total_s = None if warmup_s is None or sampling_s is None else warmup_s + sampling_s
    result: dict[str, Any] = {
        "num_chains": num_chains,
        "num_draws": int(draws.shape[1]),
        "dim": int(draws.shape[2]),
        "ess_bulk": three_numbers(ess),
        "ess_per_grad": _ratio(ess, total_sampling),
        "ess_per_grad_with_warmup": _ratio(ess, total_warmup + total_sampling),
        "ess_per_second": _ratio(ess, sampling_s),
        "ess_bulk_squares": three_numbers(ess_squares),
        "ess_per_grad_squares": _ratio(ess_squares, total_sampling),
        "lag1_autocorrelation": three_numbers(lag1_autocorrelation(draws)) if finite else three_numbers(ess * math.nan),
        "ess_per_second_with_warmup": _ratio(ess, total_s),
        "grads": {
            "warmup": total_warmup,
            "sampling": total_sampling,
            "per_draw": total_sampling / max(draws.shape[0] * draws.shape[1], 1),
        },
        "rhat_max": float(np.nanmax(rhat)) if not np.all(np.isnan(rhat)) else math.nan,
        "divergences": {
            "warmup": None if num_divergent_warmup is None else int(np.sum(num_divergent_warmup)),
            "sampling": None if num_divergent_sampling is None else int(np.sum(num_divergent_sampling)),
        },
        "ess_bulk_per_coordinate": ess.tolist(),
        "rhat_per_coordinate": rhat.tolist(),
        "per_chain": per_chain,
        "all_finite": finite,
    }
    if mean is not None and sd is not None and finite:
        z_mean, z_var = _max_abs_z(draws, np.asarray(mean), np.asarray(sd))
        result["max_abs_z_mean"], result["max_abs_z_var"] = z_mean, z_var
    return result


# --------------------------------------------------------------------------- #
# Timing: wall time with JAX compilation taken out
# --------------------------------------------------------------------------- #

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


REPEAT_BELOW_S = 1.0  # compiled calls shorter than this are timed again, and the median counts
REPEATS = 5  # at least this many times in all ...
REPEAT_BUDGET_S = 1.0  # ... and until the repeats have taken this long (a 20 ms call: ~50 times) ...
MAX_REPEATS = 51  # ... but no more often than this


class CompileClock:
    """Wall-clock timer that also measures the time JAX spent tracing and compiling.

    JAX reports tracing, lowering and XLA compilation as time spans through
    ``jax.monitoring``; the clock keeps the union of the spans that fall in a
    phase (nested jits would otherwise count twice).  This works for any JAX
    sampler, including drivers we do not control (NumPyro's ``MCMC``, ahmc's
    ``run_chains``), so every sampler's run time is measured the same way::

        clock = CompileClock()
        with clock.phase("warmup"):
            ...                      # block_until_ready() the outputs inside
        clock.run_s["warmup"], clock.compile_s["warmup"]

    The events do not cover all of it: ``jit(...).lower()`` spends a few tens of
    milliseconds in Python between them (measured: 42 ms of an 0.81 s lowering
    of the AHMC engine's sampling scan), and the first call of a freshly
    compiled executable has a start-up cost of its own.  On a model whose whole
    sampling phase takes 30 ms that residue is most of the measured "run" time.
    Runners that compile ahead of time therefore mark the call of the compiled
    executable with :meth:`executing`; when a phase has marked stretches its
    run time is their length (net of any compile events inside them) and the
    rest of the phase counts as compile.
    """

    def __init__(self) -> None:
        self.wall_s: dict[str, float] = {}
        self.compile_s: dict[str, float] = {}
        self.run_s: dict[str, float] = {}
        self.repeat_s: dict[str, list[float]] = {}
        self._marks: list[tuple[float, float]] | None = None
        self._set_aside = 0.0  # wall time of execute()'s repeats in the current phase
        self._phase: str | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        import jax.monitoring

        spans: list[tuple[float, float]] = []
        self._marks = []
        self._set_aside = 0.0
        self._phase = name

        def listener(event: str, start: float, end: float, **_: Any) -> None:
            if event in _COMPILE_EVENTS:
                spans.append((start, end))

        jax.monitoring.register_event_time_span_listener(listener)
        start = time.time()
        try:
            yield
        finally:
            wall = time.time() - start - self._set_aside  # repeats of short calls (execute) are not the phase's
            jax.monitoring.unregister_event_time_span_listener(listener)
            marks, self._marks = self._marks, None
            if marks:
                inside = [(max(a, lo), min(b, hi)) for a, b in spans for lo, hi in marks if b > lo and a < hi]
                run = max(sum(hi - lo for lo, hi in marks) - _union_length(inside), 0.0)
                compile_s = wall - run
            else:
                compile_s = min(_union_length(spans), wall)
            self.wall_s[name] = wall
            self.compile_s[name] = compile_s
            self.run_s[name] = wall - compile_s

    @contextmanager
    def executing(self) -> Iterator[None]:
        """Mark a stretch of the current phase as execution (see the class docstring)."""
        if self._marks is None:
            raise RuntimeError("CompileClock.executing() is only meaningful inside clock.phase(...)")
        start = time.time()
        try:
            yield
        finally:
            self._marks.append((start, time.time()))

    def execute(self, compiled: Callable, *args: Any) -> Any:
        """Call a compiled executable as execution; a call shorter than ``REPEAT_BELOW_S`` is timed again.

        On this machine's shared cores one call of a 20-50 ms sampling loop varies by a factor of
        up to 3 between runs (another job takes a core), and the median of five calls still moved
        by 1.5x between two runs of the full benchmark.  So such a call is repeated (same inputs,
        same outputs) at least ``REPEATS`` times and until the repeats have taken
        ``REPEAT_BUDGET_S`` (at most ``MAX_REPEATS`` calls), and the median counts as its run
        time; the repeats' wall time is left out of the phase.  Every sampler timed through this
        method gets the same treatment; the times are kept in ``repeat_s[phase]``.
        """
        import jax

        with self.executing():
            out = jax.block_until_ready(compiled(*args))
        start, end = self._marks[-1]
        times = [end - start]
        if times[0] < REPEAT_BELOW_S:
            begin = time.time()
            while len(times) < MAX_REPEATS and (len(times) < REPEATS or time.time() - begin < REPEAT_BUDGET_S):
                t0 = time.time()
                jax.block_until_ready(compiled(*args))
                times.append(time.time() - t0)
            self._set_aside += time.time() - begin
            self._marks[-1] = (start, start + float(np.median(times)))
        self.repeat_s[self._phase] = times
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "wall_s": dict(self.wall_s),
            "compile_s": dict(self.compile_s),
            "run_s": dict(self.run_s),
            "repeat_s": {name: list(times) for name, times in self.repeat_s.items()},
            "compile_total_s": float(sum(self.compile_s.values())),
        }
