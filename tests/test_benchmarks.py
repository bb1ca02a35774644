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
    """All but the posteriordb models (tested below); lgcp_64 included (FFT, no dense matrix)."""
    jax = pytest.importorskip("jax")
    for name in models.MODELS:
        if name in models.POSTERIORDB_MODELS:
            continue
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
    assert abs(out["lag1_autocorrelation"]["median"]) < 0.1
    assert 1000 < out["ess_bulk_squares"]["min"] < 3000


def test_alternating_draws_have_a_large_ess_of_x_and_a_small_ess_of_squares():
    # x_t = (-1)^t |z_t| * s_c: an antithetic chain (what HMC with a half-period trajectory does).
    rng = np.random.default_rng(1)
    magnitude = np.abs(rng.normal(size=(4, 1, 2))) * np.ones((4, 400, 2))
    magnitude = magnitude + 0.05 * rng.normal(size=magnitude.shape)
    draws = magnitude * (-1.0) ** np.arange(400)[None, :, None]
    out = metrics.summarize(draws, np.full(4, 10), np.full(4, 400))
    assert out["lag1_autocorrelation"]["max"] < -0.9
    assert out["ess_bulk"]["min"] > 1600  # above the number of draws
    assert out["ess_bulk_squares"]["max"] < 100


def test_a_failing_sampler_is_recorded_and_the_run_goes_on(monkeypatch):
    def broken(rng_key, model, positions, num_warmup, num_samples, **options):
        raise RuntimeError("no such sampler here")

    monkeypatch.setitem(run.SAMPLERS, "broken", broken)
    model = models.get_model("corr_gauss_2")
    record = run.run_one("broken", model, models.initial_positions(model, 2, 0), 10, 10, 0, {})
    assert record["status"] == "failed" and "RuntimeError: no such sampler here" in record["reason"]


def test_per_coordinate_arrays_stay_out_of_the_json_above_the_limit(monkeypatch):
    from benchmarks.samplers import SamplerRun

    def independent(rng_key, model, positions, num_warmup, num_samples, **options):
        draws = np.random.default_rng(0).normal(size=(positions.shape[0], num_samples, model.dim))
        ones = np.ones(positions.shape[0], dtype=int)
        timing = {"warmup_s": 1.0, "sampling_s": 1.0, "compile_s": 0.0}
        return SamplerRun(draws, ones, ones * num_samples, ones * 0, ones * 0, timing, {})

    monkeypatch.setitem(run.SAMPLERS, "independent", independent)
    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 2, 0)
    record = run.run_one("independent", model, positions, 10, 50, 0, {})
    assert len(record["metrics"]["ess_bulk_per_coordinate"]) == 2 and "per_coordinate_omitted" not in record["metrics"]
    monkeypatch.setattr(run, "PER_COORDINATE_MAX_DIM", 1)
    record = run.run_one("independent", model, positions, 10, 50, 0, {})
    assert record["status"] == "ok" and record["metrics"]["per_coordinate_omitted"]
    assert "ess_bulk_per_coordinate" not in record["metrics"] and "rhat_per_coordinate" not in record["metrics"]
    assert record["metrics"]["ess_bulk"]["min"] > 0


def test_a_model_that_cannot_be_built_fails_its_runs_and_the_run_goes_on(monkeypatch):
    def broken():
        raise OSError("data file missing")

    def fine(rng_key, model, positions, num_warmup, num_samples, **options):
        raise RuntimeError("sampler broke too")

    monkeypatch.setitem(models.MODELS, "broken_model", broken)
    monkeypatch.setitem(run.SAMPLERS, "fine", fine)
    args = run.parse_args(["--models", "broken_model,corr_gauss_2", "--samplers", "fine", "--chains", "2"])
    args.output = None
    monkeypatch.setattr(run, "environment", lambda args, argv: {})
    results = run.run_benchmark(args, [])
    assert [(r["model"], r["status"]) for r in results["runs"]] == [("broken_model", "failed"),
                                                                     ("corr_gauss_2", "failed")]
    assert "OSError: data file missing" in results["runs"][0]["reason"]
    assert "RuntimeError: sampler broke too" in results["runs"][1]["reason"]
    assert "FAILED" in run.markdown_report({**results, "environment": _ENV})


_ENV = {"command": "c", "date_utc": "d", "seed": 0, "cpu_model": "cpu", "nproc": 2, "packages": {},
        "jax_backend": "cpu", "git_commit": "0" * 40, "git_dirty": False}


@pytest.mark.slow  # ~25 s; default run under 15 min (2026-11-28)
def test_ahmc_runner_times_the_engine_phases_apart_and_draws_what_sample_draws():
    """The ahmc_blackjax runner runs the engine's two scans itself (to time them one by one):
    same draws and step counts as ``_jax_engine.sample`` with the same key, measured times."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from ahmc.adapters import _jax_engine

    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 3, 0)
    key = jax.random.key(5)
    out = run.SAMPLERS["ahmc_blackjax"](key, model, positions, 60, 40)
    samples, info, state = _jax_engine.sample(key, model.logdensity_fn, jnp.asarray(positions), 60, 40)
    np.testing.assert_array_equal(out.draws, np.asarray(samples))
    steps = np.asarray(info.num_integration_steps)
    np.testing.assert_array_equal(out.num_grads_warmup, steps[:60].sum(axis=0))
    np.testing.assert_array_equal(out.num_grads_sampling, steps[60:].sum(axis=0))
    assert out.num_grads_sampling.sum() > 0
    assert out.keep["tuning"]["info"]["num_integration_steps"].shape == (100, 3)
    assert out.keep["tuning"]["search_box"][1].tolist() == np.asarray(state.box.num_steps).tolist()
    assert out.extra["final_step_size"] == np.asarray(info.step_size)[-1].tolist()
    timing = out.timing
    assert not timing["sampling_time_estimated"]
    assert timing["warmup_s"] > 0 and timing["sampling_s"] > 0 and timing["compile_s"] > 0


def test_compile_clock_counts_only_the_marked_stretches_as_run_time():
    """A phase with ``executing()`` marks: run time is the marked time, the rest (lowering, compiling) is compile."""
    jax = pytest.importorskip("jax")
    import time

    from benchmarks.metrics import CompileClock

    clock = CompileClock()
    with clock.phase("p"):
        time.sleep(0.05)  # stands for lowering work that JAX's compile events do not cover
        with clock.executing():
            time.sleep(0.02)
    assert clock.run_s["p"] == pytest.approx(0.02, abs=0.015)
    assert clock.compile_s["p"] == pytest.approx(clock.wall_s["p"] - clock.run_s["p"]) and clock.compile_s["p"] > 0.04
    with clock.phase("q"):  # unmarked: compile is the union of the compile events only
        jax.jit(lambda x: x * 2.0).lower(1.0).compile()
        time.sleep(0.02)
    assert clock.run_s["q"] >= 0.015 and clock.compile_s["q"] > 0
    with pytest.raises(RuntimeError, match="inside clock.phase"):
        with clock.executing():
            pass


def test_compile_clock_times_a_short_call_by_the_median_of_repeats(monkeypatch):
    """``execute``: a call under REPEAT_BELOW_S runs REPEATS times, the median is its run time and the
    repeats' wall time is not the phase's; a longer call runs once."""
    pytest.importorskip("jax")
    import time

    from benchmarks import metrics

    sleeps = iter([0.04, 0.01, 0.02, 0.08, 0.02, 0.2])

    def compiled(x):
        time.sleep(next(sleeps))
        return x

    monkeypatch.setattr(metrics, "REPEAT_BELOW_S", 0.1)
    monkeypatch.setattr(metrics, "REPEAT_BUDGET_S", 0.1)  # five calls take 0.13 s: no more needed
    clock = metrics.CompileClock()
    with clock.phase("short"):
        time.sleep(0.03)
        assert clock.execute(compiled, 7) == 7
    assert len(clock.repeat_s["short"]) == metrics.REPEATS == 5
    assert clock.run_s["short"] == pytest.approx(0.02, abs=0.008)
    assert clock.wall_s["short"] == pytest.approx(0.03 + 0.04, abs=0.02)  # not the 0.13 s of the repeats
    with clock.phase("long"):
        clock.execute(compiled, 1)
    assert clock.repeat_s["long"] == [pytest.approx(0.2, abs=0.05)] and clock.run_s["long"] >= 0.19
    assert next(sleeps, None) is None and clock.as_dict()["repeat_s"]["short"] == clock.repeat_s["short"]


def test_compile_clock_repeats_a_very_short_call_until_its_time_budget_is_spent(monkeypatch):
    """A call much shorter than REPEAT_BUDGET_S is repeated past REPEATS until the budget is spent,
    and never more than MAX_REPEATS times."""
    pytest.importorskip("jax")
    import time

    from benchmarks import metrics

    def compiled(x):
        time.sleep(0.01)
        return x

    monkeypatch.setattr(metrics, "REPEAT_BUDGET_S", 0.15)
    clock = metrics.CompileClock()
    with clock.phase("budget"):
        clock.execute(compiled, 0)
    assert 8 <= len(clock.repeat_s["budget"]) <= 17  # 1 + ~0.15 s / 0.01 s: past REPEATS (sleep overshoots)
    assert clock.run_s["budget"] == pytest.approx(0.01, abs=0.005)
    monkeypatch.setattr(metrics, "MAX_REPEATS", 8)
    with clock.phase("capped"):
        clock.execute(compiled, 0)
    assert len(clock.repeat_s["capped"]) == 8


@pytest.mark.slow  # ~28 s each
@pytest.mark.parametrize("sampler", ["numpyro_nuts", "ahmc_numpyro"])  # same code path
def test_numpyro_sampling_is_retimed_ahead_of_time_with_the_same_draws(sampler):
    """The NumPyro runners time a compiled re-run of the sampling phase, which must reproduce MCMC.run's draws."""
    jax = pytest.importorskip("jax")
    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 2, 0)
    out = run.SAMPLERS[sampler](jax.random.key(1), model, positions, 50, 40)
    timing = out.timing
    assert timing["sampling_timed_by"] == "aot_rerun" and timing["retime_compile_s"] > 0
    assert 0 < timing["sampling_s"] and timing["sampling_mcmc_run_s"] > 0
    if sampler == "ahmc_numpyro":  # two chains cannot restart one another (the slow test restarts one)
        assert out.extra["restarts"] == [0.0, 0.0]


