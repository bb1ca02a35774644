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

from .reference import assert_moments_match, time_major

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
def test_ahmc_runner_calls_run_chains_and_times_compilation_apart():
    """The ahmc_blackjax runner measures the public run_chains: its draws and step counts with the same
    key, the final box, and compile and run times taken apart."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from ahmc.adapters.blackjax import run_chains

    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 3, 0)
    key = jax.random.key(5)
    out = run.SAMPLERS["ahmc_blackjax"](key, model, positions, 60, 40)
    samples, info, state = run_chains(key, model.logdensity_fn, jnp.asarray(positions), 60, 40, return_state=True)
    assert out.keep["tuning"]["info"]["num_integration_steps"].shape == (3, 100)  # as run_chains returns it
    info = time_major(info)  # run_chains: (chains, iterations)
    np.testing.assert_array_equal(out.draws, np.asarray(samples))
    steps = np.asarray(info.num_integration_steps)
    np.testing.assert_array_equal(out.num_grads_warmup, steps[:60].sum(axis=0))
    np.testing.assert_array_equal(out.num_grads_sampling, steps[60:].sum(axis=0))
    assert out.num_grads_sampling.sum() > 0
    assert out.keep["tuning"]["search_box"][1].tolist() == np.asarray(state.box.num_steps).tolist()
    assert out.extra["final_step_size"] == np.asarray(info.step_size)[-1].tolist()
    timing = out.timing
    assert timing["sampling_time_estimated"]  # one program: the run is split by the phases' gradients
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


@pytest.mark.slow  # ~10 s each
@pytest.mark.parametrize("sampler", ["numpyro_nuts", "ahmc_numpyro"])  # same code path
def test_numpyro_runners_are_one_mcmc_run_as_users_call_it(sampler, jax_x64):
    """The NumPyro runners time one MCMC.run: its draws are a plain MCMC.run's with the same key, and
    its warm-up gradients are those MCMC.warmup collects."""
    jax = pytest.importorskip("jax")
    numpyro_infer = pytest.importorskip("numpyro.infer")
    from ahmc.adapters.numpyro import AdaptiveHMC
    from benchmarks import samplers

    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 2, 0)
    out = run.SAMPLERS[sampler](jax.random.key(1), model, positions, 50, 40, chain_method="vectorized")
    kernel_class = AdaptiveHMC if sampler == "ahmc_numpyro" else numpyro_infer.NUTS

    def mcmc():
        kernel = kernel_class(potential_fn=samplers.numpyro_potential(model.logdensity_fn))
        return numpyro_infer.MCMC(kernel, num_warmup=50, num_samples=40, num_chains=2,
                                  chain_method="vectorized", progress_bar=False)

    plain = mcmc()
    plain.run(jax.random.key(1), init_params=jax.numpy.asarray(positions))
    np.testing.assert_array_equal(out.draws, np.asarray(plain.get_samples(group_by_chain=True)))
    warm = mcmc()
    warm.warmup(jax.random.key(1), init_params=jax.numpy.asarray(positions), extra_fields=("num_steps",),
                collect_warmup=True)
    steps = np.asarray(warm.get_extra_fields(group_by_chain=True)["num_steps"])
    np.testing.assert_array_equal(out.num_grads_warmup, steps.sum(axis=1))
    assert (out.num_grads_sampling > 0).all()
    timing = out.timing
    assert list(timing["phases"]["wall_s"]) == ["run"] and timing["sampling_time_estimated"]
    assert timing["compile_s"] > 0 and timing["warmup_s"] > 0 and timing["sampling_s"] > 0
    if sampler == "ahmc_numpyro":  # two chains cannot restart one another (the slow test restarts one)
        assert out.extra["restarts"] == [0.0, 0.0]


def test_numpyro_kernels_get_the_potential_jitted_as_a_model_users_nuts_does(monkeypatch, jax_x64):
    """NumPyro evaluates a ``potential_fn`` once outside its loop; unjitted, every primitive of the log
    density compiles alone there, a cost ``NUTS(model)`` does not pay. Both NumPyro runners get it jitted."""
    import logging

    jax = pytest.importorskip("jax")
    pytest.importorskip("numpyro")
    from benchmarks import samplers

    model = models.get_model("pima")
    x = jax.numpy.asarray(models.initial_positions(model, 1, 0)[0])
    potential = samplers.numpyro_potential(model.logdensity_fn)
    np.testing.assert_allclose(potential(x), -model.logdensity_fn(x), rtol=1e-12)

    compiles = []

    class Count(logging.Handler):
        def emit(self, record):
            if "Finished XLA compilation" in record.getMessage():
                compiles.append(record.getMessage())

    handler, logger = Count(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            jax.value_and_grad(potential)(x)
            jitted = len(compiles)
            jax.value_and_grad(lambda z: -model.logdensity_fn(z))(x + 1.0)
            plain = len(compiles) - jitted
    finally:
        logger.removeHandler(handler)
    assert jitted <= 4 and plain >= 5 * max(jitted, 1), (jitted, plain)  # measured: 3 against 31

    seen = []
    for runner, kernel in (("run_numpyro_nuts", "NUTS"), ("run_ahmc_numpyro", "AdaptiveHMC")):
        module = __import__("numpyro.infer", fromlist=["NUTS"]) if kernel == "NUTS" else \
            __import__("ahmc.adapters.numpyro", fromlist=["AdaptiveHMC"])

        def fake(*args, potential_fn=None, **options):
            seen.append(potential_fn)
            raise RuntimeError("stop")

        monkeypatch.setattr(module, kernel, fake)
        with pytest.raises(RuntimeError, match="stop"):
            getattr(samplers, runner)(jax.random.key(0), model, np.zeros((2, model.dim)), 5, 5)
    assert len(seen) == 2 and all(hasattr(fn, "lower") for fn in seen)  # jax.jit's wrapped functions


@pytest.mark.slow  # ~50 s; default run under 15 min (2026-11-28)
def test_nuts_with_chains_one_after_another_draws_what_vectorized_nuts_draws(jax_x64):
    """chain_method="sequential" (NumPyro's CPU default, and the benchmark's for NumPyro's NUTS) changes the
    loop, not the draws."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("numpyro")
    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 2, 0)
    # jax_x64: the benchmark's precision (float32 rounding can move BlackJAX's warm-up apart)
    for sampler in ("blackjax_nuts", "numpyro_nuts"):
        vectorized = run.SAMPLERS[sampler](jax.random.key(1), model, positions, 50, 40, chain_method="vectorized")
        sequential = run.SAMPLERS[sampler](jax.random.key(1), model, positions, 50, 40, chain_method="sequential")
        np.testing.assert_allclose(sequential.draws, vectorized.draws, rtol=1e-7, atol=1e-9)
    assert sequential.extra["chain_method"] == "sequential"
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
    from PIL import Image  # matplotlib's dependency
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
    assert "## The open issues' targets" in report and "### kidiq" in report
    assert "| - | max R-hat < 1.01, every model | `ahmc_blackjax` | " in report
    for figure in ("tiny_fig2_boxes_1.png", "tiny_fig3_ahmc_vs_nuts.png", "tiny_fig_tuning.png"):
        assert f"]({figure})" in report
        with Image.open(tmp_path / figure) as image:  # drawn: points, lines and text in several colours
            assert image.size[0] > 300 and image.getcolors(maxcolors=8) is None  # None: more than 8

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
    assert [run["made"]["date_utc"] for run in results["runs"]] == [env["date_utc"]] * 2 + [
        results["environment"]["date_utc"]] * 2  # each run says which invocation made it
    assert "Resumed (`--resume`) across invocations; the runs each made:" in output.with_suffix(".md").read_text()


