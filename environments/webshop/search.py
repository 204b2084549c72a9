"""Product search: BM25 over the catalog through the project's Lucene index (retrieval_index.lucene).

As in WebShop, each product is indexed as one document whose text is its title, description, first
feature bullet and option values, lower-cased (`Product.search_text`), and a search returns the top
50 products, shown 10 per page.

The index is built once per catalog and reused: by default under
`$AGENTGYM_OPSD_CACHE/webshop/index-<catalog fingerprint>` (`~/.cache/agentgym-opsd` without the
variable), or in the folder given as `index_dir`. A folder that already holds an index is used as
it is (so WebShop's own pyserini indexes work too: their document ids are ASINs). Builds go to a
temporary folder first and are renamed into place, so a crash or a concurrent build never leaves a
half-written index behind.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections import OrderedDict
from pathlib import Path

from agentgym_opsd.core import EnvUnavailable
from environments.webshop.catalog import Catalog

__all__ = ["ProductSearch", "clean_query", "default_cache_dir", "SEARCH_RETURN_N", "PRODUCTS_PER_PAGE", "MAX_QUERY_WORDS"]

SEARCH_RETURN_N = 50  # results per search (WebShop's SEARCH_RETURN_N)
PRODUCTS_PER_PAGE = 10  # results per page (WebShop's PRODUCT_WINDOW)
MAX_QUERY_WORDS = 64  # longer queries are cut (Lucene refuses queries of more than 1024 terms)
MAX_QUERY_CHARS = 1000
_READY = "WEBSHOP_INDEX_READY"


def default_cache_dir() -> Path:
    """Where indexes are cached: `$AGENTGYM_OPSD_CACHE`, else `~/.cache/agentgym-opsd`."""
    return Path(os.environ.get("AGENTGYM_OPSD_CACHE") or "~/.cache/agentgym-opsd").expanduser()


def clean_query(text: str) -> str:
    """A search query as the env runs it: lower case, whitespace collapsed, at most 64 words and
    1000 characters (the same text is shown back on the results page)."""
    words = text.lower().split()[:MAX_QUERY_WORDS]
    return " ".join(words)[:MAX_QUERY_CHARS].strip()


def _has_index(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def _build(catalog: Catalog, target: Path, progress: bool) -> None:
    from retrieval_index.lucene import build_index  # noqa: PLC0415 (starts a JVM: imported when needed)

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        build_index(list(catalog.documents()), staging, threads=1, progress=progress)
        (staging / _READY).write_text(f"{catalog.name} {len(catalog)} products\n", encoding="utf-8")
        try:
            os.replace(staging, target)
        except OSError:
            if not _has_index(target):  # not a concurrent build that won the race: a real error
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


class ProductSearch:
    """BM25 search over one catalog's products; shared by every env of a process.

    `search(query)` returns the ASINs of the top 50 products. Results are cached per query (an LRU
    of `cache_size` queries), and calls are serialised with a lock (one Lucene searcher per process).
    """

    def __init__(
        self,
        catalog: Catalog,
        index_dir: str | os.PathLike[str] | None = None,
        *,
        cache_size: int = 4096,
        progress: bool = False,
    ) -> None:
        self.catalog = catalog
        if index_dir is None:
            folder = default_cache_dir() / "webshop" / f"index-{catalog.fingerprint()}"
        else:
            folder = Path(index_dir).expanduser()
        if not _has_index(folder):
            try:
                _build(catalog, folder, progress)
            except ImportError as e:
                raise EnvUnavailable(
                    f"WebShop search needs the project's Lucene index (retrieval_index.lucene): {e}; "
                    "reinstall the project with `make setup`"
                ) from None
        try:
            from retrieval_index.lucene import BM25Searcher  # noqa: PLC0415

            self._searcher = BM25Searcher(str(folder))
        except ImportError as e:
            raise EnvUnavailable(f"WebShop search cannot open the index in {folder}: {e}; run `make setup`") from None
        self.index_dir = folder
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def search(self, query: str) -> tuple[str, ...]:
        """The ASINs of the top-50 products for `query` (cleaned with `clean_query`), best first."""
        query = clean_query(query)
        if not query:
            return ()
        with self._lock:
            hit = self._cache.get(query)
            if hit is not None:
                self._cache.move_to_end(query)
                return hit
            hits = self._searcher.search(query, SEARCH_RETURN_N)
            by_asin = self.catalog.by_asin
            result = tuple(h.docid for h in hits if h.docid in by_asin)
            self._cache[query] = result
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return result