@pytest.mark.slow  # ~50 s; default run under 15 min (2026-11-28)
def test_nuts_with_chains_one_after_another_draws_what_vectorized_nuts_draws(jax_x64):
    """chain_method="sequential" (NumPyro's CPU default, and the benchmark's for NumPyro's NUTS) changes the
    loop, not the draws; NumPyro's sampling phase is then timed by a compiled re-run over the chains, which
    must reproduce MCMC.run's draws."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("numpyro")
    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 2, 0)
    # jax_x64: the benchmark's precision (float32 rounding can move BlackJAX's warm-up apart)
    for sampler in ("blackjax_nuts", "numpyro_nuts"):
        vectorized = run.SAMPLERS[sampler](jax.random.key(1), model, positions, 50, 40, chain_method="vectorized")
        sequential = run.SAMPLERS[sampler](jax.random.key(1), model, positions, 50, 40, chain_method="sequential")
        np.testing.assert_allclose(sequential.draws, vectorized.draws, rtol=1e-7, atol=1e-9)
    assert sequential.timing["sampling_timed_by"] == "aot_rerun" and sequential.extra["chain_method"] == "sequential"
    assert run.SAMPLERS["numpyro_nuts"](jax.random.key(1), model, positions, 5, 5).extra["chain_method"] == "sequential"
    with pytest.raises(ValueError, match="chain_method"):
        run.SAMPLERS["blackjax_nuts"](jax.random.key(1), model, positions, 5, 5, chain_method="parallel")


@pytest.mark.slow  # a 400-iteration warm-up, ~15 s
def test_ahmc_numpyro_runner_records_warmup_restarts():
    """The NumPyro runner counts lost chains restarted in warm-up per chain, as the BlackJAX runner does."""
    pytest.importorskip("numpyro")
    import jax
    from benchmarks.samplers import _run_ahmc_kernel

    from .adapters.test_engine_robust import trapped_logdensity, trapped_start

    out = _run_ahmc_kernel(trapped_logdensity, jax.random.key(3), trapped_start(4), 400, 20)
    restarts = out.extra["restarts"]
    assert len(restarts) == 4 and restarts[1] >= 1 and restarts[0] == restarts[2] == restarts[3] == 0


@pytest.mark.slow  # another NumPyro run and re-run, ~10 s
def test_numpyro_retiming_falls_back_to_mcmc_run_when_the_draws_differ(monkeypatch):
    """When the re-run does not reproduce MCMC.run's draws, MCMC.run's time stands and the record says why."""
    jax = pytest.importorskip("jax")
    from benchmarks import samplers

    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 2, 0)
    monkeypatch.setattr(samplers, "_same_draws", lambda a, b: False)  # as if the re-run drew otherwise
    out = run.SAMPLERS["ahmc_numpyro"](jax.random.key(1), model, positions, 50, 40)
    assert out.timing["sampling_timed_by"].startswith("mcmc_run")
    assert out.timing["sampling_s"] == out.timing["sampling_mcmc_run_s"]


def test_same_draws_accepts_rounding_and_rejects_a_different_chain():
    """The retiming check: draws equal to rounding pass, a changed draw or shape does not."""
    from benchmarks.samplers import _same_draws

    draws = np.random.default_rng(0).normal(size=(2, 40, 3))
    assert _same_draws(draws * (1 + 1e-13), draws)
    moved = draws.copy()
    moved[1, 17, 2] += 1e-6
    assert not _same_draws(moved, draws)
    assert not _same_draws(draws[:, :39], draws)
    single = draws.astype(np.float32)
    assert _same_draws(single * np.float32(1 + 1e-7), single) and not _same_draws(single + np.float32(1e-3), single)


def _tiny_command(output):
    return [
        sys.executable, "-m", "benchmarks.run", "--models", "kidiq",
        "--samplers", "ahmc_blackjax,blackjax_nuts", "--chains", "2", "--num-warmup", "100",
        "--num-samples", "50", "--seed", "3", "--output", str(output),
    ]  # fmt: skip


def test_tiny_run_writes_json_markdown_and_the_paper_style_report(tmp_path, jax_x64):
    """The harness end to end on a tiny configuration: a posteriordb model, AHMC and NUTS, the report."""
    pytest.importorskip("blackjax")
    pytest.importorskip("matplotlib")
    output = tmp_path / "tiny.json"
    command = _tiny_command(output)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[1/2] kidiq / ahmc_blackjax" in done.stdout and "[2/2] kidiq / blackjax_nuts" in done.stdout

    results = json.loads(output.read_text())
    assert results["schema_version"] == run.SCHEMA_VERSION and results["mode"] == "quick" and results["complete"]
    env = results["environment"]
    for key in ("date_utc", "command", "seed", "cpu_model", "nproc", "packages", "jax_enable_x64"):
        assert key in env
    assert env["seed"] == 3 and env["jax_enable_x64"] is True and "--num-samples 50" in env["command"]
    assert results["models"]["kidiq"]["num_samples"] == 50

    assert [r["sampler"] for r in results["runs"]] == ["ahmc_blackjax", "blackjax_nuts"]
    for record in results["runs"]:
        assert record["status"] == "ok", record.get("traceback")
        chains = 2
        m = record["metrics"]
        assert (m["num_chains"], m["num_draws"], m["dim"]) == (chains, 50, 3)
        for key in ("ess_per_grad", "ess_per_grad_with_warmup", "ess_per_second", "ess_bulk"):
            assert set(m[key]) == {"min", "median", "max"} and m[key]["min"] > 0
        assert m["grads"]["sampling"] >= 50 * chains and m["grads"]["warmup"] >= 100 * chains
        assert math.isfinite(m["rhat_max"]) and m["divergences"]["sampling"] >= 0 and len(m["per_chain"]) == chains
        assert set(m["z_reference"]) == {"beta[1]", "beta[2]", "sigma"}
        assert m["max_abs_z_reference"] == pytest.approx(max(abs(z) for z in m["z_reference"].values()))
        assert record["timing"]["compile_s"] > 0 and record["timing"]["sampling_s"] > 0
    assert results["tuning"] == {"model": "kidiq", "sampler": "ahmc_blackjax", "file": "tiny_tuning.npz"}

    table = output.with_suffix(".md").read_text()
    assert "## kidiq" in table and "| blackjax_nuts |" in table and "posteriordb reference, largest |z|" in table
    report = (tmp_path / "tiny_report.md").read_text()
    assert "## Targets" in report and "| kidiq | ahmc_blackjax |" in report and "### kidiq" in report
    for figure in ("tiny_fig2_boxes_1.png", "tiny_fig3_ahmc_vs_nuts.png", "tiny_fig_tuning.png"):
        assert f"]({figure})" in report and (tmp_path / figure).stat().st_size > 10_000

    # --resume with other settings is refused before anything runs (resuming itself: the slow test below).
    # In this process (a subprocess would spend ~10 s importing); main() turns x64 on, which jax_x64 undoes.
    with pytest.raises(SystemExit, match="different num_samples"):
        run.main([*command[3:-2], "--output", str(output), "--num-samples", "60", "--resume"])


@pytest.mark.slow  # three benchmark runs in subprocesses, ~60 s
def test_tiny_run_resumes_with_a_new_model(tmp_path):
    """--resume keeps the finished runs and runs only the new model."""
    pytest.importorskip("blackjax")
    output = tmp_path / "tiny.json"
    command = _tiny_command(output)
    done = subprocess.run([*command, "--no-figures"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(output.read_text())
    env = first["environment"]
    resumed = subprocess.run(
        [*command[:4], "kidiq,corr_gauss_2", *command[5:], "--resume", "--no-figures"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "kidiq: kept from tiny.json" in resumed.stdout and "[3/4] corr_gauss_2 / ahmc_blackjax" in resumed.stdout
    results = json.loads(output.read_text())
    assert [(r["model"], r["sampler"]) for r in results["runs"]] == [
        ("kidiq", "ahmc_blackjax"), ("kidiq", "blackjax_nuts"),
        ("corr_gauss_2", "ahmc_blackjax"), ("corr_gauss_2", "blackjax_nuts")]
    assert results["runs"][:2] == first["runs"] and results["complete"]
    assert results["environment"]["earlier_invocations"][0]["command"] == env["command"]
    assert "Resumed (`--resume`) from" in output.with_suffix(".md").read_text()


def test_resume_keeps_the_tuning_figure_only_if_its_file_exists(tmp_path):
    """A resumed run inherits the earlier run's tuning history only when that file is there; else the
    first AHMC run of this invocation saves its own (the report's reward-surface figure needs one)."""
    import argparse

    settings = {"num_chains": 4, "num_warmup": 10, "num_samples": 10, "dtype": "float64", "sampler_options": {}}
    earlier = {"mode": "quick", "settings": settings, "environment": {"seed": 0, "command": "c"}, "models": {},
               "runs": [], "tuning": {"model": "pima", "sampler": "ahmc_blackjax", "file": "old_tuning.npz"}}
    output = tmp_path / "old.json"
    output.write_text(json.dumps(earlier))
    args = argparse.Namespace(output=output, seed=0)

    def resumed():
        results = {"mode": "quick", "settings": settings, "environment": {}}
        run._previous_runs(args, results)
        return results

    assert "tuning" not in resumed()
    (tmp_path / "old_tuning.npz").write_bytes(b"")
    assert resumed()["tuning"]["file"] == "old_tuning.npz"


def test_chees_runner_counts_every_chain():
    """ChEES through the runner contract: 4 ensemble chains from 2 given starting points."""
    pytest.importorskip("blackjax")
    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 2, seed=0).astype(np.float32)
    import jax

    # Single precision whatever an earlier test in this process set (importing PyMC's JAX sampling
    # module, as sample_numpyro_ahmc does, turns jax_enable_x64 on).
    with jax.enable_x64(False):
        out = run.SAMPLERS["chees"](jax.random.key(0), model, positions, 60, 30, num_chains=4)
    assert out.draws.shape == (4, 30, 2) and np.all(np.isfinite(out.draws))
    assert out.num_grads_warmup.shape == out.num_grads_sampling.shape == (4,)
    assert np.all(out.num_grads_warmup >= 60) and np.all(out.num_grads_sampling >= 30)
    assert out.extra["num_chains"] == 4 and out.extra["step_size"] > 0
    assert out.timing["compile_s"] > 0 and not out.timing["sampling_time_estimated"]