def test_resume_keeps_the_draws_note_of_a_model_it_keeps(tmp_path, jax_x64):
    """A model kept whole by --resume keeps its note on draws other than the run's (full mode's longer
    runs), from its kept header: it is not built again to find them."""
    import json

    output = tmp_path / "tiny.json"
    command = _tiny_command(output)[3:]
    earlier = {"mode": "quick", "settings": {"num_chains": 2, "num_warmup": 100, "num_samples": 50,
                                             "dtype": "float64", "sampler_options": {}},
               "environment": {"seed": 3, "command": "earlier", "date_utc": "2026-12-05", "git_commit": "a7b10a6",
                               "git_dirty": False, "cpu_model": "Intel"},
               "models": {"kidiq": {"description": "kidiq", "dim": 3, "num_warmup": 100, "num_samples": 400}},
               "runs": [{"model": "kidiq", "sampler": name, "status": "skipped", "reason": "r", "elapsed_s": 0.0}
                        for name in ("ahmc_blackjax", "blackjax_nuts")],
               "total_elapsed_s": 1.0}
    output.write_text(json.dumps(earlier))
    run.main([*command, "--resume", "--no-figures"])
    results = json.loads(output.read_text())
    assert results["notes"] == ["quick mode: kidiq uses 100 warm-up / 400 draws per chain"]
    assert results["environment"]["earlier_invocations"][0]["cpu_model"] == "Intel"


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


