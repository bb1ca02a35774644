"""Each adapter imports only its own framework and names the missing extra."""

import subprocess
import sys
import textwrap

import pytest

BLOCK = textwrap.dedent(
    """
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def __init__(self, names): self.names = names
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.names:
                raise ImportError(f"No module named {{name!r}} (blocked by test)")
    sys.meta_path.insert(0, Block({blocked!r}))
    """
)


def run(code, blocked):
    return subprocess.run(
        [sys.executable, "-c", BLOCK.format(blocked=set(blocked)) + code], capture_output=True, text=True
    )


def test_core_imports_without_any_framework():
    result = run(
        "import ahmc.core, sys; bad = {'jax','pymc','numpyro','blackjax','pytensor'} & set(sys.modules); "
        "assert not bad, bad",
        ["jax", "pymc", "numpyro", "blackjax", "pytensor", "scipy"],
    )
    assert result.returncode == 0, result.stderr


def test_import_ahmc_gives_its_version_and_reaches_the_adapters():
    from importlib.metadata import version

    result = subprocess.run([sys.executable, "-c", (
        "import sys, ahmc; print(ahmc.__version__); assert not {'jax', 'pymc', 'numpyro'} & set(sys.modules); "
        "ahmc.core.Config(); import ahmc.adapters.pymc; assert 'jax' not in sys.modules, 'the PyMC step imports JAX'; "
        "print(ahmc.adapters.pymc.PooledAdaptiveHMC.__name__)")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [version("ahmc"), "PooledAdaptiveHMC"]


@pytest.mark.parametrize(
    "adapter, blocked, extra",
    [
        ("pymc", ["pymc", "pytensor"], "pymc"),
        ("numpyro", ["numpyro"], "numpyro"),
        ("blackjax", ["blackjax"], "blackjax"),
    ],
)
def test_missing_framework_names_the_extra(adapter, blocked, extra):
    import importlib.util

    if importlib.util.find_spec(f"ahmc.adapters.{adapter}") is None:
        pytest.skip(f"ahmc.adapters.{adapter} not written yet")
    result = run(f"import ahmc.adapters.{adapter}", blocked)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert f"ahmc[{extra}]" in result.stderr


@pytest.mark.parametrize(
    "adapter, foreign",
    [("pymc", ["jax", "numpyro", "blackjax"]), ("blackjax", ["pymc", "pytensor", "numpyro"]), ("numpyro", ["pymc", "pytensor"])],
)
def test_adapter_imports_only_its_framework(adapter, foreign):
    import importlib.util

    if importlib.util.find_spec(f"ahmc.adapters.{adapter}") is None:
        pytest.skip(f"ahmc.adapters.{adapter} not written yet")
    result = run(f"import ahmc.adapters.{adapter}", foreign)
    assert result.returncode == 0, result.stderr