def test_chees_runs_fewer_chains_only_where_their_draws_would_not_fit():
    from benchmarks.samplers import CHEES_DRAWS_BYTES, chees_num_chains

    assert chees_num_chains(1000, 256) == 16  # the 16 x 16 LGCP
    lgcp64 = chees_num_chains(4000, 16384)  # the 64 x 64 LGCP at 4000 draws: 16 chains would be 8.4 GB
    assert 4 <= lgcp64 < 16 and lgcp64 * 8.0 * 4000 * 16384 <= CHEES_DRAWS_BYTES
    assert chees_num_chains(10**6, 10**6) == 4  # never fewer than four


def test_pymc_samplers_skip_models_without_a_pymc_version():
    model = models.get_model("corr_gauss_2")._replace(name="eight_schools")
    record = run.run_one("pymc_nuts", model, models.initial_positions(model, 2, 0), 10, 10, 0, {})
    assert record["status"] == "skipped" and "no PyMC version of eight_schools" in record["reason"]
    assert run.skip_reason("numpyro_nuts", model) is None and run.skip_reason("nutpie", model) is not None


def test_targets_compare_ahmc_with_the_best_nuts():
    from benchmarks import report

    def record(model, sampler, grad, second, warm, rhat, z=None):
        m = {"ess_per_grad": {"min": grad}, "ess_per_second": {"min": second},
             "ess_per_grad_with_warmup": {"min": warm}, "rhat_max": rhat}
        if z is not None:
            m["max_abs_z_reference"] = z
        return {"model": model, "sampler": sampler, "status": "ok", "metrics": m}

    results = {"models": {"pima": {}, "kidiq": {}}, "runs": [
        record("pima", "blackjax_nuts", 0.10, 50.0, 0.05, 1.001),
        record("pima", "numpyro_nuts", 0.12, 40.0, 0.04, 1.002),
        record("pima", "ahmc_blackjax", 0.15, 60.0, 0.07, 1.003),  # 1.25x the best NUTS: short of 1.3x
        record("kidiq", "numpyro_nuts", 0.02, 10.0, 0.01, 1.0, z=0.5),
        record("kidiq", "ahmc_numpyro", 0.03, 9.0, 0.01, 1.02, z=4.5),
    ]}  # fmt: skip
    pima, kidiq = report.targets(results)
    assert pima["best_nuts"] == "numpyro_nuts" and pima["grad_ratio"] == pytest.approx(1.25) and not pima["grad_met"]
    assert pima["second_ratio"] == pytest.approx(1.5) and pima["second_met"]
    assert pima["warmup_ratio"] == pytest.approx(0.07 / 0.05) and pima["warmup_met"] and pima["rhat_met"]
    assert kidiq["grad_ratio"] == pytest.approx(1.5) and kidiq["grad_met"] and "warmup_ratio" not in kidiq
    assert not kidiq["second_met"] and not kidiq["z_met"] and not kidiq["rhat_met"]


def test_lgcp_model_matches_its_definition():
    jax = pytest.importorskip("jax")
    cov = models.lgcp_covariance(4)
    assert cov.shape == (16, 16) and cov[0, 0] == pytest.approx(1.91)
    # cells (0, 0) and (1, 2) of a 4 x 4 grid: distance sqrt(5) cells = sqrt(5) / 4 on the unit square
    assert cov[0, 6] == pytest.approx(1.91 * np.exp(-np.sqrt(5) / (4 / 33)))
    data = models.simulate_lgcp(4)
    np.testing.assert_allclose(data["chol"] @ data["chol"].T, cov, atol=1e-8)
    np.testing.assert_array_equal(models.simulate_lgcp(4)["y"], data["y"])  # seeded: same data every time
    model = models.lgcp(4, embedding=False)
    z = np.random.default_rng(1).normal(size=(2, 16))
    x = models.LGCP_MEAN + z @ data["chol"].T
    expected = (data["y"] * x - np.exp(x) / 16).sum(axis=1) - 0.5 * (z**2).sum(axis=1)
    with jax.enable_x64(True):
        got = [float(model.logdensity_fn(jax.numpy.asarray(row))) for row in z]
    np.testing.assert_allclose(np.diff(got), np.diff(expected), rtol=1e-9)
    np.testing.assert_allclose(model.derived_fn(z[None])["x"][0], x)
    assert model.truth["grid"] == 4 and model.dim == 16