def test_meads_runner_counts_every_chain_and_samples_the_target():
    """MEADS through the runner contract: 16 chains in its 4 folds (with 2 chains per fold its step size
    collapses), one gradient per chain and iteration."""
    pytest.importorskip("blackjax")
    model = models.get_model("std_gauss_10")  # corr_gauss_2 (correlation 0.99) mixes slowly with its diagonal
    positions = models.initial_positions(model, 2, seed=0).astype(np.float32)
    import jax

    with jax.enable_x64(False):
        out = run.SAMPLERS["meads"](jax.random.key(0), model, positions, 400, 500, num_chains=16)
    assert out.draws.shape == (16, 500, 10) and np.all(np.isfinite(out.draws))
    assert np.all(out.num_grads_warmup == 400) and np.all(out.num_grads_sampling == 500)
    assert out.extra["num_chains"] == 16 and out.extra["step_size"] > 0 and 0 < out.extra["alpha"] <= 1
    assert_moments_match(out.draws, model.mean, model.sd, min_ess=100)


def test_adjusted_mclmc_runner_tunes_in_the_warmup_budget_and_samples_the_target():
    """Adjusted MCLMC through the runner contract: one tuning per chain in about num_warmup iterations,
    two gradients per integration step, draws matching the target."""
    pytest.importorskip("blackjax")
    model = models.get_model("std_gauss_10")
    positions = models.initial_positions(model, 4, seed=0).astype(np.float32)
    import jax

    with jax.enable_x64(False):
        out = run.SAMPLERS["adjusted_mclmc"](jax.random.key(0), model, positions, 400, 500)
    assert out.draws.shape == (4, 500, 10) and np.all(np.isfinite(out.draws))
    steps = np.asarray(out.extra["mean_num_steps"])
    # sampling: 2 gradients per step, about the tuned mean number of steps per draw (uniform jitter)
    assert np.all(np.abs(out.num_grads_sampling / (2 * 500) - steps) < 0.25 * steps + 1)
    assert np.all(out.num_grads_warmup >= 2 * 400)  # at least one step per tuning iteration
    assert_moments_match(out.draws, model.mean, model.sd, min_ess=100)


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


def test_the_issues_targets_are_computed_on_the_strict_metric_against_each_targets_peers():
    from benchmarks import targets

    def record(model, sampler, ess, grads, seconds, compile_s=1.0, rhat=1.002, z=None):
        metrics = {"ess_bulk": {"min": ess}, "ess_bulk_squares": {"min": ess * 2},  # strict: the means here
                   "grads": {"warmup": grads / 2, "sampling": grads / 2}, "rhat_max": rhat}
        if z is not None:
            metrics["max_abs_z_reference"], metrics["max_abs_z_reference_sq"] = z
        return {"model": model, "sampler": sampler, "status": "ok", "metrics": metrics,
                "timing": {"compile_s": compile_s, "warmup_s": (seconds - compile_s) / 2,
                           "sampling_s": (seconds - compile_s) / 2}}

    results = {"models": {"pima": {}, "kidiq": {}}, "runs": [
        record("pima", "numpyro_nuts", 100.0, 1000, 10.0, compile_s=6.0),
        record("pima", "numpyro_nuts_vectorized", 120.0, 1000, 8.0, compile_s=4.0),  # the best per second: 15/s
        record("pima", "chees", 400.0, 1000, 5.0, rhat=1.001),                         # best converged peer
        record("pima", "meads", 9000.0, 1000, 1.0, rhat=1.3),                          # not converged: left out
        record("pima", "ahmc_numpyro", 300.0, 1000, 10.0, compile_s=6.5, z=(1.0, 4.5)),  # 30/s = 2x; z 4.5
        record("kidiq", "numpyro_nuts_vectorized", 100.0, 1000, 10.0, compile_s=5.0),
        record("kidiq", "ahmc_numpyro", 120.0, 500, 10.0, compile_s=5.0, rhat=1.02),   # 1.2x per second
    ]}  # fmt: skip
    rows = {(row["target"], row["route"]): row for row in targets.evaluate(results)}
    every = rows["per second >= 1.3x the best NumPyro NUTS, every model", "ahmc_numpyro"]
    assert (every["passing"], every["models"], every["met"]) == (1, 2, False)
    assert every["worst"] == ("kidiq", pytest.approx(1.2), "numpyro_nuts_vectorized")
    mean = rows["per second >= 1.5x the best NumPyro NUTS, geometric mean", "ahmc_numpyro"]
    assert mean["mean"] == pytest.approx((2.0 * 1.2) ** 0.5) and mean["met"]  # 1.55x
    peer = rows["per gradient >= 1x the best converged peer, every model", "ahmc_numpyro"]
    assert peer["worst"] == ("pima", pytest.approx(0.75), "chees") and not peer["met"]  # kidiq: 0.24 vs 0.1
    compile_row = rows["compile time <= 1.5x the same framework's NUTS, every model", "ahmc_numpyro"]
    assert compile_row["worst"] == ("pima", pytest.approx(6.5 / 4.0), "numpyro_nuts_vectorized")
    assert not compile_row["met"] and compile_row["passing"] == 1
    rhat = rows["max R-hat < 1.01, every model", "ahmc_numpyro"]
    assert rhat["worst"][:2] == ("kidiq", 1.02) and not rhat["met"]
    z = rows["max |z| of means and variances <= 4, every model with a reference", "ahmc_numpyro"]
    assert z["models"] == 1 and z["worst"][1] == 4.5 and not z["met"]
    assert not any(route == "ahmc_blackjax" for _, route in rows)  # a route that did not run has no rows
    table = "\n".join(targets.targets_table(results))
    assert "| 61 | per second >= 1.3x the best NumPyro NUTS, every model | `ahmc_numpyro` | 1 of 2 | kidiq 1.2x (numpyro_nuts_vectorized)" in table
    assert "**missed**" in table and "| met |" in table
    assert targets._chain_note(results) == ""
    results["settings"] = {"num_chains": 4}
    results["runs"][2]["metrics"]["num_chains"] = 16
    assert targets._chain_note(results).startswith(" Chains: 4 a sampler, but chees 16 (their")
    results["runs"].append(dict(results["runs"][2], model="kidiq", metrics={**results["runs"][2]["metrics"], "num_chains": 5}))
    assert targets._chain_note(results).startswith(" Chains: 4 a sampler, but chees 16 (5 on some models) (")


