"""Smoke tests: every example runs (quick settings) and says what it should."""

import importlib.util
import pathlib

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_core_demo_finds_the_optimum(capsys):
    load("core_demo").main(rounds=300, seed=0)
    out = capsys.readouterr().out
    assert "surrogate optimum" in out
    share = float(out.split("true reward ")[1].split("%")[0])
    assert share >= 90.0


@pytest.mark.parametrize("name", ["blackjax_adaptation", "pymc_gaussian",
                                  # ~20 s, NUTS and ahmc on eight schools; the README's NumPyro quickstart runs by default
                                  pytest.param("numpyro_kernel", marks=pytest.mark.slow), "pymc_rmhmc"])
def test_framework_examples_run(name):
    if not (EXAMPLES / f"{name}.py").exists():
        pytest.skip(f"examples/{name}.py not written yet")
    module = load(name)
    if hasattr(module, "main"):
        module.main()


@pytest.mark.slow  # ~20 s; plot_tuning itself is tested by default (tests/adapters/test_diagnostics.py, test_doc_code)
def test_plot_tuning_example_writes_a_figure(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("numpyro")
    output = tmp_path / "tuning.png"
    load("plot_tuning").main(output=output, num_warmup=200, num_samples=100)
    assert output.stat().st_size > 10_000


def test_pymc_compiled_example_summarizes_the_pooled_tuner(jax_x64):
    pytest.importorskip("pymc")
    pytest.importorskip("numpyro")
    summary = load("pymc_compiled").main(draws=300)
    assert "4 chain(s), one pooled tuner" in summary and "x_sum" not in summary


@pytest.mark.slow  # 35-40 s; the funnel's RMHMC is tested in tests/adapters/test_rmhmc_jax.py (default run < 15 min)
def test_rmhmc_funnel_example_reaches_the_neck(capsys):
    pytest.importorskip("numpyro")
    v = load("rmhmc_funnel").main(num_warmup=200, num_samples=300)
    assert "fixed-point solves converged" in capsys.readouterr().out
    assert v.shape == (4, 300) and v.min() < -3.0  # P(v < -3) = 16%: a sampler stuck at the mouth fails
    example = load("rmhmc_funnel")
    v = example.main(num_warmup=200, num_samples=300, metric=example.fisher_metric)
    assert v.shape == (4, 300) and v.min() < -3.0
    v = example.main(num_warmup=200, num_samples=300, metric="diagonal_fisher")
    assert v.shape == (4, 300) and v.min() < -3.0
