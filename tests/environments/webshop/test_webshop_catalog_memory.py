"""What loading a WebShop catalog costs in memory (benchmarks/scale.py measures it up to 100k products
and extrapolates to WebShop's 1.18M): the raw item file is read one product at a time, values many
products repeat are kept once, and the search index is fed one product at a time."""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
from pathlib import Path

import pytest

from environments.webshop import search as search_module
from environments.webshop.catalog import Catalog

CATEGORIES = ["Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
              "Clothing, Shoes & Jewelry › Women › Clothing › Tops, Tees & Blouses › T-Shirts",
              "Home & Kitchen › Furniture › Living Room Furniture › Tables › Sofa & Console Tables"]  # fmt: skip


def write_items(path: Path, n: int, seed: int = 0) -> list[dict]:
    """A raw items_shuffle file of `n` products with text of WebShop's sizes."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(2000)]

    def text(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k))

    items = []
    for i in range(n):
        category = rng.randrange(len(CATEGORIES))
        items.append({
            "asin": f"B{i:09d}",
            "name": text(15),
            "full_description": text(60),
            "small_description": [text(12) for _ in range(4)],
            "pricing": [round(rng.uniform(5, 90), 2)],
            "customization_options": {"Color": [{"value": c} for c in ("Black", "Navy Blue", "White")],
                                      "Size": [{"value": s} for s in ("Small", "Medium", "Large", "X-Large")]},
            "category": ["beauty", "fashion", "garden"][category],
            "query": ["shampoo", "women's t-shirts", "console tables"][category],
            "product_category": CATEGORIES[category],
            "images": [f"https://m.media-amazon.com/images/I/{i}.jpg"],
            "average_rating": 4.5,
            "page": 1,
        })  # fmt: skip
    path.write_text(json.dumps(items))
    return items


def test_loading_holds_the_catalog_not_the_raw_file(tmp_path: Path) -> None:
    """The peak of a load is the catalog plus one record, not the file's bytes, text and every parsed
    record at once (2.6 times the catalog here, 3.4 times on the generated catalogs of benchmarks/scale.py)."""
    path = tmp_path / "items_shuffle_3000.json"
    write_items(path, 3000)
    gc.collect()
    tracemalloc.start()
    try:
        catalog = Catalog.from_files(path)
        gc.collect()
        final, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(catalog) == 3000
    assert peak < 1.8 * final, f"peak {peak / 2**20:.1f} MiB for a catalog of {final / 2**20:.1f} MiB"


def test_values_many_products_repeat_are_kept_once(tmp_path: Path) -> None:
    path = tmp_path / "items_shuffle_50.json"
    write_items(path, 50)
    products = Catalog.from_files(path).products
    same = [p for p in products if p.product_category == CATEGORIES[0]]
    assert len(same) >= 2
    assert all(p.product_category is same[0].product_category and p.query is same[0].query for p in same)
    assert all(p.options["size"][0] is products[0].options["size"][0] for p in products)
    assert all(list(p.options)[0] is list(products[0].options)[0] for p in products)


def test_a_catalog_cut_to_num_products_reads_no_further(tmp_path: Path) -> None:
    """num_products=N stops reading after N products: the rest of the file is never parsed (here it is
    cut off mid-record, as a partial download leaves it)."""
    path = tmp_path / "items_shuffle_10.json"
    write_items(path, 10)
    text = path.read_text()
    path.write_text(text[: len(text) * 6 // 10])
    catalog = Catalog.from_files(path, num_products=3)
    assert [p.asin for p in catalog.products] == ["B000000000", "B000000001", "B000000002"]


def test_the_search_index_reads_products_one_at_a_time(tmp_path: Path, monkeypatch) -> None:
    """The index build is fed the catalog's records as it reads them (a list of every product's search
    text held them all at once), with the count for its progress bar."""
    path = tmp_path / "items_shuffle_20.json"
    write_items(path, 20)
    catalog = Catalog.from_files(path)
    made = []
    real_documents = catalog.documents

    def counting_documents():
        for doc in real_documents():
            made.append(doc["id"])
            yield doc

    monkeypatch.setattr(catalog, "documents", counting_documents)
    seen = []

    def fake_build(records, out_dir, **kwargs):
        assert len(records) == 20
        for record in records:
            assert len(made) == len(seen) + 1, "the records were made before the indexer asked for them"
            seen.append(record)
        Path(out_dir).mkdir(parents=True)

    monkeypatch.setattr(search_module, "build_index_in_child", fake_build)
    search_module._build(catalog, tmp_path / "index", progress=False)
    assert [r["id"] for r in seen] == [p.asin for p in catalog.products]


def test_the_env_process_builds_no_index_itself(tmp_path: Path, monkeypatch) -> None:
    """The search index is built in a child process: the indexing JVM's heap, which grows with the
    catalog (0.7 GB at 100k products) and which a JVM keeps, does not stay in the env's process."""
    import retrieval_index.lucene

    path = tmp_path / "items_shuffle_30.json"
    write_items(path, 30)
    catalog = Catalog.from_files(path)
    monkeypatch.setattr(retrieval_index.lucene, "build_index", lambda *a,
                        **k: pytest.fail("indexed in the env's process"))
    search = search_module.ProductSearch(catalog, tmp_path / "index")
    target = catalog.products[7]
    assert search.search(target.title)[0] == target.asin