def _dense_torus_root(grid, length=models.LGCP_RANGE):
    """Symmetric square root of the torus covariance built entry by entry (no FFT), window rows only."""
    size = 2 * grid
    rows, cols = np.divmod(np.arange(size * size), size)
    wrap = lambda d: np.minimum(np.abs(d), size - np.abs(d))  # noqa: E731
    distance = np.hypot(wrap(rows[:, None] - rows[None, :]), wrap(cols[:, None] - cols[None, :]))
    values, vectors = np.linalg.eigh(models.LGCP_VARIANCE * np.exp(-distance / (grid * length)))
    root = (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T
    return root[(rows < grid) & (cols < grid)]  # window cells, row-major as in lgcp_covariance


@pytest.mark.parametrize("grid, length", [(4, models.LGCP_RANGE), (6, 1 / 3), (5, 0.4)])
def test_lgcp_torus_map_gives_exactly_the_lgcp_covariance(grid, length):
    # (6, 1/3) and (5, 0.4): a range of 2 cells, as lgcp_64 (64 / 33 cells), so the off-diagonal entries matter.
    root = np.sqrt(models.lgcp_torus_eigenvalues(grid, length=length))
    assert root.shape == (2 * grid, 2 * grid)
    # the linear map z -> field, column by column: the images of the identity's columns
    matrix = models.lgcp_torus_field(np.eye(root.size), grid, root).T
    assert matrix.shape == (grid * grid, root.size)
    covariance = models.lgcp_covariance(grid, length=length)
    np.testing.assert_allclose(matrix @ matrix.T, covariance, rtol=0, atol=1e-12)
    np.testing.assert_allclose(matrix, _dense_torus_root(grid, length), rtol=0, atol=1e-12)  # the symmetric root


def test_lgcp_embedded_model_matches_its_closed_form():
    jax = pytest.importorskip("jax")
    model = models.lgcp(4, embedding=True)
    assert model.dim == 64 and model.truth["grid"] == 4 and "8 x 8 torus (d = 64)" in model.description
    data = models.simulate_lgcp(4, embedding=True)
    np.testing.assert_array_equal(model.truth["y"], data["y"])
    root = _dense_torus_root(4)
    np.testing.assert_allclose(data["x"].std(), 1.91**0.5, rtol=0.5)  # one field of 16 cells: a loose sanity check
    z = np.random.default_rng(3).normal(size=(3, 64))
    x = models.LGCP_MEAN + z @ root.T
    expected = (data["y"] * x - np.exp(x) / 16).sum(axis=1) - 0.5 * (z**2).sum(axis=1)
    with jax.enable_x64(True):
        got = [float(jax.jit(model.logdensity_fn)(jax.numpy.asarray(row))) for row in z]
        grad = np.asarray(jax.grad(model.logdensity_fn)(jax.numpy.asarray(z[0])))
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    # gradient of the closed form: root^T (y - m exp(x)) - z
    np.testing.assert_allclose(grad, root.T @ (data["y"] - np.exp(x[0]) / 16) - z[0], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(model.derived_fn(z[None])["x"][0], x, rtol=1e-12)


def test_lgcp_embedding_that_is_not_positive_semidefinite_raises():
    # a range of 4 cells on a 4 x 4 grid: the 8 x 8 torus wraps the kernel round and the embedding fails
    with pytest.raises(ValueError, match="not positive semi-definite.*length"):
        models.lgcp_torus_eigenvalues(4, length=1.0)


def test_lgcp_registry_parameterizations():
    """lgcp_16 keeps the Cholesky (same data as the committed results), lgcp_64 is embedded; say so."""
    small, large = models.get_model("lgcp_16"), models.get_model("lgcp_64")
    assert small.dim == 256 and "Cholesky" in small.description and "198 simulated points" in small.description
    assert large.dim == 128 * 128 and "128 x 128 torus (d = 16384)" in large.description
    assert large.truth["x"].shape == (4096,)


def _numpyro_logdensity_check(name, expected_fn):
    """The flat log density's differences between random points equal a SciPy transcription's."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("numpyro")
    with jax.enable_x64(True):
        model = models.get_model(name)
        points = np.random.default_rng(2).uniform(-1, 1, size=(3, model.dim))
        got = np.asarray(jax.jit(jax.vmap(model.logdensity_fn))(jax.numpy.asarray(points)))
        derived = model.derived_fn(points[None])
    expected = np.array([expected_fn({k: v[0, i] for k, v in derived.items()}) for i in range(3)])
    np.testing.assert_allclose(np.diff(got), np.diff(expected), rtol=1e-8, atol=1e-8)


@pytest.mark.slow  # NumPyro model set-up and compilation: ~15-40 s
def test_posteriordb_models_written_for_the_benchmark_match_their_math():
    from scipy import stats

    from benchmarks.posteriordb import load_data

    earnings = load_data("earnings-logearn_height")
    log_earn, height = np.log(earnings["earn"]), np.asarray(earnings["height"], float)
    _numpyro_logdensity_check("earnings", lambda p: stats.norm.logpdf(
        log_earn, p["beta"][0] + p["beta"][1] * height, p["sigma"]).sum() + np.log(p["sigma"]))

    ark = load_data("arK-arK")
    y = np.asarray(ark["y"], float)

    def ark_logp(p):
        mean = p["alpha"] + sum(p["beta"][k] * y[4 - k : len(y) - k - 1] for k in range(5))
        return (stats.norm.logpdf(y[5:], mean, p["sigma"]).sum() + stats.norm.logpdf(p["alpha"], 0, 10)
                + stats.norm.logpdf(p["beta"], 0, 10).sum() + stats.halfcauchy.logpdf(p["sigma"], scale=2.5)
                + np.log(p["sigma"]))

    _numpyro_logdensity_check("arK", ark_logp)

    mix = np.asarray(load_data("low_dim_gauss_mix-low_dim_gauss_mix")["y"], float)

    def mix_logp(p):
        mu, sigma, theta = p["mu"], p["sigma"], p["theta"]
        like = np.logaddexp(np.log(theta) + stats.norm.logpdf(mix, mu[0], sigma[0]),
                            np.log1p(-theta) + stats.norm.logpdf(mix, mu[1], sigma[1])).sum()
        prior = (stats.norm.logpdf(mu, 0, 2).sum() + stats.halfnorm.logpdf(sigma, scale=2).sum()
                 + stats.beta.logpdf(theta, 5, 5))
        jacobian = np.log(mu[1] - mu[0]) + np.log(sigma).sum() + np.log(theta) + np.log1p(-theta)
        return like + prior + jacobian

    _numpyro_logdensity_check("gauss_mix", mix_logp)


@pytest.mark.slow  # NumPyro model set-up and compilation: ~15-40 s
def test_posteriordb_models_name_every_reference_parameter():
    jax = pytest.importorskip("jax")
    from tests.reference import load_reference, select_stan_name

    for name in ("eight_schools", "gp_pois_regr", "diamonds"):
        with jax.enable_x64(True):
            model = models.get_model(name)
            draws = models.initial_positions(model, 2, 0)[:, None, :]
            derived = model.derived_fn(draws)
            assert np.isfinite(float(jax.jit(model.logdensity_fn)(jax.numpy.asarray(draws[0, 0]))))
        reference = load_reference(model.reference)
        for stan_name in reference["names"]:
            assert select_stan_name(derived, stan_name).shape == (2, 1), (name, stan_name)


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


def test_ahmc_pymc_pooled_runner_times_the_lockstep_loop_once():
    """pooled=True steps the chains in lockstep, so their spans overlap: the runner splits the loop's wall
    time between warm-up and draws instead of summing one span per chain (which counted it twice)."""
    pytest.importorskip("pymc")
    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 2, seed=0)
    out = run.SAMPLERS["ahmc_pymc_pooled"](None, model, positions, 60, 40)
    assert out.draws.shape == (2, 40, 2) and np.all(np.isfinite(out.draws))
    timing = out.timing
    assert timing["sampling_time_estimated"]
    loop = timing["phases"]["pm_sample_wall_s"] - timing["phases"]["compile_s"]["pm_sample_before_loop"]
    assert timing["warmup_s"] + timing["sampling_s"] <= loop * 1.01


def test_funnel_truth_check_passes_exact_draws_and_flags_a_missed_neck():
    pytest.importorskip("jax")
    from benchmarks.rmhmc import funnel_features, funnel_truth_z

    rng = np.random.default_rng(0)
    v = 3.0 * rng.normal(size=(4, 2000, 1))
    exact = np.concatenate([v, np.exp(v / 2) * rng.normal(size=(4, 2000, 9))], axis=-1)
    z = funnel_truth_z(funnel_features(exact))
    assert z["max_abs_z_mean"] < 4.5 and z["abs_z_var_v"] < 4.5
    no_neck = exact[np.broadcast_to(exact[..., :1] > -3.0, exact.shape)].reshape(-1, 10)
    no_neck = no_neck[: (len(no_neck) // 4) * 4].reshape(4, -1, 10)
    assert funnel_truth_z(funnel_features(no_neck))["max_abs_z_mean"] > 6


def test_funnel_fisher_metric_is_the_expected_hessian_of_the_negative_log_density():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from benchmarks.rmhmc import PLAN, funnel_fisher_metric, funnel_model

    dim, v = 4, 0.7
    hessian = jax.vmap(jax.hessian(lambda x: -funnel_model(dim).logdensity_fn(x)))
    rest = np.exp(v / 2) * np.random.default_rng(1).normal(size=(20000, dim - 1))
    expected = np.asarray(hessian(jnp.asarray(np.column_stack([np.full(len(rest), v), rest])))).mean(axis=0)
    metric = np.asarray(funnel_fisher_metric(dim, dense=True)(jnp.asarray([v, 5.0, -3.0, 0.1])))  # depends on v only
    np.testing.assert_array_equal(np.diag(metric), funnel_fisher_metric(dim)(jnp.asarray([v, 1.0, 2.0, 3.0])))
    # Monte Carlo error of the average: about 0.01 relative on the diagonal, 0.01 exp(-v) off it.
    np.testing.assert_allclose(metric, expected, atol=0.06)
    assert metric[0, 0] == pytest.approx(1 / 9 + (dim - 1) / 2) and np.count_nonzero(metric - np.diag(np.diag(metric))) == 0
    assert "armhmc_fisher" in PLAN["funnel"]


def test_seed_spread_passes_options_through_and_divides_by_the_baseline_of_each_seed(monkeypatch, tmp_path):
    from benchmarks import seeds

    calls = []
    values = {0: {"ahmc": 0.2, "nuts": 0.1}, 1: {"ahmc": 0.3, "nuts": 0.2}}

    def fake_main(argv):
        calls.append(argv)
        seed = int(argv[argv.index("--seed") + 1])
        return {"environment": {"cpu_model": "cpu", "nproc": 2},
                "runs": [{"model": "m", "sampler": s, "status": "ok", "metrics": {"ess_per_grad": {"min": v}}}
                         for s, v in values[seed].items()]}

    monkeypatch.setattr(seeds.bench, "main", fake_main)
    options = '{"ahmc": {"objective": "esjd"}}'
    summary = seeds.main(["--models", "m", "--samplers", "ahmc,nuts", "--baseline", "nuts", "--seeds", "0,1",
                          "--sampler-options", options, "--output", str(tmp_path / "s.json")])
    assert all(call[call.index("--sampler-options") + 1] == options for call in calls)
    row = summary["table"]["m"]["ahmc"]
    assert row["ratio_to_baseline"] == pytest.approx([2.0, 1.5])
    assert row["ratio_mean"] == pytest.approx(1.75) and row["ratio_min"] == pytest.approx(1.5)
    assert "1.75 (1.50-2.00)" in (tmp_path / "s.md").read_text()


def test_seed_spread_against_the_best_of_several_baselines_per_seed_and_per_second(monkeypatch, tmp_path):
    """``--baseline a,b`` divides by the better of a and b in each seed (per gradient), and
    ``--per-second-baseline`` adds the same table for min ESS per second."""
    from benchmarks import seeds

    grads = {0: {"ahmc": 0.3, "nuts1": 0.1, "nuts2": 0.2}, 1: {"ahmc": 0.3, "nuts1": 0.3, "nuts2": 0.1}}
    per_s = {0: {"ahmc": 10.0, "nuts1": 5.0, "nuts2": 20.0}, 1: {"ahmc": 12.0, "nuts1": 3.0, "nuts2": 4.0}}

    def fake_main(argv):
        seed = int(argv[argv.index("--seed") + 1])
        return {"environment": {"cpu_model": "cpu", "nproc": 2},
                "runs": [{"model": "m", "sampler": s, "status": "ok",
                          "metrics": {"ess_per_grad": {"min": grads[seed][s]}, "ess_per_second": {"min": per_s[seed][s]}}}
                         for s in grads[seed]]}

    monkeypatch.setattr(seeds.bench, "main", fake_main)
    summary = seeds.main(["--models", "m", "--samplers", "ahmc,nuts1,nuts2", "--baseline", "nuts1,nuts2",
                          "--per-second-baseline", "nuts1", "--seeds", "0,1", "--output", str(tmp_path / "s.json")])
    assert summary["table"]["m"]["ahmc"]["ratio_to_baseline"] == pytest.approx([1.5, 1.0])
    assert summary["per_second_table"]["m"]["ahmc"]["ratio_to_baseline"] == pytest.approx([2.0, 4.0])
    text = (tmp_path / "s.md").read_text()
    assert "the best of nuts1, nuts2 in each seed" in text and "3.00 (2.00-4.00)" in text
    with pytest.raises(SystemExit):
        seeds.main(["--models", "m", "--samplers", "ahmc,nuts1", "--baseline", "nuts1,nuts2", "--seeds", "0",
                    "--output", str(tmp_path / "t.json")])


@pytest.mark.slow  # a study script, ~14 s
def test_engine_overhead_script_times_the_three_ways_and_writes_its_table(tmp_path):
    pytest.importorskip("blackjax")
    from benchmarks import engine_overhead

    output = tmp_path / "overhead.json"
    results = engine_overhead.main(["--models", "corr_gauss_2", "--repeats", "2", "--num-iterations", "30",
                                    "--num-warmup", "60", "--output", str(output)])
    (row,) = results["models"]
    assert row["same_draws"] and row["num_iterations"] == 30
    for way in ("step", "scan_draws", "bare"):
        assert 0 < row[way]["us_per_iteration_min"] <= row[way]["us_per_iteration_median"]
        assert row[way]["steps_per_chain_iteration"] >= 1
    assert json.loads(output.read_text())["models"][0]["model"] == "corr_gauss_2"
    assert "| corr_gauss_2 | 2 | diagonal | trajectory | 4 |" in output.with_suffix(".md").read_text()
    unpooled = engine_overhead.main(["--models", "corr_gauss_2", "--repeats", "2", "--num-iterations", "30",
                                     "--num-warmup", "60", "--unpooled", "--output", str(output)])
    (row,) = unpooled["models"]
    assert row["same_draws"] and not row["pooled"] and row["bare"]["steps_per_chain_iteration"] >= 1


@pytest.mark.slow  # ~12 s; default run under 15 min (2026-11-28)
def test_grid_ceiling_script_scores_every_arm_and_rechecks_the_best(tmp_path):
    pytest.importorskip("jax")
    from benchmarks import grid_ceiling

    out = tmp_path / "ceiling.json"
    results = grid_ceiling.main(["--models", "std_gauss_10", "--num-warmup", "100", "--num-samples", "60",
                                 "--max-steps", "2", "--recheck", "2", "--recheck-seeds", "2", "--output", str(out)])
    (row,) = results["models"]
    assert len(row["grid_scores"]) == len(grid_ceiling.STEP_SIZE_FACTORS) * 2
    assert all(np.isfinite(s) and s > 0 for s in row["grid_scores"])
    assert [c["grid_score"] for c in row["rechecks"]] == sorted(row["grid_scores"], reverse=True)[:2]
    assert row["ceiling"] == max(c["recheck_mean"] for c in row["rechecks"])
    assert all(len(c["recheck_scores"]) == 2 for c in row["rechecks"])
    assert out.exists() and "ceiling" in out.with_suffix(".md").read_text()


def test_grid_ceiling_takes_its_steps_and_factors_from_the_command_line(tmp_path):
    pytest.importorskip("jax")
    from benchmarks import grid_ceiling

    out = tmp_path / "ceiling.json"
    results = grid_ceiling.main(["--models", "std_gauss_10", "--num-warmup", "100", "--num-samples", "40",
                                 "--steps", "3,7", "--factors", "0.5,1.0,1.5", "--recheck", "1",
                                 "--recheck-seeds", "1", "--output", str(out)])
    (row,) = results["models"]
    assert row["steps"] == [3, 7] and row["step_size_factors"] == [0.5, 1.0, 1.5]
    assert len(row["grid_scores"]) == 6
    (best,) = row["rechecks"]
    assert best["num_steps"] in (3, 7) and round(best["step_size_factor"], 6) in (0.5, 1.0, 1.5)
    assert "| std_gauss_10 | 10 |" in out.with_suffix(".md").read_text()
    assert " 3 x 2 |" in out.with_suffix(".md").read_text()


@pytest.mark.slow  # ~40 s; default run under 15 min (2026-11-28)
def test_armhmc_runs_on_the_logistic_regressions_and_is_skipped_elsewhere():
    jax = pytest.importorskip("jax")
    model = models.get_model("ripley")
    positions = models.initial_positions(model, 2, 0)
    out = run.SAMPLERS["armhmc"](jax.random.key(0), model, positions, 40, 20)
    assert out.draws.shape == (2, 20, model.dim) and np.all(np.isfinite(out.draws))
    # every leapfrog step costs at least one gradient and the metric's evaluations on top
    assert np.all(out.num_grads_sampling >= 20) and out.extra["units_per_draw"] > out.extra["leapfrog_steps_per_draw"]
    # The two phases are timed apart (compiled ahead of time), and the draws are run_rmhmc_chains's.
    assert out.timing["sampling_time_estimated"] is False and out.timing["phases"]["repeat_s"]["sampling"]
    from ahmc.adapters.blackjax import run_rmhmc_chains
    from benchmarks.rmhmc import metric_for

    samples, _ = run_rmhmc_chains(jax.random.key(0), model.logdensity_fn, jax.numpy.asarray(positions), 40, 20,
                                  metric=metric_for("ripley"))
    np.testing.assert_allclose(out.draws, np.asarray(samples).reshape(out.draws.shape), rtol=1e-9, atol=1e-12)
    assert run.skip_reason("armhmc", models.get_model("corr_gauss_2")).startswith("ARMHMC runs where")
    assert run.skip_reason("armhmc", model) is None
    assert "armhmc" not in run.parse_args([]).samplers and "armhmc" in run.parse_args(["--full"]).samplers


def test_dense_variants_pass_their_option_run_by_name_only_and_count_as_nuts_baselines(monkeypatch):
    from benchmarks import report, samplers

    seen = {}

    def fake(rng_key, model, positions, num_warmup, num_samples, **options):
        seen.update(options)

    monkeypatch.setattr(samplers, "run_numpyro_nuts", fake)
    variant = samplers._with_defaults(samplers.run_numpyro_nuts, "dense", dense_mass=True)
    variant(None, None, None, 1, 1, target_accept_prob=0.9)
    assert seen == {"dense_mass": True, "target_accept_prob": 0.9}
    variant(None, None, None, 1, 1, dense_mass=False)  # the caller's options win
    assert seen["dense_mass"] is False
    for name in samplers.DENSE_SAMPLERS:
        assert name not in run.parse_args([]).samplers and name not in run.parse_args(["--full"]).samplers
        assert run.skip_reason(name, models.get_model("pima")._replace(dim=201)).startswith("dense mass matrix: d = 201")
        assert run.skip_reason(name, models.get_model("pima")) is None
        assert name in report.AHMC or name in report.NUTS
    assert {"numpyro_nuts_dense", "blackjax_nuts_dense", "pymc_nuts_dense"} <= set(run.NUTS_SAMPLERS)


def test_dense_table_reads_the_committed_results():
    from benchmarks import dense_table

    lines = dense_table.table(*dense_table.load_runs())
    assert len(lines) == 2 + len(dense_table.MODELS) and all("nan" not in line for line in lines)
    assert "nutpie_low_rank" in dense_table.NUTS_DENSE and "nutpie" in dense_table.NUTS_DIAGONAL


def test_pooled_table_is_what_the_committed_runs_say(tmp_path):
    from benchmarks import pooled_table

    text = pooled_table.main(["--output", str(tmp_path / "pooled.md")])
    assert text == (pooled_table.RESULTS / "pymc_pooled.md").read_text()
    assert "| pima | `pooled=True` | 1.40 (0.04)" in text and "1.44 (0.02), 1.24-1.59 |" in text
    not_pooled = [pooled_table.RESULTS / "pymc_pooled_lr6_seed0.json"]  # its pima row ran with the default
    with pytest.raises((ValueError, KeyError)):
        pooled_table.pima_table(not_pooled, pooled_table.RESULTS / "pima_pymc_seeds50.json",
                                pooled_table.RESULTS / "pymc_traj_pima50.json")


@pytest.mark.slow  # ~16 s; default run under 15 min (2026-11-28)
def test_dense_ahmc_runner_smoke():
    pytest.importorskip("blackjax")
    jax = pytest.importorskip("jax")
    model = models.get_model("corr_gauss_2")
    out = run.SAMPLERS["ahmc_blackjax_dense"](jax.random.key(0), model, models.initial_positions(model, 2, 0), 200, 50)
    assert out.draws.shape == (2, 50, 2) and np.all(np.isfinite(out.draws))


def test_jitter_study_runs_nuts_once_per_seed_and_divides_means_and_squares_by_the_best_nuts(monkeypatch, tmp_path):
    from benchmarks import jitter

    calls = []
    # (means, squares) per sampler and fraction; NUTS only in the first fraction's run
    values = {0.0: {"nuts_a": (0.1, 0.2), "nuts_b": (0.2, 0.1), "ahmc": (0.3, 0.3)},
              0.5: {"ahmc": (0.5, 0.1)}}

    def fake_main(argv):
        calls.append(argv)
        fraction = json.loads(argv[argv.index("--sampler-options") + 1])["ahmc"]["min_steps_fraction"]
        samplers = argv[argv.index("--samplers") + 1].split(",")
        return {"environment": {"cpu_model": "cpu", "nproc": 2},
                "runs": [{"model": "m", "sampler": s, "status": "ok",
                          "metrics": {"ess_per_grad": {"min": values[fraction][s][0]},
                                      "ess_per_grad_squares": {"min": values[fraction][s][1]}}}
                         for s in samplers]}

    monkeypatch.setattr(jitter.bench, "main", fake_main)
    summary = jitter.main(["--models", "m", "--fractions", "0,0.5", "--sampler", "ahmc", "--nuts", "nuts_a,nuts_b",
                           "--seeds", "0", "--output", str(tmp_path / "j.json")])
    assert [call[call.index("--samplers") + 1] for call in calls] == ["nuts_a,nuts_b,ahmc", "ahmc"]
    assert all("--resume" in call for call in calls)  # a re-run with more seeds keeps the finished runs
    row = summary["table"]["m"]
    assert row["best_nuts_means"] == [0.2] and row["best_nuts_squares"] == [0.2]
    assert row["f0_means"]["ratio_mean"] == pytest.approx(1.5) and row["f0.5_means"]["ratio_mean"] == pytest.approx(2.5)
    assert row["f0.5_squares"]["ratio_mean"] == pytest.approx(0.5)
    assert "| m | 1.50 | 2.50 | 1.50 | 0.50 |" in (tmp_path / "j.md").read_text()

    # --baseline takes the best NUTS from that summary and runs only the AHMC sampler, with --objective.
    calls.clear()
    summary = jitter.main(["--models", "m", "--fractions", "0,0.5", "--sampler", "ahmc", "--seeds", "0",
                           "--objective", "esjd_moments", "--baseline", str(tmp_path / "j.json"),
                           "--sampler-options", '{"dense_mass": true}', "--output", str(tmp_path / "k.json")])
    assert [call[call.index("--samplers") + 1] for call in calls] == ["ahmc", "ahmc"]
    passed = [json.loads(c[c.index("--sampler-options") + 1])["ahmc"] for c in calls]
    assert all(p["objective"] == "esjd_moments" and p["dense_mass"] is True for p in passed)
    assert [p["min_steps_fraction"] for p in passed] == [0.0, 0.5]
    assert summary["nuts"] == ["nuts_a", "nuts_b"] and summary["table"]["m"]["best_nuts_means"] == [0.2]
    assert summary["table"]["m"]["f0_means"]["ratio_mean"] == pytest.approx(1.5)
    assert "objective `esjd_moments`" in (tmp_path / "k.md").read_text()
    with pytest.raises(SystemExit):
        jitter.main(["--models", "m", "--seeds", "3", "--baseline", str(tmp_path / "j.json"),
                     "--output", str(tmp_path / "k.json")])


def test_rmhmc_benchmark_passes_sampler_options_to_the_named_sampler(monkeypatch, tmp_path):
    pytest.importorskip("jax")
    from benchmarks import rmhmc
    from benchmarks.samplers import SamplerRun

    received = {}

    def recorder(name):
        def runner(rng_key, model, positions, num_warmup, num_samples, metric, **options):
            received[name] = options
            draws = np.random.default_rng(0).normal(size=(positions.shape[0], num_samples, positions.shape[1]))
            ones = np.full(positions.shape[0], num_samples)
            return SamplerRun(draws=draws, num_grads_warmup=ones, num_grads_sampling=ones,
                              num_divergent_warmup=0 * ones, num_divergent_sampling=0 * ones,
                              timing={"warmup_s": 1.0, "sampling_s": 1.0}, extra={})
        return runner

    monkeypatch.setattr(rmhmc, "SAMPLERS", {"armhmc": recorder("armhmc"), "blackjax_nuts": recorder("nuts")})
    monkeypatch.setattr(rmhmc, "MODES", {"quick": (10, 50), "full": (10, 50)})
    out = tmp_path / "r.json"
    results = rmhmc.main(["--quick", "--models", "ripley", "--samplers", "armhmc,blackjax_nuts", "--output", str(out),
                          "--sampler-options", '{"armhmc": {"shared_num_steps": false}}'])
    assert received == {"armhmc": {"shared_num_steps": False}, "nuts": {}}
    assert results["settings"]["sampler_options"] == {"armhmc": {"shared_num_steps": False}}
    with pytest.raises(SystemExit):
        rmhmc.main(["--quick", "--sampler-options", '{"nope": {}}', "--output", str(out)])


def test_models_set_their_own_draws_per_mode_unless_the_command_gives_them():
    from types import SimpleNamespace

    sv = models.get_model("stochastic_volatility")
    assert sv.full_draws == (2000, 8000) and sv.quick_draws is None
    assert models.get_model("lgcp_64").full_draws == (1000, 4000) and models.get_model("lgcp_16").full_draws is None
    full = run.parse_args(["--full"])
    assert run._draws_for(sv, full)[:2] == (2000, 8000) and "full mode" in run._draws_for(sv, full)[2]
    given = run.parse_args(["--full", "--num-samples", "500"])
    assert run._draws_for(sv, given)[:2] == (1000, 500)
    quick_model = SimpleNamespace(name="m", quick_draws=(100, 200), full_draws=None)
    assert run._draws_for(quick_model, run.parse_args([]))[:2] == (100, 200)
    assert run._draws_for(quick_model, full) == (1000, 1000, None)


def test_hand_set_rmhmc_with_girolami_calderhead_jitter_draws_fewer_steps_than_fixed_l():
    """rmhmc_gc_0.5x6 takes L_t ~ U{1..6} (mean 3.5 steps), rmhmc_fixed_0.5x6 six every time: with an
    identity metric a step costs 2 units plus the position solve's metric values (1 here: started at
    the explicit step, the solve converges at once), so a draw costs 1 + 3 L_t units."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from benchmarks.rmhmc import FIXED, SAMPLERS, funnel_model

    assert FIXED["rmhmc_gc_0.5x6"] == (0.5, 6, True) and FIXED["rmhmc_fixed_0.5x6"] == (0.5, 6, False)
    model = funnel_model(2)._replace(logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
    identity = lambda x: jnp.eye(2, dtype=x.dtype)  # noqa: E731
    starts = np.zeros((2, 2))
    cost = {}
    for name in ("rmhmc_gc_0.5x6", "rmhmc_fixed_0.5x6"):
        out = SAMPLERS[name](jax.random.key(3), model, starts, 5, 400, identity)
        assert np.all(np.isfinite(out.draws)) and out.extra["jitter"] == FIXED[name][2]
        cost[name] = out.extra["units_per_draw"]
    assert cost["rmhmc_fixed_0.5x6"] == pytest.approx(1 + 3 * 6, abs=0.5)
    # Mean of 1 + 3 L_t over 800 draws: 11.5 +- 3 sd / sqrt(800) (sd of 3 L_t is 5.1).
    assert cost["rmhmc_gc_0.5x6"] == pytest.approx(1 + 3 * 3.5, abs=1.0)


def test_rmhmc_seeds_table_divides_armhmc_by_each_hand_set_sampler_per_seed(tmp_path):
    from benchmarks import rmhmc_seeds_table

    def summary(means, squares, rhat):
        return {"ess_per_grad": {"min": means}, "ess_per_grad_squares": {"min": squares}, "rhat_max": rhat}

    files = []
    for seed, (ours, theirs) in enumerate([(0.04, 0.02), (0.06, 0.03)]):
        path = tmp_path / f"seed{seed}.json"
        path.write_text(json.dumps({"runs": {"pima": {
            "armhmc": summary(ours, 0.01, 1.002), "rmhmc_gc_0.5x6": summary(theirs, 0.0, 1.05)}}}))
        files.append(path)
    (row,) = rmhmc_seeds_table.ratios(files)
    assert row["sampler"] == "rmhmc_gc_0.5x6" and row["means"] == pytest.approx([2.0, 2.0])
    assert row["squares"] == [float("inf")] * 2 and row["rhat"] == [1.05, 1.05]
    text = rmhmc_seeds_table.main([str(f) for f in files] + ["--output", str(tmp_path / "t.md")])
    assert "| pima | rmhmc_gc_0.5x6 | 2.00, 2.00 (mean 2.00) | inf, inf (mean inf) |" in text
    # Another adaptive sampler as the numerator: every other sampler of the runs is a row.
    (row,) = rmhmc_seeds_table.ratios(files, adaptive="rmhmc_gc_0.5x6")
    assert row["sampler"] == "armhmc" and row["means"] == pytest.approx([0.5, 0.5])
    text = rmhmc_seeds_table.main([str(f) for f in files] + ["--adaptive", "rmhmc_gc_0.5x6"])
    assert "| pima | armhmc | 0.50, 0.50 (mean 0.50) | 0.00, 0.00 (mean 0.00) |" in text
    assert "`rmhmc_gc_0.5x6` max R-hat" in text


def test_rmhmc_hand_set_arms_by_name_parse_and_must_follow_armhmc():
    """``rmhmc_gc_<eps>x<L>`` / ``rmhmc_fixed_<eps>x<L>`` name any hand-set arm; other names are unknown,
    and a hand-set sampler listed before ``armhmc`` (whose warm-up end is its start) is refused."""
    from benchmarks import rmhmc

    assert rmhmc.hand_set_parameters("rmhmc_gc_0.7x4") == (0.7, 4, True)
    assert rmhmc.hand_set_parameters("rmhmc_fixed_1x3") == (1.0, 3, False)
    assert rmhmc.hand_set_parameters("rmhmc_gc_0.5x6") == rmhmc.FIXED["rmhmc_gc_0.5x6"]
    for name in ("rmhmc_gc_0x4", "rmhmc_gc_0.7x0", "rmhmc_gc_0.7", "rmhmc_jitter_0.7x4", "armhmc"):
        assert rmhmc.hand_set_parameters(name) is None
    assert rmhmc.runner("armhmc") is rmhmc.run_armhmc and rmhmc.runner("rmhmc_gc_0.7") is None
    with pytest.raises(SystemExit):
        rmhmc.main(["--models", "ripley", "--samplers", "rmhmc_gc_0.7x4,armhmc"])
    with pytest.raises(SystemExit):
        rmhmc.main(["--models", "ripley", "--samplers", "armhmc,rmhmc_gc_0.7"])


def test_compare_runs_lists_pairs_in_both_sets_and_counts_the_changed_ones(tmp_path):
    from benchmarks.compare_runs import main

    def run(model, ess, restarts, steps=(3, 4), rhat=1.004):
        return {"model": model, "sampler": "ahmc_blackjax", "status": "ok",
                "extra": {"restarts": restarts, "final_num_steps": list(steps)},
                "metrics": {"ess_per_grad": {"min": ess}, "ess_per_grad_squares": {"min": ess / 2}, "rhat_max": rhat}}

    def write(name, seed, runs):
        path = tmp_path / name
        path.write_text(json.dumps({"environment": {"seed": seed}, "runs": runs}))
        return str(path)

    before = write("before.json", 0, [run("pima", 0.2, [0, 0]), run("earnings", 0.018, [0, 0]), run("kidiq", 0.03, [0])])
    after = write("after.json", 0, [run("pima", 0.2, [0, 0]), run("earnings", 0.02, [1, 0])])
    before_1 = write("before_1.json", 1, [run("earnings", 0.012, [0], steps=(1, 5), rhat=1.02)])
    after_1 = write("after_1.json", 1, [run("earnings", 0.016, [0])])
    output = tmp_path / "table.md"
    counts = main(["--before", before, before_1, "--after", after, after_1, "--output", str(output)])
    assert (counts["pairs"], counts["changed"], counts["below"]) == (3, 2, 0)
    # pima 1x, earnings 1.11x (seed 0) and 1.33x (seed 1)
    assert counts["geometric_mean"] == pytest.approx((0.02 / 0.018 * 0.016 / 0.012) ** (1 / 3))
    text = output.read_text()
    assert "| earnings | ahmc_blackjax | 0 | 0.018 | 0.02 | 1.11x |" in text and "| 0 | 1 |" in text
    assert "| pima | ahmc_blackjax | 0 | 0.2 | 0.2 | same |" in text and "kidiq" not in text
    # The summary over seeds: earnings' means of 0.018, 0.012 and of 0.02, 0.016; the squares half of
    # them; the larger R-hat; seed 1's before-run had a chain at L = 1.
    assert "| earnings | ahmc_blackjax | 2 | 0.015 | 0.018 | 0.0075 | 0.009 | 1.020 | 1.004 | 1 | 0 |" in text
    assert "| pima | ahmc_blackjax | 1 | 0.2 | 0.2 | 0.1 | 0.1 | 1.004 | 1.004 | 0 | 0 |" in text


def test_dense_auto_excess_sees_the_correlation_of_the_correlated_gaussian():
    from benchmarks.dense_auto_excess import excess_row

    row = excess_row("corr_gauss_2", seed=0, num_warmup=400)
    assert row["dim"] == 2 and row["draws"] > 100
    assert row["max_abs_correlation"] > 0.9 and row["excess"] > 10  # correlation 0.99: far above the noise


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="counts Linux memory maps")
@pytest.mark.slow  # ~20 s; default run under 15 min (2026-11-28)
def test_finished_runs_give_back_the_memory_maps_of_their_compiled_programs():
    """A long benchmark compiles hundreds of programs in one process; JAX's caches would keep them all,
    with their memory maps, until Linux's vm.max_map_count makes XLA's compiler crash.
    ``run.free_compiled_programs`` (called after every run) must release them."""
    jax = pytest.importorskip("jax")
    from ahmc.adapters.blackjax import run_chains

    def maps():
        return len(Path("/proc/self/maps").read_bytes().splitlines())

    before = maps()
    run_chains(jax.random.key(0), lambda x: -0.5 * jax.numpy.sum(x**2), np.zeros((2, 3)), 30, 20)
    grown = maps() - before
    assert grown > 500  # one engine run compiles programs worth ~1000 maps
    run.free_compiled_programs()
    assert maps() - before < 0.2 * grown


def test_summary_takes_the_best_nuts_from_another_run_made_the_same_way(tmp_path):
    from benchmarks.readme_table import summary

    settings = {"num_chains": 4, "num_warmup": 1000, "num_samples": 1000, "dtype": "float64"}

    def run(sampler, ess_grad, ess_second=1.0):
        return {"model": "pima", "sampler": sampler, "status": "ok",
                "metrics": {"ess_per_grad": {"min": ess_grad}, "ess_per_second": {"min": ess_second},
                            "rhat_max": 1.004}}

    def write(name, runs, seed=0):
        path = tmp_path / name
        path.write_text(json.dumps({"mode": "full", "settings": settings, "environment": {"seed": seed},
                                    "models": {"pima": {"dim": 8}}, "runs": runs}))
        return str(path)

    mine = write("mine.json", [run("numpyro_nuts", 0.12, 2.0), run("ahmc_blackjax", 0.24, 3.0)])
    other = write("other.json", [run("pymc_nuts", 0.16), run("ahmc_blackjax", 0.5)])
    alone, merged = summary(mine, "ahmc_blackjax"), summary(mine, "ahmc_blackjax", other)
    assert "0.12 (numpyro_nuts) | 2.00x | 1.50x |" in alone
    assert "0.16 (pymc_nuts) | 1.50x | 1.50x |" in merged  # per second stays against this run's NumPyro NUTS
    with pytest.raises(SystemExit, match="mode/seed"):
        summary(mine, "ahmc_blackjax", write("seed1.json", [run("pymc_nuts", 0.16)], seed=1))


def test_rhat_budget_plans_draws_from_the_best_nuts_gradients_and_tables_the_rerun(tmp_path):
    from benchmarks.rhat_budget import plan, table

    def run(model, sampler, ess_grad, rhat, sampling_grads, draws=1000, ess=500.0):
        return {"model": model, "sampler": sampler, "status": "ok", "num_warmup": 1000, "num_samples": draws,
                "metrics": {"ess_per_grad": {"min": ess_grad}, "rhat_max": rhat, "ess_bulk": {"min": ess},
                            "grads": {"sampling": sampling_grads}}}

    results = {"environment": {"seed": 3}, "runs": [
        run("gauss", "ahmc_blackjax", 0.4, 1.021, 6000),      # 6 sampling gradients per draw (all chains)
        run("gauss", "ahmc_numpyro", 0.4, 1.004, 6000),       # converged: not planned
        run("gauss", "numpyro_nuts", 0.2, 1.002, 26000),
        run("gauss", "blackjax_nuts", 0.3, 1.003, 26400),     # the best NUTS per gradient
        run("other", "ahmc_pymc", 0.1, 1.05, 1000),           # no NUTS beside it: not planned
    ]}
    entries = plan(results)
    assert [(e["model"], e["sampler"], e["nuts"]) for e in entries] == [("gauss", "ahmc_blackjax", "blackjax_nuts")]
    assert entries[0]["draws"] == 4400  # 26400 / (6000 / 1000)
    assert "--num-warmup 1000 --num-samples 4400 --seed 3" in entries[0]["command"]
    rerun = tmp_path / "rerun.json"
    rerun.write_text(json.dumps({"runs": [run("gauss", "ahmc_blackjax", 0.5, 1.004, 26400, draws=4400, ess=2200.0)]}))
    row = table(results, [str(rerun)]).splitlines()[-1]
    assert row == ("| gauss | ahmc_blackjax | 1000 / 4400 | 1.000x | 1.021 / **1.004** | 500 / 2200 | "
                   "blackjax_nuts: 1000, 1.003, 500 |")


def test_centered_eight_schools_density_and_reference_scoring(monkeypatch, tmp_path):
    """The RMHMC benchmark's centered eight schools: NumPyro's flat log density (mu, log tau, theta) equals
    the model written out (up to a constant), and its runs are scored against the non-centered reference."""
    pytest.importorskip("numpyro")
    import jax
    from scipy import stats

    from benchmarks import rmhmc
    from benchmarks.samplers import SamplerRun

    model = rmhmc.eight_schools_centered_model()

    def by_hand(x):
        mu, tau, theta = x[0], np.exp(x[1]), x[2:]
        return (stats.norm.logpdf(mu, 0, 5) + stats.halfcauchy.logpdf(tau, scale=5) + x[1]
                + stats.norm.logpdf(theta, mu, tau).sum()
                + stats.norm.logpdf(rmhmc.EIGHT_SCHOOLS_Y, theta, rmhmc.EIGHT_SCHOOLS_SIGMA).sum())

    with jax.enable_x64(True):
        points = np.random.default_rng(2).normal(size=(3, 10))
        ours = [float(model.logdensity_fn(jax.numpy.asarray(p))) for p in points]
    np.testing.assert_allclose(np.diff(ours), np.diff([by_hand(p) for p in points]), rtol=1e-9)

    def near_reference(rng_key, model, positions, num_warmup, num_samples, metric, **options):
        rng = np.random.default_rng(0)  # draws around the reference means: tau 3.6, mu 4.4, theta 3.6-6.3
        centre = np.r_[4.41, np.log(3.6), [6.15, 4.94, 3.91, 4.80, 3.61, 4.05, 6.32, 4.88]]
        draws = centre + 0.01 * rng.normal(size=(positions.shape[0], num_samples, 10))
        ones = np.full(positions.shape[0], num_samples)
        return SamplerRun(draws=draws, num_grads_warmup=ones, num_grads_sampling=ones,
                          num_divergent_warmup=0 * ones, num_divergent_sampling=0 * ones,
                          timing={"warmup_s": 1.0, "sampling_s": 1.0}, extra={})

    monkeypatch.setattr(rmhmc, "SAMPLERS", {"armhmc": near_reference})
    monkeypatch.setattr(rmhmc, "MODES", {"quick": (10, 200), "full": (10, 200)})
    out = tmp_path / "e.json"
    results = rmhmc.main(["--quick", "--models", "eight_schools_centered", "--samplers", "armhmc", "--output", str(out)])
    z = results["runs"]["eight_schools_centered"]["armhmc"]["reference_z"]
    assert z["max_abs_z_reference"] < 4  # means at the reference's: small z
    assert z["max_abs_z_reference_sq"] > 4  # a spread of 0.01 misses the posterior's mean squares
    assert "Against the posteriordb reference" in out.with_suffix(".md").read_text()


def test_centered_gp_density_and_its_derived_quantities():
    """The RMHMC benchmark's centered gp_pois_regr: NumPyro's flat log density (log alpha, f_1..11, log rho)
    equals the model written out (up to a constant), and the draws map to the reference's rho, alpha, f."""
    pytest.importorskip("numpyro")
    import jax
    from scipy import stats

    from benchmarks import rmhmc
    from benchmarks.posteriordb import load_data

    model = rmhmc.gp_pois_regr_centered_model()
    data = load_data(rmhmc.GP_POSTERIOR)
    x, counts = np.asarray(data["x"], float), np.asarray(data["k"])
    assert model.dim == 13

    def by_hand(point):
        alpha, f, rho = np.exp(point[0]), point[1:-1], np.exp(point[-1])
        cov = alpha**2 * np.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * rho**2)) + 1e-10 * np.eye(len(x))
        return (stats.gamma.logpdf(rho, 25.0, scale=1 / 4.0) + point[-1] + stats.halfnorm.logpdf(alpha, scale=2.0)
                + point[0] + stats.multivariate_normal.logpdf(f, np.zeros(len(x)), cov)
                + stats.poisson.logpmf(counts, np.exp(f)).sum())

    points = np.r_[np.log(2.9), np.full(11, 3.0), np.log(5.7)] + 0.1 * np.random.default_rng(3).normal(size=(3, 13))
    with jax.enable_x64(True):
        ours = [float(model.logdensity_fn(jax.numpy.asarray(p))) for p in points]
    np.testing.assert_allclose(np.diff(ours), np.diff([by_hand(p) for p in points]), rtol=1e-7)
    derived = model.derived_fn(points[None])
    np.testing.assert_allclose(derived["rho"][0], np.exp(points[:, -1]))
    np.testing.assert_allclose(derived["alpha"][0], np.exp(points[:, 0]))
    np.testing.assert_allclose(derived["f"][0], points[:, 1:-1])


