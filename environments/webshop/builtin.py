"""The embedded default catalog: SYNTHETIC products written by this project, not scraped data.

WebShop's real catalog (1.18 M scraped Amazon products) cannot ship inside this package, so the env
falls back to a small catalog generated here, deterministically, from the templates below: 12
product types over WebShop's five categories (beauty, fashion, garden, electronics, grocery), five
products of each from made-up brands, with WebShop-shaped fields (title, description, features,
price or price range, option groups, annotated attributes, category path, scrape query) and a
WebShop-style synthetic instruction per product. ASINs start with "SYN" so that they can never be
mistaken for real ones, and the catalog is named "builtin-synthetic" in task ids and hindsight.

It exists so that the env works with no download (for demos, smoke tests and the contract suite).
Scores on it say nothing about WebShop: load a real catalog with `catalog=PATH` for that.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from environments.webshop.catalog import Catalog

__all__ = ["builtin_catalog", "BUILTIN_CATALOG_NAME"]

BUILTIN_CATALOG_NAME = "builtin-synthetic"

# One template per product type: scrape query, category, category path, the noun phrase of titles,
# the attribute pool, option groups (value pools) and base price.
_TYPES: list[dict[str, Any]] = [
    dict(
        query="shampoo", category="beauty",
        path="Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
        noun="Shampoo",
        attrs=["sulfate free", "paraben free", "argan oil", "dry hair", "color treated hair", "tea tree"],
        options={"size": ["8 fl oz", "16 fl oz", "32 fl oz"]}, price=12.0,
    ),
    dict(
        query="face moisturizer", category="beauty",
        path="Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
        noun="Face Moisturizer Cream",
        attrs=["hyaluronic acid", "sensitive skin", "fragrance free", "spf 30", "vitamin c", "oil free"],
        options={"size": ["1.7 ounce", "3.4 ounce"]}, price=24.0,
    ),
    dict(
        query="lipstick", category="beauty", path="Beauty & Personal Care › Makeup › Lips › Lipstick",
        noun="Matte Lipstick", attrs=["long lasting", "cruelty free", "vegan", "moisturizing", "waterproof"],
        options={"color": ["ruby red", "nude pink", "deep plum", "coral"]}, price=9.0,
    ),
    dict(
        query="women's t-shirts", category="fashion",
        path="Clothing, Shoes & Jewelry › Women › Clothing › Tops, Tees & Blouses › T-Shirts",
        noun="Women's Crew Neck T-Shirt",
        attrs=["cotton", "short sleeve", "machine wash", "relaxed fit", "moisture wicking"],
        options={"size": ["small", "medium", "large"], "color": ["black", "white", "heather grey"]}, price=15.0,
    ),
    dict(
        query="men's running shoes", category="fashion",
        path="Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running",
        noun="Men's Running Shoes", attrs=["rubber sole", "lightweight", "breathable mesh", "arch support", "non slip"],
        options={"size": ["9", "10", "11"], "color": ["navy blue", "black", "grey"]}, price=55.0,
    ),
    dict(
        query="leather belts", category="fashion", path="Clothing, Shoes & Jewelry › Men › Accessories › Belts",
        noun="Leather Belt", attrs=["genuine leather", "alloy buckle", "adjustable", "gift box"],
        options={"size": ["32", "34", "36", "38"]}, price=19.0,
    ),
    dict(
        query="throw pillow covers", category="garden",
        path="Home & Kitchen › Bedding › Decorative Pillows, Inserts & Covers › Throw Pillow Covers",
        noun="Throw Pillow Cover", attrs=["hidden zipper", "machine washable", "linen", "double sided", "living room"],
        options={"color": ["beige", "sage green", "navy"], "size": ["18 x 18 inch", "20 x 20 inch"]}, price=14.0,
    ),
    dict(
        query="coffee mugs", category="garden",
        path="Home & Kitchen › Kitchen & Dining › Dining & Entertaining › Cups, Mugs & Saucers › Mugs",
        noun="Ceramic Coffee Mug", attrs=["dishwasher safe", "microwave safe", "large capacity", "lead free"],
        options={"color": ["white", "matte black", "speckled blue"]}, price=11.0,
    ),
    dict(
        query="led desk lamps", category="garden",
        path="Tools & Home Improvement › Lighting & Ceiling Fans › Lamps & Shades › Desk Lamps",
        noun="LED Desk Lamp", attrs=["dimmable", "usb charging port", "eye caring", "touch control", "memory function"],
        options={"color": ["black", "white"]}, price=29.0,
    ),
    dict(
        query="wireless earbuds", category="electronics",
        path="Electronics › Headphones, Earbuds & Accessories › Earbud Headphones",
        noun="Wireless Earbuds",
        attrs=["noise cancelling", "bluetooth 5.3", "charging case", "water resistant", "long battery life"],
        options={"color": ["black", "white", "blue"]}, price=39.0,
    ),
    dict(
        query="usb c cables", category="electronics",
        path="Electronics › Computers & Accessories › Computer Accessories & Peripherals › Cables › USB Cables",
        noun="USB C Charging Cable", attrs=["fast charging", "braided nylon", "data transfer", "durable"],
        options={"size": ["3 ft", "6 ft", "10 ft"], "color": ["black", "red"]}, price=8.0,
    ),
    dict(
        query="green tea", category="grocery",
        path="Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Green",
        noun="Green Tea Bags", attrs=["organic", "caffeine free", "non gmo", "gluten free", "individually wrapped"],
        options={"flavor name": ["jasmine", "mint", "lemon ginger"], "size": ["20 count", "100 count"]}, price=6.0,
    ),
]

_BRANDS = [
    ["Lumora", "Verdane", "Kestrel & Co", "Oakhollow", "Brisa"],
    ["Nimbus", "Solvay Lane", "Harrowgate", "Pellucid", "Marigold Row"],
]
_STYLES = ["Classic", "Everyday", "Premium", "Essential", "Signature"]


def _product(type_index: int, variant: int, spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One raw WebShop item and its items_ins_v2 record, for product `variant` of type `spec`."""
    brand = _BRANDS[type_index % 2][variant]
    pool = spec["attrs"]
    # Each product has a different window of the type's attributes (3 or 4 of them).
    attrs = [pool[(variant + k) % len(pool)] for k in range(3 + variant % 2)]
    title = f"{brand} {_STYLES[variant]} {spec['noun']} with {attrs[0].title()} and {attrs[1].title()}"
    description = (
        f"The {brand} {spec['noun'].lower()} features {attrs[0]} and {attrs[1]}. "
        f"It also offers {', '.join(attrs[2:])}."
    )
    bullets = [f"{a.capitalize()}: a {spec['noun'].lower()} that is {a}." for a in attrs]
    bullets.append(f"Brand: {brand}. Model {type_index + 1}{variant + 1:02d}.")
    base = spec["price"] * (1.0 + 0.35 * variant)
    pricing = f"${base:.2f}" if variant % 3 else f"${base:.2f} - ${base * 1.4:.2f}"
    customization: dict[str, list[dict[str, str]]] = {}
    for group, values in spec["options"].items():
        # Products offer overlapping subsets of the type's option values.
        keep = [v for k, v in enumerate(values) if (k + variant) % (len(values) + 1) != 0] or values[:1]
        customization[group.title()] = [{"value": v.title() if group == "color" else v} for v in keep]
    asin = f"SYN{type_index + 1:02d}{variant + 1:05d}"
    item = {
        "asin": asin,
        "name": title,
        "full_description": description,
        "small_description": bullets,
        "pricing": pricing,
        "customization_options": customization,
        "category": spec["category"],
        "query": spec["query"],
        "product_category": spec["path"],
        "average_rating": "",
        "images": [],
    }
    wanted = [attrs[0], attrs[2]] if variant % 2 else [attrs[1], attrs[0]]
    phrasing = [
        "i am looking for {a} {q} that is {b}",
        "find me {a}, {b} {q}",
        "i need {q} that are {a} and {b}",
        "i want to buy {a} {q} with {b}",
        "looking for {q} which is {a} and {b}",
    ][variant]
    instruction = phrasing.format(a=wanted[0], b=wanted[1], q=spec["query"])
    record = {"attributes": attrs, "instruction": instruction, "instruction_attributes": wanted}
    return item, record


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    """The embedded synthetic catalog (60 products; the same object on every call)."""
    items, records = [], {}
    for t, spec in enumerate(_TYPES):
        for v in range(5):
            item, record = _product(t, v, spec)
            items.append(item)
            records[item["asin"]] = record
    catalog = Catalog.from_records(BUILTIN_CATALOG_NAME, items, attributes=records, synthetic=True)
    return catalog
