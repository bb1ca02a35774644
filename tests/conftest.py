"""Shared pytest fixtures, one JAX compilation cache for the whole test session, and a cap on how
many compiled programs a test worker keeps."""

import gc
import os
import shutil
import sys
import tempfile

import pytest

# Many tests compile the same sampler for the same shapes (another seed, another chain method, a
# second run to check reproducibility).  JAX's persistent cache lets a compiled program be reused
# across tests and across the xdist workers; the directory lives as long as the session, so nothing
# carries over between runs.  Set AHMC_TEST_JAX_CACHE=off to compile everything afresh.
_CACHE_ENV = "AHMC_TEST_JAX_CACHE"


def pytest_configure(config):
    if os.environ.get(_CACHE_ENV) == "off":
        return
    if not hasattr(config, "workerinput") and _CACHE_ENV not in os.environ:  # the controller (or a plain run)
        os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="ahmc-jax-cache-")
        config._ahmc_jax_cache_owner = True  # workers inherit the variable and share the directory
    try:
        import jax
    except ImportError:
        return
    jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_ENV])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    if getattr(config, "_ahmc_jax_cache_owner", False):
        shutil.rmtree(os.environ.pop(_CACHE_ENV), ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop JAX's in-memory caches of traced and compiled programs after each test module.

    Every compiled XLA program keeps its machine code in memory maps of its own, and JAX's caches keep
    the programs alive, so a worker that runs half of the suite piles up tens of thousands of maps.
    At Linux's default ``vm.max_map_count`` (65530) the next compile fails inside XLA with a segfault
    or an abort (seen on 2026-11-28: 65,139 maps in the worker that died).  After a module its programs
    are rarely needed again, and the persistent cache above still serves the ones that are.
    """
    yield
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
        gc.collect()


@pytest.fixture
def jax_x64():
    """Run a test in JAX's 64-bit mode and give the process its former mode back afterwards.

    PyMC's JAX sampling module turns ``jax_enable_x64`` on when it is imported (PyMC models are
    float64), and so does ``ahmc.adapters.pymc_jax``.  Tests of that path use this fixture and import
    the module inside the test, so that the other tests keep JAX's default single precision.
    """
    jax = pytest.importorskip("jax")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)
