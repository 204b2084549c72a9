"""Where the suite keeps what it makes or fetches: one cache root for every env family.

`$AGENTGYM_OPSD_CACHE`, else `~/.cache/agentgym-opsd`. Below it each family has its own folder
(`alfworld/` generated panels, `webshop/` catalog indexes, `searchqa/` the synthetic index and fetched
data sets and corpora). Nothing here is ever committed; deleting it only costs regeneration time.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "CACHE_ENV", "PathOutsideRoot", "contained_path", "is_path_option", "contain_path_options"]

CACHE_ENV = "AGENTGYM_OPSD_CACHE"


def cache_dir(*parts: str) -> Path:
    """`$AGENTGYM_OPSD_CACHE/<parts...>` (default root `~/.cache/agentgym-opsd`); not created here."""
    base = os.environ.get(CACHE_ENV)
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "agentgym-opsd"
    return root.joinpath(*parts)


# ------------------------------------------------------------------------------------------------
# Paths that come from config files stay inside their data root.

PATH_OPTION_NAMES = frozenset({"catalog", "attributes", "human", "corpus", "index", "data"})
PATH_OPTION_SUFFIXES = ("_file", "_dir", "_path", "_root", "_folder")
# Values of path options that name a built-in choice, not a file (WebShop's `catalog="builtin"`).
BUILTIN_CHOICES = frozenset({"builtin", "auto", "synthetic", "human", "none"})


class PathOutsideRoot(ValueError):
    """A path from a config file leads outside the folder it may read from."""


def is_path_option(name: str) -> bool:
    """Whether an env option names a file or folder (`data_file`, `index_dir`, `catalog`, ...)."""
    return name in PATH_OPTION_NAMES or name.endswith(PATH_OPTION_SUFFIXES)


def contained_path(value: str | os.PathLike[str], root: str | os.PathLike[str], where: str = "path") -> Path:
    """`value` (relative to `root`, or absolute) as an absolute path with `..` and symbolic links
    resolved, which must lie inside `root` (or be `root`).

    Raises:
        PathOutsideRoot: naming `where`, the path, where it leads and the root.
    """
    base = Path(root).expanduser().resolve()
    given = Path(os.path.expanduser(os.fspath(value)))
    resolved = (given if given.is_absolute() else base / given).resolve()
    if resolved != base and base not in resolved.parents:
        raise PathOutsideRoot(
            f"{where}: {os.fspath(value)!r} leads to {resolved}, outside the data root {base}; "
            "put the data under the data root, or choose another root (bench: --data-root DIR)"
        )
    return resolved


def contain_path_options(options: dict[str, object], root: str | os.PathLike[str], where: str) -> dict[str, object]:
    """`options` with every path-valued option (see `is_path_option`) resolved by `contained_path`;
    a value naming a built-in choice (`catalog = "builtin"`) is left as it is."""
    out = dict(options)
    for name, value in options.items():
        if isinstance(value, str) and value.strip().lower() in BUILTIN_CHOICES:
            continue
        if is_path_option(name) and isinstance(value, (str, os.PathLike)):
            out[name] = str(contained_path(value, root, f"{where}.{name}"))
    return out