def test_the_headline_faces_every_converged_sampler_per_gradient():
    from benchmarks import headline

    def record(model, sampler, ess, grads, rhat=1.001):
        return {"model": model, "sampler": sampler, "status": "ok",
                "metrics": {"ess_bulk": {"min": ess}, "ess_bulk_squares": {"min": ess},
                            "grads": {"warmup": grads, "sampling": grads}, "rhat_max": rhat}}

    results = {"models": {"pima": {}, "kidiq": {}}, "runs": [
        record("pima", "numpyro_nuts", 100.0, 500),        # 0.1 per gradient
        record("pima", "chees", 300.0, 500),               # 0.3: the best peer here
        record("pima", "meads", 900.0, 500, rhat=1.2),     # not converged: left out
        record("pima", "armhmc", 900.0, 500),              # ahmc's own: left out
        record("pima", "ahmc_numpyro", 150.0, 500),        # 0.15 -> 0.5x
        record("kidiq", "numpyro_nuts", 100.0, 500),
        record("kidiq", "ahmc_numpyro", 200.0, 500),       # 2x
    ]}  # fmt: skip
    line = headline.every_peer_line(results, "ahmc_numpyro")
    assert "geometric mean 1x" in line and "behind on 1 of 2: pima 0.50x (chees)" in line
    assert headline.every_peer_line(results, "ahmc_pymc") == ""


def test_the_readme_summary_has_one_row_per_route_with_its_geometric_means(tmp_path):
    import json

    from benchmarks import headline

    def record(model, sampler, ess, grads, seconds, rhat=1.002):
        return {"model": model, "sampler": sampler, "status": "ok",
                "metrics": {"ess_bulk": {"min": ess}, "ess_bulk_squares": {"min": ess},
                            "grads": {"warmup": grads, "sampling": grads}, "rhat_max": rhat},
                "timing": {"compile_s": seconds / 2, "warmup_s": seconds / 4, "sampling_s": seconds / 4}}

    results = {"mode": "quick", "models": {"pima": {"dim": 8}, "kidiq": {"dim": 3}},
               "settings": {"num_chains": 4, "num_warmup": 1000, "num_samples": 1000, "dtype": "float64"},
               "environment": {"git_commit": "abcdef0123", "seed": 0, "cpu_model": "CPU", "nproc": 2,
                               "date_utc": "2026-12-06T00:00"},
               "runs": [record("pima", "numpyro_nuts", 100.0, 500, 1.0),
                        record("pima", "ahmc_numpyro", 200.0, 250, 4.0, rhat=1.008),   # 0.5x per s, 4x per grad
                        record("kidiq", "numpyro_nuts", 100.0, 500, 1.0),
                        record("kidiq", "ahmc_numpyro", 200.0, 500, 1.0)]}             # 2x per s, 2x per grad
    path = tmp_path / "bench_quick.json"
    path.write_text(json.dumps(results))
    summary = headline.summary_markdown(path)
    rows = [line for line in summary.splitlines() if line.startswith("| NumPyro")]
    assert rows == ["| NumPyro `AdaptiveHMC` (`ahmc_numpyro`) | 1x | 1 of 2: pima 0.50x | 2.8x | 2.8x, behind on 0 of 2 "
                    "| 1.008 |"]
    assert "ahmc_pymc" not in summary  # routes without runs have no row
    text = "before\n<!-- results bench_quick summary -->\nold\n<!-- /results -->\nafter\n"
    assert headline.rewrite(text, tmp_path) == f"before\n<!-- results bench_quick summary -->\n{summary}<!-- /results -->\nafter\n"


