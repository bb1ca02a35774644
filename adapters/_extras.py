"""Import a framework for an adapter, or explain which extra installs it."""

from __future__ import annotations

import importlib


def require(module: str, extra: str):
    """Import ``module``; if missing, raise ImportError naming ``ahmc[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"ahmc.adapters.{extra} needs {module!r}, which is not installed. "
            f'Install the extra: pip install "ahmc[{extra}]" (from a clone of ahmc: pip install ".[{extra}]")'
        ) from error
