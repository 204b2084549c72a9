"""Catalog loaders (WebShop's raw, processed and instruction files), goals and their fixed splits."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from environments.webshop.builtin import BUILTIN_CATALOG_NAME, builtin_catalog
from environments.webshop.catalog import Catalog, CatalogError, find_catalog_files, parse_pricing, price_of
from environments.webshop.goals import NO_PRICE_BOUND, build_goals, price_upper_bound, split_ranges


@pytest.fixture(scope="module")
def webshop_dir(shared_data):
    return shared_data("webshop")


@pytest.fixture(scope="module")
def real_catalog(webshop_dir):
    return Catalog.from_files(webshop_dir)


# ------------------------------------------------------------------------------------------------
# Loaders.


def test_parse_pricing():
    assert parse_pricing("$12.99") == ((12.99,), "$12.99")
    assert parse_pricing("$10.99 - $15.50") == ((10.99, 15.5), "$10.99 to $15.5")
    assert parse_pricing("$1,299.00") == ((1299.0,), "$1299.0")
    assert parse_pricing([19.99, 27.99]) == ((19.99, 27.99), "$19.99 to $27.99")
    assert parse_pricing("") == ((100.0,), "$100.0")
    assert parse_pricing(None) == ((100.0,), "$100.0")


def test_raw_records_are_processed_as_webshop_does():
    records = [
        {"asin": "B01", "name": "Shirt", "pricing": "$5.00 - $9.00", "small_description": "soft",
         "customization_options": {"Color": [{"value": " Navy/White "}], "Size": None},
         "category": "fashion", "query": " Men's Shirts ", "product_category": "A › B"},
        {"asin": "nan", "name": "skipped: asin nan"},
        {"asin": "B0123456789", "name": "skipped: asin longer than 10"},
        {"asin": "B01", "name": "skipped: repeated asin"},
    ]
    attributes = {"B01": {"attributes": ["cotton"], "instruction": "i want a shirt",
                          "instruction_attributes": ["cotton"]}}
    catalog = Catalog.from_records("t", records, attributes=attributes)
    assert [p.asin for p in catalog.products] == ["B01"]
    p = catalog.products[0]
    assert p.title == "Shirt" and p.bullet_points == ("soft",)
    assert dict(p.options) == {"color": ("navy | white",)}  # None groups dropped, "/" -> " | ", lower case
    assert p.query == "men's shirts"
    assert p.attributes == ("cotton",)
    assert catalog.synthetic_instructions == {"B01": ("i want a shirt", ("cotton",))}
    # A product without an attribute record gets WebShop's placeholder; a record's empty list stays empty.
    assert Catalog.from_records("t", records[:1]).products[0].attributes == ("DUMMY_ATTR",)
    assert Catalog.from_records("t", records[:1], attributes={"B01": {"attributes": []}}).products[0].attributes == ()
    processed = {"asin": "B03", "Title": "x", "Attributes": []}
    assert Catalog.from_records("t", [processed], processed=True).products[0].attributes == ()


def test_range_price_is_inside_the_range_and_deterministic():
    p = Catalog.from_records("t", [{"asin": "B02", "name": "x", "pricing": "$10 - $20"}]).products[0]
    assert 10.0 <= price_of(p) <= 20.0
    assert price_of(p) == price_of(p)


def test_bad_files_raise_catalog_errors(tmp_path):
    with pytest.raises(CatalogError, match="no such file"):
        Catalog.from_files(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CatalogError, match="bad.json:1: invalid JSON"):
        Catalog.from_files(tmp_path / "bad.json")
    (tmp_path / "docs.jsonl").write_text('{"id": "x"}\n')
    with pytest.raises(CatalogError, match="docs.jsonl:1"):
        Catalog.from_files(tmp_path / "docs.jsonl")
    with pytest.raises(CatalogError, match="no WebShop product file"):
        find_catalog_files(tmp_path)


def test_real_folder_finds_raw_items_and_instructions(webshop_dir, real_catalog):
    files = find_catalog_files(webshop_dir)
    assert files["items"].name == "items_shuffle_100.json"
    assert files["attributes"].name == "items_ins_v2_1000.json"
    assert len(real_catalog) == 100
    assert len(real_catalog.synthetic_instructions) == 44  # per the data's provenance note
    assert not real_catalog.human_instructions


def test_raw_and_processed_loaders_agree_on_the_real_products(webshop_dir, real_catalog):
    processed = Catalog.from_files(
        webshop_dir / "products_100_documents.jsonl", attributes=webshop_dir / "items_ins_v2_1000.json"
    )
    assert processed.products == real_catalog.products
    # The documents' own index texts are WebShop's recipe, which Product.search_text reproduces.
    with open(webshop_dir / "products_100_documents.jsonl", encoding="utf-8") as f:
        contents = {d["id"]: d["contents"] for d in map(json.loads, f)}
    assert {d["id"]: d["contents"] for d in real_catalog.documents()} == contents


def test_human_instructions_give_human_goals(tmp_path, webshop_dir, real_catalog):
    # The processed documents carry one product's crowd-sourced instruction.
    documents = Catalog.from_files(webshop_dir / "products_100_documents.jsonl")
    goals = build_goals(documents)
    assert [(g.kind, g.asin, g.attributes, g.goal_options) for g in goals] == [
        ("human", "B07FYPSNH8", ("gluten free",), ())
    ]
    assert goals[0].instruction_text.startswith("i am looking for a gluten free, 100% vegan plant based protein shake")
    # An items_human_ins.json file: one goal per instruction that has attributes.
    asin = real_catalog.products[5].asin
    human = {asin: [
        {"instruction": "i need it in red.", "instruction_attributes": ["red"], "instruction_options": ["red"]},
        {"instruction": "no attributes: skipped", "instruction_attributes": [], "instruction_options": []},
    ]}
    (tmp_path / "items_human_ins.json").write_text(json.dumps(human))
    catalog = Catalog.from_files(
        webshop_dir / "items_shuffle_100.json",
        attributes=webshop_dir / "items_ins_v2_1000.json",
        human=tmp_path / "items_human_ins.json",
    )
    goals = build_goals(catalog)
    assert len(goals) == 1 and goals[0].kind == "human" and goals[0].goal_options == ("red",)
    assert goals[0].instruction_text.startswith("i need it in red")  # the final "." is stripped
    assert len(build_goals(catalog, "synthetic")) == len(build_goals(real_catalog))


# ------------------------------------------------------------------------------------------------
# Goals.


def test_synthetic_goals_one_per_option_combination(real_catalog):
    goals = build_goals(real_catalog)
    expected = sum(
        math.prod(len(v) for v in p.options.values()) if p.options else 1
        for p in real_catalog.products
        if p.asin in real_catalog.synthetic_instructions
    )
    assert len(goals) == expected
    by_asin = {}
    for g in goals:
        by_asin.setdefault(g.asin, []).append(g)
    for asin, group in by_asin.items():
        product = real_catalog.by_asin[asin]
        names = sorted(product.options)
        combos = {tuple(zip(names, c)) for c in itertools.product(*(product.options[n] for n in names))}
        assert {tuple(g.goal_options.items()) for g in group} == combos
        for g in group:
            assert g.kind == "synthetic" and g.name == product.title and g.query == product.query
            assert g.attributes == real_catalog.synthetic_instructions[asin][1]
            for name, value in g.goal_options.items():
                assert f"{name}: {value}" in g.instruction_text
            if g.price_upper != NO_PRICE_BOUND:
                assert g.price_upper > real_catalog.price(asin)
                assert g.instruction_text.endswith(f", and price lower than {g.price_upper:.2f} dollars")


def test_goals_are_deterministic(webshop_dir, real_catalog):
    again = Catalog.from_files(webshop_dir)
    assert [g.to_dict() for g in build_goals(again)] == [g.to_dict() for g in build_goals(real_catalog)]


def test_price_upper_bound_rule():
    for seed in range(20):
        upper, text = price_upper_bound(23.5, f"s{seed}")
        assert upper in (40.0, 50.0, 60.0)  # the larger of two of 30, 40, 50, 60
        assert text == f", and price lower than {upper:.2f} dollars"
    assert price_upper_bound(985.0, "s") == (NO_PRICE_BOUND, "")  # only $990 is left above


def test_split_ranges():
    full = split_ranges(12_087)
    assert (full["test"], full["eval"], full["train"]) == (range(0, 500), range(500, 1500), range(1500, 12_087))
    assert split_ranges(50_000)["eval"] == range(500, 1500)
    small = split_ranges(501)
    assert (small["test"], small["eval"], small["train"]) == (range(0, 21), range(21, 62), range(62, 501))
    tiny = split_ranges(3)
    assert (len(tiny["test"]), len(tiny["eval"]), len(tiny["train"])) == (1, 1, 1)
    assert split_ranges(1)["test"] == range(0, 1)
    for n in (1, 2, 7, 177, 501, 12_086, 20_000):
        s = split_ranges(n)
        assert list(s["test"]) + list(s["eval"]) + list(s["train"]) == list(range(n)) == list(s["all"])


def test_builtin_catalog_is_labelled_synthetic():
    catalog = builtin_catalog()
    assert catalog.name == BUILTIN_CATALOG_NAME and catalog.synthetic
    assert all(p.asin.startswith("SYN") for p in catalog.products)
    goals = build_goals(catalog)
    assert len(goals) > 100 and all(g.kind == "synthetic" for g in goals)
    assert all(len(split_ranges(len(goals))[s]) > 0 for s in ("test", "eval", "train"))


def test_attributes_page_of_a_product_with_an_empty_attribute_list(shared_data):
    """WebShop keeps an empty attribute list empty: the Attributes page shows no "DUMMY_ATTR" (20 of the
    100 sample products have an empty list)."""
    from environments.webshop.pages import SUB, Session, render

    folder = shared_data("webshop")
    empty = {asin for asin, record in json.loads((folder / "items_ins_v2_1000.json").read_text()).items()
             if record.get("attributes") == []}  # fmt: skip
    catalog = Catalog.from_files(folder)
    products = {p.asin: p for p in catalog.products}
    shown = [a for a in products if a in empty]
    assert len(shown) == 20
    for asin in shown:
        assert products[asin].attributes == ()
        page = render(Session(page=SUB, asin=asin, sub_page="Attributes"), "buy it", products, show_attrs=True)
        assert "DUMMY_ATTR" not in page
        assert page.endswith(" [SEP] ".join(t for t in (products[asin].category, products[asin].query,
                                                        products[asin].product_category) if t))