def test_the_tables_of_a_resumed_run_name_the_runs_they_keep(tmp_path):
    """A file that keeps an earlier invocation's records (``--resume``) says so above its tables, with
    that invocation's command, commit and machine: its per-second figures were timed there."""
    import json

    from benchmarks import headline

    earlier = {"command": "python -m benchmarks.run --full --output /x/benchmarks/results/bench_full.json",
               "date_utc": "2026-12-05T11:00", "git_commit": "a7b10a6930", "git_dirty": False,
               "cpu_model": "Intel(R) Xeon(R) Processor"}
    results = {"mode": "full", "models": {"pima": {"dim": 8}},
               "settings": {"num_chains": 4, "num_warmup": 1000, "num_samples": 1000, "dtype": "float64"},
               "environment": {"git_commit": "abcdef0123", "seed": 0, "cpu_model": "CPU", "nproc": 2,
                               "date_utc": "2026-12-06T00:00", "command": "python -m benchmarks.run --full --resume",
                               "earlier_invocations": [earlier]},
               "runs": []}
    path = tmp_path / "bench_full.json"
    path.write_text(json.dumps(results))
    assert ("Resumed (`--resume`) from `python -m benchmarks.run --full --output benchmarks/results/bench_full.json` "
            "(2026-12-05, git a7b10a6930, Intel(R) Xeon(R) Processor), whose finished runs are kept."
            in headline.headline_markdown(path))
    del results["environment"]["earlier_invocations"]
    path.write_text(json.dumps(results))
    assert "Resumed" not in headline.headline_markdown(path)


def test_a_resumed_file_says_which_runs_each_invocation_made():
    """Runs that carry where they were made (``record["made"]``) are grouped by it, in time order; a
    model whose runs two invocations made is named with each one's samplers."""
    from benchmarks import headline

    intel = {"date_utc": "2026-12-05T11:00", "git_commit": "fa7b10a693ff", "git_dirty": True, "cpu_model": "Intel"}
    amd = headline.made_by({"date_utc": "2026-12-05T20:00", "git_commit": "6aa741a978ff", "git_dirty": False,
                            "cpu_model": "AMD EPYC", "command": "not kept"})
    assert amd == {"date_utc": "2026-12-05T20:00", "git_commit": "6aa741a978ff", "git_dirty": False,
                   "cpu_model": "AMD EPYC"}

    def run(model, sampler, made, status="ok"):
        return {"model": model, "sampler": sampler, "status": status, "made": made}

    results = {"environment": {"earlier_invocations": [{"command": "c", "date_utc": "2026-12-05"}]},
               "runs": [run("pima", "nuts", amd), run("pima", "ahmc", amd), run("lgcp_64", "nuts", intel),
                        run("lgcp_64", "ahmc", amd), run("lgcp_64", "nutpie", amd, status="skipped")]}
    assert headline.earlier_note(results) == (
        " Resumed (`--resume`) across invocations; the runs each made: 2026-12-05, git fa7b10a693 dirty, Intel: "
        "lgcp_64 (nuts); 2026-12-05, git 6aa741a978, AMD EPYC: pima, lgcp_64 (ahmc).")  # by time, not by name
    del results["runs"][2]["made"]  # a record from before runs kept their origin: the invocations instead
    assert headline.earlier_note(results) == " Resumed (`--resume`) from `c` (2026-12-05, git None), whose finished runs are kept."
    del results["environment"]["earlier_invocations"]  # one invocation made every run
    assert headline.earlier_note(results) == ""


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