def test_warmup_cost_splits_the_gradients_by_phase_and_restores_the_early_cap():
    from ahmc.adapters import _jax_engine
    from benchmarks.warmup_cost import PHASES, phase_bounds, run_one, table

    assert phase_bounds(1000, 0.5) == [(0, 100), (100, 500), (500, 1000), (1000, None)]  # Stan's first window
    saved = _jax_engine.EARLY_MAX_STEPS
    record = run_one(models.get_model("std_gauss_10"), 0, {"early_max_steps": 1}, num_warmup=200, num_samples=100)
    assert _jax_engine.EARLY_MAX_STEPS == saved
    steps = record["steps_per_iteration"]
    assert steps["early"] == 1.0 and steps["gp_warmup"] > 1.0  # the cap holds only until the first window
    lengths = [b - a for a, b in phase_bounds(200, 0.5)[:3]]
    assert sum(steps[p] * n * 4 for p, n in zip(PHASES, lengths)) == pytest.approx(record["grads_warmup"])
    assert steps["sampling"] * 100 * 4 == pytest.approx(record["grads_sampling"])
    text = table([{"variant": "cap 1", **record}, {"variant": "cap 1", **record}])
    assert "| std_gauss_10 | cap 1 | 2 |" in text and "± 0 |" in text


def test_targets_over_seeds_tell_a_target_met_on_average_from_one_met_in_every_seed(tmp_path):
    from benchmarks import targets_seeds

    settings = {"num_chains": 4, "num_warmup": 1000, "num_samples": 1000, "dtype": "float64"}

    def record(model, sampler, grad, second, rhat, warm=None):
        m = {"ess_per_grad": {"min": grad}, "ess_per_second": {"min": second},
             "ess_per_grad_with_warmup": {"min": grad / 2 if warm is None else warm}, "rhat_max": rhat}
        return {"model": model, "sampler": sampler, "status": "ok", "metrics": m}

    def write(seed, runs, **changed):
        path = tmp_path / f"seed{seed}.json"
        path.write_text(json.dumps({"mode": "quick", "settings": {**settings, **changed},
                                    "environment": {"seed": seed, "command": f"run {seed}", "git_commit": "abc1234"},
                                    "models": {"pima": {}, "kidiq": {}}, "runs": runs}))
        return str(path)

    seed0 = write(0, [record("pima", "numpyro_nuts", 0.10, 10.0, 1.001),
                      record("pima", "pymc_nuts", 0.12, 2.0, 1.001),
                      record("pima", "ahmc_blackjax", 0.18, 12.0, 1.004),   # 1.5x the best NUTS, 1.2x per second
                      record("pima", "ahmc_pymc", 0.15, 1.0, 1.001),
                      record("kidiq", "numpyro_nuts", 0.02, 10.0, 1.0),
                      record("kidiq", "ahmc_blackjax", 0.03, 9.0, 1.02),
                      record("kidiq", "ahmc_numpyro", 0.03, 9.0, 1.0)])
    seed1 = write(1, [record("pima", "numpyro_nuts", 0.10, 10.0, 1.001),
                      record("pima", "pymc_nuts", 0.10, 3.0, 1.001),
                      record("pima", "ahmc_blackjax", 0.12, 8.0, 1.003),    # 1.2x (mean 1.35x: met on average)
                      record("pima", "ahmc_pymc", 0.15, 1.0, 1.001),
                      record("kidiq", "numpyro_nuts", 0.02, 10.0, 1.0),
                      record("kidiq", "ahmc_blackjax", 0.01, 12.0, 1.0)])
    runs = targets_seeds.load([seed0, seed1])
    cells = targets_seeds.per_seed(runs)
    assert ("ahmc_numpyro", "kidiq") not in cells  # not run in seed 1: not counted
    pima = {key: targets_seeds.spread(values) for key, values in cells[("ahmc_blackjax", "pima")].items()}
    assert pima["grad_ratio"]["mean"] == pytest.approx(1.35) and pima["grad_ratio"]["seeds_met"] == 1
    assert targets_seeds.mean_met("grad_ratio", pima["grad_ratio"])
    assert pima["second_ratio"]["mean"] == pytest.approx(1.0)
    assert targets_seeds.mean_met("second_ratio", pima["second_ratio"])
    kidiq = {key: targets_seeds.spread(values) for key, values in cells[("ahmc_blackjax", "kidiq")].items()}
    assert kidiq["grad_ratio"]["mean"] == pytest.approx(1.0) and kidiq["grad_ratio"]["seeds_met"] == 1
    assert not targets_seeds.mean_met("rhat", kidiq["rhat"])  # R-hat must hold in every seed
    text = targets_seeds.markdown(runs)
    assert "| ahmc_blackjax | min ESS/grad vs best NUTS | 2 of 2 | 0 of 2 | none |" in text
    assert "| ahmc_blackjax | max R-hat | 1 of 2 | 1 of 2 | kidiq 1.010 (1.000-1.020), 1 of 2 |" in text
    assert "| pymc_nuts | 0 of 1 | pima 0.25x |" in text  # PyMC's NUTS per second against NumPyro's
    nuts, ratios = targets_seeds.same_framework_per_second(runs)["ahmc_pymc"]  # against PyMC's NUTS, not NumPyro's
    assert nuts == "pymc_nuts" and ratios["pima"] == pytest.approx([0.5, 1.0 / 3.0])
    assert "| ahmc_blackjax | min ESS/s vs NumPyro's NUTS | 2 of 2 | 0 of 2 | none |" in text  # means 1.0x, 1.05x
    with pytest.raises(SystemExit, match="was not made like"):
        targets_seeds.load([seed0, write(2, [], num_samples=500)])


