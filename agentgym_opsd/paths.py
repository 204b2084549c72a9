"""Where the suite keeps what it makes or fetches: one cache root for every env family.

`$AGENTGYM_OPSD_CACHE`, else `~/.cache/agentgym-opsd`. Below it each family has its own folder
(`alfworld/` generated panels, `webshop/` catalog indexes, `searchqa/` the synthetic index and fetched
data sets and corpora). Nothing here is ever committed; deleting it only costs regeneration time.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "CACHE_ENV"]

CACHE_ENV = "AGENTGYM_OPSD_CACHE"


def cache_dir(*parts: str) -> Path:
    """`$AGENTGYM_OPSD_CACHE/<parts...>` (default root `~/.cache/agentgym-opsd`); not created here."""
    base = os.environ.get(CACHE_ENV)
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "agentgym-opsd"
    return root.joinpath(*parts)