@pytest.mark.slow  # ~40 s
@pytest.mark.parametrize("sampler", ["pymc_numpyro", "ahmc_pymc_jax"])
def test_compiled_pymc_runners_draw_what_the_public_call_draws_and_count_the_warmup(sampler, jax_x64):
    """``pymc_numpyro`` is PyMC's ``sample_numpyro_nuts`` (what ``pm.sample(nuts_sampler="numpyro")`` runs) and
    ``ahmc_pymc_jax`` ahmc's ``sample_numpyro_ahmc``: each runner's draws are the plain call's, and the warm-up
    gradients, which PyMC's call drops, are counted all the same."""
    pytest.importorskip("pymc")
    import numpyro.infer
    from pymc.sampling.jax import sample_numpyro_nuts

    from ahmc.adapters.pymc import sample_numpyro_ahmc
    from benchmarks import pymc_models

    model = models.get_model("corr_gauss_2")
    positions = models.initial_positions(model, 2, seed=0)
    base = numpyro.infer.MCMC
    out = run.SAMPLERS[sampler](None, model, positions, 50, 40)
    assert numpyro.infer.MCMC is base  # the runner's wider collection window is undone
    call = sample_numpyro_nuts if sampler == "pymc_numpyro" else sample_numpyro_ahmc
    plain = call(draws=40, tune=50, chains=2, random_seed=0, initvals=[{"x": p} for p in positions], jitter=False,
                 model=pymc_models.build("corr_gauss_2"), progressbar=False, compute_convergence_checks=False)
    np.testing.assert_array_equal(out.draws, plain.posterior["x"].values)
    np.testing.assert_array_equal(out.num_grads_sampling, plain.sample_stats["n_steps"].values.sum(axis=1))
    assert np.all(out.num_grads_warmup >= 50)
    timing = out.timing
    assert list(timing["phases"]["wall_s"]) == ["run"] and timing["compile_s"] > 0 and timing["sampling_s"] > 0


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


def test_seed_spread_passes_options_through_and_divides_by_the_baseline_of_each_seed(monkeypatch, tmp_path):
    from benchmarks import seeds

    calls = []
    values = {0: {"ahmc": 0.2, "nuts": 0.1}, 1: {"ahmc": 0.3, "nuts": 0.2}}

    def fake_main(argv):
        calls.append(argv)
        seed = int(argv[argv.index("--seed") + 1])
        return {"environment": {"cpu_model": "cpu", "nproc": 2},
                "runs": [{"model": "m", "sampler": s, "status": "ok", "timing": {"compile_s": 1.0, "warmup_s": 1.0,
                                                                                  "sampling_s": 1.0},
                          # strict ESS: the squares' 1000 v below the means' 2000 v; 1000 gradients in all
                          "metrics": {"ess_bulk": {"min": 2000 * v}, "ess_bulk_squares": {"min": 1000 * v},
                                      "grads": {"warmup": 400, "sampling": 600}}}
                         for s, v in values[seed].items()]}

    monkeypatch.setattr(seeds.bench, "main", fake_main)
    options = '{"ahmc": {"objective": "esjd"}}'
    summary = seeds.main(["--models", "m", "--samplers", "ahmc,nuts", "--baseline", "nuts", "--seeds", "0,1",
                          "--sampler-options", options, "--output", str(tmp_path / "s.json")])
    assert all(call[call.index("--sampler-options") + 1] == options for call in calls)
    row = summary["table"]["m"]["ahmc"]
    assert row["ratio_to_baseline"] == pytest.approx([2.0, 1.5])
    assert row["ratio_mean"] == pytest.approx(1.75) and row["ratio_min"] == pytest.approx(1.5)
    assert row["min_ess_per_grad"] == pytest.approx([0.2, 0.3])  # strict ESS (200, 300) over 1000 gradients
    text = (tmp_path / "s.md").read_text()
    assert "1.75 (1.50-2.00)" in text and "Strict ESS per gradient" in text


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
                          "--per-second-baseline", "nuts1", "--seeds", "0,1", "--metric", "means",
                          "--output", str(tmp_path / "s.json")])
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


@pytest.mark.slow  # ~40 s; default run under 15 min (2026-11-28)
def test_armhmc_runs_on_the_logistic_regressions_and_is_skipped_elsewhere():
    jax = pytest.importorskip("jax")
    model = models.get_model("ripley")
    positions = models.initial_positions(model, 2, 0)
    out = run.SAMPLERS["armhmc"](jax.random.key(0), model, positions, 40, 20)
    assert out.draws.shape == (2, 20, model.dim) and np.all(np.isfinite(out.draws))
    # every leapfrog step costs at least one gradient and the metric's evaluations on top
    assert np.all(out.num_grads_sampling >= 20) and out.extra["units_per_draw"] > out.extra["leapfrog_steps_per_draw"]
    # One public call, its compilation timed apart (the run split by cost), and the draws are run_chains(metric=)'s.
    assert out.timing["sampling_time_estimated"] is True and out.timing["compile_s"] > 0 and out.timing["sampling_s"] > 0
    from ahmc.adapters.blackjax import run_chains
    from benchmarks.samplers import metric_for

    samples, _ = run_chains(jax.random.key(0), model.logdensity_fn, jax.numpy.asarray(positions), 40, 20,
                            metric=metric_for("ripley"))
    np.testing.assert_allclose(out.draws, np.asarray(samples).reshape(out.draws.shape), rtol=1e-9, atol=1e-12)
    assert run.skip_reason("armhmc", models.get_model("corr_gauss_2")).startswith("ARMHMC runs where")
    assert run.skip_reason("armhmc", model) is None
    assert "armhmc" not in run.parse_args([]).samplers and "armhmc" in run.parse_args(["--full"]).samplers