def test_table1_shows_gradients_per_draw_and_the_arm_each_chain_ended_on():
    from benchmarks import report

    def record(sampler, extra, per_draw):
        chain = {"ess_per_grad": {"min": 0.2, "median": 0.3, "max": 0.4}}
        return {"model": "ripley", "sampler": sampler, "status": "ok", "extra": extra,
                "metrics": {"num_chains": 2, "per_chain": [chain, chain], "rhat_max": 1.002,
                            "ess_per_grad": {"min": 0.2, "median": 0.3, "max": 0.4}, "grads": {"per_draw": per_draw}}}

    results = {"runs": [
        record("ahmc_numpyro", {"final_step_size": [1.29, 1.29], "final_num_steps": [1.0, 1.0]}, 1.0),
        record("ahmc_pymc", {"final_step_size": [0.614, 0.587], "final_num_steps": [5.0, 1.0]}, 2.62),
        record("blackjax_nuts", {}, 3.3)]}
    rows = report.table1(results, "ripley")
    assert rows[0].endswith("| grads / draw | final arm: step size / L |")
    assert rows[2].endswith("| 1 | 1.29 / 1 |")
    assert rows[3].endswith("| 2.62 | 0.587-0.614 / 1-5 |")
    assert rows[4].endswith("| 3.3 | - |")
