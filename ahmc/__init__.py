"""ahmc: adaptive Hamiltonian Monte Carlo, its step size and path length tuned by an annealed GP-UCB bandit.

The framework plugins are ``ahmc.adapters.pymc``, ``ahmc.adapters.numpyro`` and ``ahmc.adapters.blackjax``;
the framework-free tuner is ``ahmc.core``.  ``import ahmc`` imports none of them; ``ahmc.adapters.pymc``
and the others are imported on first use.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ahmc")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["__version__", "core", "adapters"]


def __getattr__(name):
    if name in ("core", "adapters"):
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
