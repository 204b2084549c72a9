"""Product search: BM25 over the catalog through the project's Lucene index (retrieval_index.lucene).

As in WebShop, each product is indexed as one document whose text is its title, description, first
feature bullet and option values, lower-cased (`Product.search_text`), and a search returns the top
50 products, shown 10 per page.

The index is built once per catalog, in a child process (its JVM's indexing heap is not kept by the
env's process), and reused: by default under
`$AGENTGYM_OPSD_CACHE/webshop/index-<catalog fingerprint>` (`~/.cache/agentgym-opsd` without the
variable), or in the folder given as `index_dir`. A folder that already holds an index is used as
it is (so WebShop's own pyserini indexes work too: their document ids are ASINs). Builds go to a
temporary folder first and are renamed into place (`build_index` does it), so a crash or a
concurrent build never leaves a half-written index behind.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

from agentgym_opsd.contract import EnvUnavailable
from agentgym_opsd.paths import cache_dir
from environments.webshop.catalog import Catalog
from retrieval_index.lucene import BM25Searcher, build_index_in_child

__all__ = ["ProductSearch", "clean_query", "SEARCH_RETURN_N", "PRODUCTS_PER_PAGE", "MAX_QUERY_WORDS"]

SEARCH_RETURN_N = 50  # results per search (WebShop's SEARCH_RETURN_N)
PRODUCTS_PER_PAGE = 10  # results per page (WebShop's PRODUCT_WINDOW)
MAX_QUERY_WORDS = 64  # longer queries are cut: a search box query, not a document
MAX_QUERY_CHARS = 1000


def clean_query(text: str) -> str:
    """A search query as the env runs it: lower case, whitespace collapsed, at most 64 words and
    1000 characters (the same text is shown back on the results page)."""
    words = text.lower().split()[:MAX_QUERY_WORDS]
    return " ".join(words)[:MAX_QUERY_CHARS].strip()


def _has_index(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("segments_*"))


class _Documents:
    """The catalog's index records, made one at a time as the indexer reads them (a list of them all
    held every product's search text at once: gigabytes for WebShop's 1.18M products); sized for the
    progress bar."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def __len__(self) -> int:
        return len(self.catalog)

    def __iter__(self):
        return iter(self.catalog.documents())


def _build(catalog: Catalog, target: Path, progress: bool) -> None:
    try:
        # In a child process: the indexing JVM's heap (it grows with the catalog) goes when it exits
        # instead of staying in every env process. It writes beside `target` and renames into place:
        # never a half-built index.
        build_index_in_child(_Documents(catalog), target, threads=1, progress=progress)
    except FileExistsError:
        if not _has_index(target):  # not a concurrent build that finished first: a real error
            raise


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
            folder = cache_dir("webshop", f"index-{catalog.fingerprint()}")
        else:
            folder = Path(index_dir).expanduser()
        try:
            if not _has_index(folder):
                _build(catalog, folder, progress)

            self._searcher = BM25Searcher(str(folder))
        except (ImportError, RuntimeError, OSError) as e:
            raise EnvUnavailable(
                f"WebShop search cannot build or open its Lucene index in {folder}: {e} "
                "(`make setup` installs pyserini and Java; index_dir= chooses another folder)"
            ) from None
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
