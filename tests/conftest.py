"""Shared pytest fixtures."""

import pytest


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
