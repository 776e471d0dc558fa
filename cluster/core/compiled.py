"""The optional compiled modules (``setup.py``): import one, unless its variable switches it off.

Each caller then checks the module against its Python twin before it uses it
(``cluster.core.fbf.hotpath``, ``cluster.core.store_kernel``).
"""

from __future__ import annotations

import importlib
import os
from typing import Any


def optional(module: str, env: str) -> tuple[Any, str]:
    """The module, or None and why not: ``env`` set to 0 (or false, no, off), or not built."""
    if os.environ.get(env, "").strip().lower() in ("0", "false", "no", "off"):
        return None, f"switched off ({env}=0)"
    try:
        return importlib.import_module(module), ""
    except ImportError as exc:
        return None, f"not built ({exc}; `pip install -e .` builds it where a C compiler is)"
