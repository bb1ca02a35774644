"""Shared pytest fixtures, one JAX compilation cache for the whole test session, and a cap on how
many compiled programs a test worker keeps alive."""

import logging
import os
import shutil
import tempfile

import pytest

# Many tests compile the same sampler for the same shapes (another seed, another chain method, a
# second run to check reproducibility).  JAX's persistent cache lets a compiled program be reused
# across tests and across the xdist workers; the directory lives as long as the session, so nothing
# carries over between runs.  Set AHMC_TEST_JAX_CACHE=off to compile everything afresh.
_CACHE_ENV = "AHMC_TEST_JAX_CACHE"

# Most of the suite's time is XLA compiling the samplers, and about half of that is LLVM optimising
# machine code that a short test run never pays back: at optimisation level 0 a 10-d Gaussian's
# run_chains compiles in 8 s instead of 16 s (2026-11-28).  The draws differ from those at XLA's
# default level in the last bits (the optimiser changes how floating-point operations combine),
# and the difference grows along the chains, so a test sees other, equally valid draws.  Set before
# any JAX backend starts (the workers and the benchmark subprocesses inherit it);
# AHMC_TEST_XLA_OPT=default keeps XLA's own level.
_OPT_ENV = "AHMC_TEST_XLA_OPT"
if os.environ.get(_OPT_ENV) != "default" and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()


# The suite runs in two xdist workers on two cores.  NumPy's OpenBLAS starts a thread per core and
# its threads wait for each other by spinning, so while the other worker compiles, every small
# solve of the NumPy tuner waits out a scheduler time slice: the core tuner's 300-round test took
# 1.4 s alone and 14-29 s inside the suite (49 s beside two busy processes; 10 s there with one BLAS
# thread, 2026-11-28).  One BLAS thread per worker; set before NumPy loads, and inherited by the
# workers and subprocesses.  An explicit setting in the environment wins.
for _blas_threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas_threads, "1")


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


# Linux refuses a process more than ``vm.max_map_count`` memory maps (65530 by default).  Every
# compiled XLA program keeps its machine code in maps of its own, and JAX's caches keep every program
# alive, so a worker that runs half of the suite piles them up; at the limit the next compile dies
# inside XLA with a segfault or an abort (seen on 2026-11-28: 65,139 maps in the worker that died).
_MAPS_BEFORE_FREEING = 20_000


def _memory_maps() -> int:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux: no such limit to keep away from
        return 0


@pytest.fixture(autouse=True)
def _free_compiled_programs():
    """After a test, drop JAX's in-memory caches of compiled programs once the worker holds many maps
    (the persistent cache above still serves the programs a later test compiles again)."""
    yield
    if _memory_maps() > _MAPS_BEFORE_FREEING:
        from benchmarks.run import free_compiled_programs  # what the benchmark does after every run

        free_compiled_programs()


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(autouse=True)
def _fail_on_a_nonfinite_reward():
    """pyproject.toml's filter makes the non-finite-reward warning an error. Raised from inside a compiled
    run, that error would abort the run, so the JAX routes log the message to the ``ahmc`` logger instead
    (``ahmc.adapters._jax_warmup.warn_from_compiled``): such a message fails the test as the error does."""
    handler, logger = _Messages(), logging.getLogger("ahmc")
    logger.addHandler(handler)
    yield
    logger.removeHandler(handler)
    logged = [m for m in handler.messages if m.startswith("ahmc: a round's reward was not finite")]
    if logged:
        pytest.fail(f"a run's rewards were not finite (logged from the compiled run): {logged[0]}")


@pytest.fixture
def jax_x64():
    """Run a test in JAX's 64-bit mode and give the process its former mode back afterwards.

    PyMC's JAX sampling module turns ``jax_enable_x64`` on when it is imported (PyMC models are
    float64), and so does the compiled PyMC route (``ahmc.adapters.pymc.sample_numpyro_ahmc``).  Tests of that path use this fixture and import
    the module inside the test, so that the other tests keep JAX's default single precision.
    """
    jax = pytest.importorskip("jax")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)
