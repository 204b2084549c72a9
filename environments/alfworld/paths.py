"""Where ALFWorld files live: the cache of generated games, the user's data, and alfworld's own imports.

- Generated panels go to `$AGENTGYM_OPSD_CACHE/alfworld/` (default `~/.cache/agentgym-opsd/alfworld/`).
- Real data is read from `data_dir=` or `$ALFWORLD_DATA` (ALFWorld's `json_2.1.1/` layout).
- Importing any `alfworld` module runs `alfworld.info`, which creates `$ALFWORLD_DATA` (default
  `~/.cache/alfworld`). `import_alfworld` points it at our cache first when the user has not set it, so
  nothing is written outside the cache.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

from agentgym_opsd.contract import EnvUnavailable
from agentgym_opsd.paths import cache_dir

__all__ = ["cache_root", "import_alfworld", "alfworld_package_dir"]


def cache_root() -> Path:
    """`$AGENTGYM_OPSD_CACHE/alfworld`, or `~/.cache/agentgym-opsd/alfworld`."""
    return cache_dir("alfworld")


def import_alfworld(module: str) -> ModuleType:
    """Import an `alfworld` submodule without letting it create ~/.cache/alfworld."""
    if "ALFWORLD_DATA" not in os.environ:
        os.environ["ALFWORLD_DATA"] = str(cache_root() / "alfworld-data")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EnvUnavailable(
            f"ALFWorld needs the `alfworld` package ({e}): pip install alfworld==0.4.2 textworld==1.7.0 "
            "(without extras; the venv's bin must be on PATH while textworld builds fast-downward)"
        ) from None


def alfworld_package_dir() -> Path:
    """The installed alfworld package folder (its `data/` and `gen/layouts/`), found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise EnvUnavailable("ALFWorld needs the `alfworld` package: pip install alfworld==0.4.2 textworld==1.7.0")
    return Path(list(spec.submodule_search_locations)[0])