def test_dense_variants_pass_their_option_run_by_name_only_and_count_as_nuts_baselines(monkeypatch):
    from benchmarks import headline, samplers

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
        assert name.startswith("ahmc") or name in headline.ALL_NUTS
    assert {"numpyro_nuts_dense", "blackjax_nuts_dense", "pymc_nuts_dense"} <= set(run.NUTS_SAMPLERS)


@pytest.mark.slow  # ~16 s; default run under 15 min (2026-11-28)
def test_dense_ahmc_runner_smoke():
    pytest.importorskip("blackjax")
    jax = pytest.importorskip("jax")
    model = models.get_model("corr_gauss_2")
    out = run.SAMPLERS["ahmc_blackjax_dense"](jax.random.key(0), model, models.initial_positions(model, 2, 0), 200, 50)
    assert out.draws.shape == (2, 50, 2) and np.all(np.isfinite(out.draws))


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


@pytest.mark.slow  # 2026-12-05: the default suite took 18-22 min on this host; a default test covers most of it
def test_pin_engine_records_and_finds_no_change_on_the_same_code(tmp_path, monkeypatch):
    """The refactoring check: a record and a compare of the same code agree; a changed draw is reported."""
    pytest.importorskip("jax")
    from benchmarks import pin_engine

    path = str(tmp_path / "pin.pkl")
    assert pin_engine.main(["record", path, "--cases", "user_box"]) == []
    assert pin_engine.main(["compare", path, "--cases", "user_box"]) == []
    real_run_case = pin_engine.run_case

    def shifted(name, opts):
        out = real_run_case(name, opts)
        draws, info = out["step"]
        out["step"] = (draws + 1e-6, info)
        return out

    monkeypatch.setattr(pin_engine, "run_case", shifted)
    assert pin_engine.main(["compare", path, "--cases", "user_box"]) == ["user_box/step"]


@pytest.mark.slow  # four short RMHMC fits, ~40 s
def test_refit_study_warm_starts_rmhmc_through_the_public_api(monkeypatch, jax_x64):
    """``python -m benchmarks.refit --metric softabs``: RMHMC refits from an RMHMC snapshot, fewer warm-up
    gradients than the cold refit (the check counted), the snapshot carrying the metric's name."""
    pytest.importorskip("blackjax")
    from benchmarks import refit

    monkeypatch.setattr(refit, "NUM_SAMPLES", 200)
    monkeypatch.setattr(refit, "COLD_WARMUP", 400)
    monkeypatch.setattr(refit, "WARM_WARMUP", 100)
    scenario = next(refit.scenarios("pima", np.random.default_rng(0)))
    _, earlier, new = scenario
    snapshot = refit.run(earlier, 100, 400, metric="softabs")["snapshot"]
    assert snapshot.metric == "softabs"
    cold = refit.run(new, 0, 400, metric="softabs")
    warm = refit.run(new, 0, 100, warm_start=snapshot, metric="softabs")
    assert not warm["fell_back"] and warm["grads"]["warmup"] < 0.5 * cold["grads"]["warmup"]
    assert warm["rhat"] < 1.1 and cold["rhat"] < 1.1


@pytest.mark.slow  # two short NumPyro fits, ~25 s
def test_refit_study_numpyro_route_counts_one_runs_warmup_and_draws(monkeypatch, jax_x64):
    """``python -m benchmarks.refit --route numpyro``: one ``mcmc.run`` per fit, its warm-up's gradients
    (the check's added) apart from the draws', the draws the last ``NUM_SAMPLES`` iterations."""
    pytest.importorskip("numpyro")
    from benchmarks import refit

    monkeypatch.setattr(refit, "NUM_SAMPLES", 150)
    _, earlier, new = next(refit.numpyro_scenarios("pima", np.random.default_rng(0)))
    cold = refit.run_numpyro(earlier, 0, 300)
    assert cold["draws"].shape == (refit.NUM_CHAINS, 150, 8) and not cold["fell_back"]
    assert cold["grads"]["warmup"] > cold["grads"]["sampling"] > refit.NUM_CHAINS * 150
    warm = refit.run_numpyro(new, 1, 100, warm_start=cold["snapshot"])
    assert warm["draws"].shape == (refit.NUM_CHAINS, 150, 8) and not warm["fell_back"]
    assert warm["grads"]["warmup"] < 0.5 * cold["grads"]["warmup"] and warm["rhat"] < 1.1


