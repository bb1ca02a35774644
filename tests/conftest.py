"""Shared pytest fixtures, and (opt-in) one JAX compilation cache for the whole test session."""

import os
import shutil
import tempfile

import pytest

# Many tests compile the same sampler for the same shapes (another seed, another chain method, a
# second run to check reproducibility).  JAX's persistent cache lets a compiled program be reused
# across tests and across the xdist workers; the directory lives as long as the session, so nothing
# carries over between runs.  Off by default since 2026-11-28: in three full runs that day an xdist
# worker died inside JAX's compile-and-write-cache path (a segfault or an abort in
# ``executable.serialize()``), which the same tests never did alone.  AHMC_TEST_JAX_CACHE=on turns it
# back on (about 1.5 minutes faster).
_CACHE_ENV = "AHMC_TEST_JAX_CACHE"


def pytest_configure(config):
    if os.environ.get(_CACHE_ENV, "off") == "off":
        return
    if not hasattr(config, "workerinput") and os.environ[_CACHE_ENV] == "on":  # the controller (or a plain run)
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
