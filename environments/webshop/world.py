"""What every WebShop env of a process shares: the catalog, its goals and splits, and the search index.

`get_world(...)` returns one `WebShopWorld` per distinct catalog configuration and keeps it for the
life of the process, so 64 env instances over one catalog hold one copy of the products, one goal
list and one Lucene searcher; each env adds only its own episode state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from environments.webshop.builtin import builtin_catalog
from environments.webshop.catalog import Catalog, CatalogError
from environments.webshop.goals import Goal, build_goals, split_ranges
from environments.webshop.reward import RewardBreakdown, noun_tagger, webshop_reward
from environments.webshop.search import ProductSearch

__all__ = ["WebShopWorld", "get_world", "clear_worlds", "BUILTIN"]

BUILTIN = "builtin"


@dataclass
class WebShopWorld:
    """One catalog with its goals, splits, reward tagger and (lazily built) search.

    Attributes:
        catalog: the products.
        goals: every goal, in WebShop's fixed (shuffled) order.
        splits: split name -> goal-index range.
        nouns: the noun tagger of the type reward.
        index_dir: where the search index lives (None: the default cache).
    """

    catalog: Catalog
    goals: list[Goal]
    nouns: Callable[[str], Sequence[str]]
    index_dir: str | None = None
    splits: dict[str, range] = field(init=False)
    _search: ProductSearch | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.splits = split_ranges(len(self.goals))

    @property
    def search(self) -> ProductSearch:
        """The shared BM25 search (the index is built on first use)."""
        if self._search is None:
            with self._lock:
                if self._search is None:
                    self._search = ProductSearch(self.catalog, self.index_dir)
        return self._search

    def reward(self, goal: Goal, asin: str, options: dict[str, str]) -> RewardBreakdown:
        """The reward of buying `asin` with `options` for `goal`."""
        return webshop_reward(self.catalog.by_asin[asin], goal, self.catalog.price(asin), options, self.nouns)


_WORLDS: dict[tuple[Any, ...], WebShopWorld] = {}
_WORLDS_LOCK = threading.Lock()


def _key_path(path: str | Path | None) -> str | None:
    return None if path is None else str(Path(path).expanduser().resolve())


def get_world(
    catalog: str | Path | None = None,
    *,
    attributes: str | Path | None = None,
    human: str | Path | None = None,
    num_products: int | None = None,
    goals: str = "auto",
    index_dir: str | Path | None = None,
    type_tagger: str = "builtin",
) -> WebShopWorld:
    """The process-wide world for this configuration (built on first call, then shared).

    Args:
        catalog: None or "builtin" for the embedded synthetic catalog; else a WebShop data folder,
            an `items_shuffle*.json` or a `documents.jsonl` (see `Catalog.from_files`).
        attributes, human, num_products: see `Catalog.from_files`.
        goals: "auto", "human" or "synthetic" (see `build_goals`).
        index_dir: where the search index is (or is built); None for the default cache.
        type_tagger: "builtin", "spacy" or "spacy:MODEL" (see `reward.noun_tagger`).
    """
    builtin = catalog is None or str(catalog) == BUILTIN
    if builtin and (attributes is not None or human is not None):
        raise CatalogError("attributes= and human= need a catalog path (catalog=PATH to WebShop's files)")
    key = (
        BUILTIN if builtin else _key_path(catalog),
        _key_path(attributes),
        _key_path(human),
        None if num_products is None else int(num_products),
        goals,
        _key_path(index_dir),
        type_tagger,
    )
    with _WORLDS_LOCK:
        world = _WORLDS.get(key)
        if world is None:
            nouns = noun_tagger(type_tagger)
            if builtin:
                loaded = builtin_catalog()
                if num_products is not None:
                    loaded = _first_products(loaded, int(num_products))
            else:
                loaded = Catalog.from_files(catalog, attributes=attributes, human=human, num_products=num_products)
            world = WebShopWorld(loaded, build_goals(loaded, goals), nouns, None if index_dir is None
                                 else str(index_dir))
            _WORLDS[key] = world
        return world


def _first_products(catalog: Catalog, n: int) -> Catalog:
    if n < 1:
        raise CatalogError(f"num_products must be >= 1, got {n}")
    kept = catalog.products[:n]
    asins = {p.asin for p in kept}
    return Catalog(
        catalog.name if n >= len(catalog) else f"{catalog.name}-{n}",
        kept,
        {a: v for a, v in catalog.synthetic_instructions.items() if a in asins},
        {a: v for a, v in catalog.human_instructions.items() if a in asins},
        catalog.synthetic,
    )


def clear_worlds() -> None:
    """Forget every shared world (for tests and benchmarks)."""
    with _WORLDS_LOCK:
        _WORLDS.clear()