@pytest.mark.slow  # seven NumPyro runs, ~60 s
def test_hard_geometry_study_reports_every_sampler_against_the_truth(capsys, jax_x64):
    """The study behind docs/decisions.md, "Divergences: a finer retry", through the public APIs: one row per
    sampler, and the funnel's retry run reaches the neck that NUTS misses (its mean of v is nearer 0)."""
    from benchmarks import hard_geometry

    hard_geometry.main(["--seeds", "0", "--routes", "numpyro"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| numpyro")]
    assert [row.split(" | ")[1:3] for row in rows] == [["funnel", s] for s in ("ahmc", "ahmc_no_retry", "nuts")] + [
        ["eight_schools_centered", s] for s in ("ahmc", "ahmc_no_retry", "nuts")]
    rmse = {tuple(row.split(" | ")[1:3]): float(row.split(" | ")[6].split()[0]) for row in rows}
    assert rmse[("funnel", "ahmc")] < rmse[("funnel", "nuts")]


def test_pytensor_first_use_is_paid_before_any_pymc_sampler_is_timed():
    """PyTensor's first compilation in a process is not charged to the first PyMC sampler: the run pays
    it up front, and only when a PyMC sampler runs (a JAX-only run does not import PyMC for it)."""
    from benchmarks.run import warm_up_pytensor

    assert warm_up_pytensor(["ahmc_numpyro", "numpyro_nuts"]) == 0.0
    assert warm_up_pytensor(["ahmc_numpyro", "ahmc_pymc"]) > 0.0


@pytest.mark.slow  # 2026-12-05: the default suite took 18-22 min on this host; a default test covers most of it
def test_compile_parts_study_times_each_added_part_of_the_engine(jax_x64):
    """The study compiles the transition, then the rounds, then the warm-up: each adds fused kernels; then the
    whole run, which it also runs; XLA's options reach every compilation."""
    from benchmarks.compile_parts import compile_parts

    rows = compile_parts(models.get_model("corr_gauss_2"), {"metric_recipe": "welford_diag"}, num_warmup=100,
                         compiler_options={"xla_backend_optimization_level": 1})
    assert [r["part"] for r in rows] == ["transition", "+ rounds", "+ warm-up", "whole run"]
    assert all(r["compile_s"] > 0 and r["compile_cpu_s"] > 0 for r in rows)
    assert rows[0]["fusions"] < rows[1]["fusions"] < rows[2]["fusions"]
    assert rows[3]["run_s"] > 0 and all(r["run_s"] != r["run_s"] for r in rows[:3])


def test_results_json_keeps_scalars_exact_and_long_lists_at_four_digits(tmp_path):
    """The committed results stay small: per-coordinate lists (an LGCP field: 2 x 4096 numbers per run)
    keep 4 significant digits, while the scalars the headline reads stay exact."""
    import json

    from benchmarks.run import write_json

    results = {"runs": [{"metrics": {"ess": 123.456789012, "short": [1.23456789, 2.0],
                                     "field": {"mean": [1.23456789] * 17 + [float("nan")]}}}]}
    path = tmp_path / "r.json"
    write_json(results, path)
    back = json.loads(path.read_text())["runs"][0]["metrics"]
    assert back["ess"] == 123.456789012 and back["short"] == [1.23456789, 2.0]
    assert back["field"]["mean"][:17] == [1.235] * 17 and back["field"]["mean"][17] != back["field"]["mean"][17]


def test_the_reward_estimate_study_recovers_an_ar1_chains_ess():
    """``benchmarks.reward_estimate``: on AR(1) draws (rho 0.5, so 1/3 effective draw per draw for x and
    0.6 for x^2) the truth and both estimates agree; with rho_2 != rho_1^2 the two-lag estimate moves."""
    from benchmarks.reward_estimate import _two_lag_ess, estimates

    rng = np.random.default_rng(0)
    rho, draws = 0.5, np.empty((4, 4000, 3))
    draws[:, 0] = rng.normal(size=(4, 3))
    for t in range(1, draws.shape[1]):
        draws[:, t] = rho * draws[:, t - 1] + np.sqrt(1 - rho ** 2) * rng.normal(size=(4, 3))
    found = estimates(draws, gradients_per_draw=2.0)
    for name in ("truth", "lag_one", "two_lag"):
        assert abs(found[name] - 1 / 3) < 0.1 / 3, (name, found)
    assert abs(_two_lag_ess(0.5, 0.25) - 1 / 3) < 1e-12 and _two_lag_ess(0.5, 0.4) < 0.25
