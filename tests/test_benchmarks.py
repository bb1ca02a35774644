"""Smoke tests of the benchmark harness (benchmarks/): data, models, metrics, one tiny run.

The tiny run goes through the command line in a subprocess, because the
harness switches JAX to float64 for the whole process.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import metrics, models, run

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "loader, shape, labels",
    [
        (models.load_pima, (532, 7), {0: 355, 1: 177}),
        (models.load_ripley, (250, 2), {0: 125, 1: 125}),
        (models.load_breast_cancer, (569, 30), {0: 212, 1: 357}),
    ],
)
def test_data_files_load_with_the_right_shapes(loader, shape, labels):
    X, y, names = loader()
    assert X.shape == shape and y.shape == (shape[0],) and len(names) == shape[1]
    assert np.all(np.isfinite(X))
    assert dict(zip(*np.unique(y, return_counts=True))) == labels
    Xs = models.standardize(X)
    np.testing.assert_allclose(Xs.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(Xs.std(axis=0), 1, rtol=1e-12)


def test_attribution_names_every_data_file():
    text = (models.DATA_DIR / "ATTRIBUTION.md").read_text()
    for path in models.DATA_DIR.glob("*.csv"):
        assert path.name in text


def test_logistic_log_density_matches_a_numpy_formula():
    jax = pytest.importorskip("jax")
    X, y, _ = models.load_ripley()
    model = models.get_model("ripley")
    x = np.array([0.3, -1.2, 2.0], dtype=np.float32)
    Xs = models.standardize(X)
    eta = x[0] + Xs @ x[1:].astype(np.float64)
    expected = np.sum(y * eta - np.logaddexp(0, eta)) - 0.5 * np.sum(x.astype(np.float64) ** 2) / 100.0
    got = float(jax.jit(model.logdensity_fn)(jax.numpy.asarray(x)))
    assert model.dim == 3
    assert got == pytest.approx(expected, rel=1e-5)


def test_every_model_builds_and_is_finite_at_its_initial_positions():
    jax = pytest.importorskip("jax")
    for name in models.MODELS:
        model = models.get_model(name)
        positions = models.initial_positions(model, 4, seed=0).astype(np.float32)
        assert positions.shape == (4, model.dim)
        values = jax.vmap(model.logdensity_fn)(jax.numpy.asarray(positions))
        assert np.all(np.isfinite(np.asarray(values))), name


def test_summarize_on_independent_draws():
    rng = np.random.default_rng(0)
    draws = rng.normal(size=(4, 500, 3))
    out = metrics.summarize(
        draws, np.full(4, 700), np.full(4, 1000), np.zeros(4), np.array([0, 1, 0, 0]),
        warmup_s=1.0, sampling_s=2.0, mean=np.zeros(3), sd=np.ones(3),
    )  # fmt: skip
    assert 1000 < out["ess_bulk"]["min"] <= out["ess_bulk"]["max"] < 3000
    assert out["ess_per_grad"]["min"] == pytest.approx(out["ess_bulk"]["min"] / 4000)
    assert out["ess_per_grad_with_warmup"]["min"] == pytest.approx(out["ess_bulk"]["min"] / 6800)
    assert out["ess_per_second"]["median"] == pytest.approx(out["ess_bulk"]["median"] / 2.0)
    assert out["grads"] == {"warmup": 2800, "sampling": 4000, "per_draw": 2.0}
    assert out["divergences"] == {"warmup": 0, "sampling": 1}
    assert out["rhat_max"] < 1.02 and out["max_abs_z_mean"] < 4.5 and out["max_abs_z_var"] < 4.5
    assert len(out["per_chain"]) == 4


def test_a_failing_sampler_is_recorded_and_the_run_goes_on(monkeypatch):
    def broken(rng_key, model, positions, num_warmup, num_samples, **options):
        raise RuntimeError("no such sampler here")

    monkeypatch.setitem(run.SAMPLERS, "broken", broken)
    model = models.get_model("corr_gauss_2")
    record = run.run_one("broken", model, models.initial_positions(model, 2, 0), 10, 10, 0, {})
    assert record["status"] == "failed" and "RuntimeError: no such sampler here" in record["reason"]


def test_ahmc_runner_reads_the_run_chains_contract(monkeypatch):
    """The ahmc_blackjax runner against a stand-in ``run_chains`` with the documented outputs."""
    pytest.importorskip("jax")
    import types
    from typing import NamedTuple

    class Info(NamedTuple):
        num_integration_steps: np.ndarray
        is_divergent: np.ndarray
        is_warmup: np.ndarray
        step_size: np.ndarray

    def run_chains(rng_key, logdensity_fn, positions, num_warmup, num_samples, **options):
        chains, dim = positions.shape
        rows = num_warmup + num_samples
        is_warmup = np.repeat((np.arange(rows) < num_warmup)[:, None], chains, axis=1)
        steps = np.where(is_warmup, 3, 2)  # 3 per warm-up iteration, 2 per draw
        divergent = np.zeros((rows, chains), dtype=bool)
        divergent[0, 0] = divergent[-1, 1] = True  # one in warm-up, one in sampling
        samples = np.random.default_rng(0).normal(size=(chains, num_samples, dim))
        return samples, Info(steps, divergent, is_warmup, np.full((rows, chains), 0.5))

    fake = types.ModuleType("ahmc.adapters.blackjax")
    fake.run_chains = run_chains
    monkeypatch.setitem(sys.modules, "ahmc.adapters.blackjax", fake)
    model = models.get_model("corr_gauss_2")
    out = run.SAMPLERS["ahmc_blackjax"](None, model, models.initial_positions(model, 3, 0), 20, 10)
    assert out.draws.shape == (3, 10, 2)
    np.testing.assert_array_equal(out.num_grads_warmup, [60, 60, 60])
    np.testing.assert_array_equal(out.num_grads_sampling, [20, 20, 20])
    np.testing.assert_array_equal(out.num_divergent_warmup, [1, 0, 0])
    np.testing.assert_array_equal(out.num_divergent_sampling, [0, 1, 0])
    assert out.timing["sampling_time_estimated"] and out.extra["final_step_size"] == [0.5] * 3


def test_tiny_nuts_run_writes_json_and_markdown(tmp_path):
    pytest.importorskip("blackjax")
    pytest.importorskip("numpyro")
    output = tmp_path / "tiny.json"
    command = [
        sys.executable, "-m", "benchmarks.run", "--models", "corr_gauss_2",
        "--samplers", "blackjax_nuts,numpyro_nuts", "--chains", "2", "--num-warmup", "60",
        "--num-samples", "40", "--seed", "3", "--output", str(output),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[1/2] corr_gauss_2 / blackjax_nuts" in done.stdout
    assert "[2/2] corr_gauss_2 / numpyro_nuts" in done.stdout

    results = json.loads(output.read_text())
    assert results["schema_version"] == run.SCHEMA_VERSION and results["mode"] == "quick"
    env = results["environment"]
    for key in ("date_utc", "command", "seed", "cpu_model", "nproc", "packages", "jax_enable_x64"):
        assert key in env
    assert env["seed"] == 3 and env["jax_enable_x64"] is True and "--num-samples 40" in env["command"]
    assert results["models"]["corr_gauss_2"]["num_samples"] == 40

    assert [r["sampler"] for r in results["runs"]] == ["blackjax_nuts", "numpyro_nuts"]
    for record in results["runs"]:
        assert record["status"] == "ok", record.get("traceback")
        assert (record["model"], record["num_chains"]) == ("corr_gauss_2", 2)
        m = record["metrics"]
        assert (m["num_chains"], m["num_draws"], m["dim"]) == (2, 40, 2)
        for key in ("ess_per_grad", "ess_per_grad_with_warmup", "ess_per_second", "ess_bulk"):
            assert set(m[key]) == {"min", "median", "max"} and m[key]["min"] > 0
        assert m["grads"]["sampling"] >= 80 and m["grads"]["warmup"] >= 120
        assert math.isfinite(m["rhat_max"]) and m["divergences"]["sampling"] >= 0
        assert "max_abs_z_mean" in m and len(m["per_chain"]) == 2
        timing = record["timing"]
        assert timing["compile_s"] > 0 and timing["sampling_s"] > 0 and not timing["sampling_time_estimated"]

    report = output.with_suffix(".md").read_text()
    assert "## corr_gauss_2" in report and "| blackjax_nuts |" in report and "| numpyro_nuts |" in report


def test_pymc_model_matches_the_jax_log_density():
    pytest.importorskip("pymc")
    pytest.importorskip("jax")
    from benchmarks import pymc_models

    model = models.get_model("ripley")
    points = models.initial_positions(model, 3, seed=1)
    error = pymc_models.max_logp_discrepancy("ripley", points)
    assert error["logp"] < 1e-8 and error["grad"] < 1e-8


def test_ahmc_pymc_runner_smoke():
    """The PyMC step method through the runner contract on a tiny model (a few seconds)."""
    pytest.importorskip("pymc")
    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 2, seed=0)
    out = run.SAMPLERS["ahmc_pymc"](None, model, positions, 60, 40)
    assert out.draws.shape == (2, 40, 2) and np.all(np.isfinite(out.draws))
    assert np.all(out.num_grads_warmup >= 60) and np.all(out.num_grads_sampling >= 40)
    assert out.num_divergent_warmup.shape == out.num_divergent_sampling.shape == (2,)
    timing = out.timing
    assert timing["compile_s"] > 0 and timing["warmup_s"] > 0 and timing["sampling_s"] > 0
    assert not timing["sampling_time_estimated"] and out.extra["cores"] == 1
    assert len(out.extra["final_step_size"]) == 2
