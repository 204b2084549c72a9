"""The WebShop product catalog: loaders for WebShop's own file formats, and per-product prices.

Formats read (all from WebShop, princeton-nlp/WebShop):

- raw item files, `items_shuffle_*.json`: a JSON list of scraped products (`asin`, `name`,
  `full_description`, `small_description`, `pricing` as text such as "$12.99" or "$10.99 - $15.99",
  `customization_options`, `category`, `query`, `product_category`, ...);
- attribute / instruction files, `items_ins_v2_*.json`: `{asin: {"attributes": [...],
  "instruction": str, "instruction_attributes": [...]}}` (the synthetic instructions);
- human instruction files, `items_human_ins.json`: `{asin: [{"instruction": str,
  "instruction_attributes": [...], "instruction_options": [...]}, ...]}` (crowd-sourced goals);
- processed documents, `documents.jsonl`: one `{"id", "contents", "product"}` per line, where
  `product` already carries WebShop's processed fields (`Title`, `BulletPoints`, `options`, ...).

Raw items are processed the way WebShop's `load_products` does it: products with an ASIN of "nan"
or longer than 10 characters, and repeated ASINs, are skipped; option names are lower-cased, option
values stripped, lower-cased and "/" written " | "; a product that has no `items_ins_v2` record (or
whose record has no `attributes` key) gets the single attribute "DUMMY_ATTR", while a record's empty
list stays empty; reviews are empty and the rating "N.A." (WebShop ships no review file).

Prices: a product with one price costs that; a price range costs a point drawn uniformly inside it;
no price costs 100.0 (WebShop's rule). WebShop draws from the unseeded global RNG, so its prices
change from run to run; here the draw is seeded by the ASIN, so the same product has the same price
in every process and on every machine.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from agentgym_opsd.contract import EnvUnavailable
from agentgym_opsd.io import DataFileError, iter_json_array, read_json_file, read_jsonl_numbered

__all__ = [
    "Product",
    "Catalog",
    "CatalogError",
    "product_from_raw",
    "product_from_processed",
    "parse_pricing",
    "price_of",
    "find_catalog_files",
    "DEFAULT_PRICE",
]

DEFAULT_PRICE = 100.0  # WebShop's price for a product without one
MAX_ASIN_LENGTH = 10


class CatalogError(EnvUnavailable):
    """A catalog file is missing or malformed; the message names the file and the fix."""


@dataclass(frozen=True, slots=True)
class Product:
    """One product, with the fields WebShop's pages and reward read.

    Attributes:
        asin: Amazon's product id (10 characters, upper case).
        title: the product name (`Title`).
        description: the long description (`Description`).
        bullet_points: the feature bullets (`BulletPoints`).
        pricing: one price or a (low, high) range, in dollars.
        price_tag: the price as pages show it ("$12.99", "$10.99 to $15.99").
        options: option group (lower case) -> its values, in page order.
        attributes: WebShop's annotated attributes of the product (`Attributes`).
        category: WebShop's coarse category (beauty, fashion, ...).
        query: the search query the product was scraped with (lower case).
        product_category: Amazon's category path ("A › B › C").
        rating: the rating shown on the item page ("N.A." without reviews).
        reviews: `(title, score, body)` triples for the Reviews page.
    """

    asin: str
    title: str
    description: str
    bullet_points: tuple[str, ...]
    pricing: tuple[float, ...]
    price_tag: str
    options: Mapping[str, tuple[str, ...]]
    attributes: tuple[str, ...]
    category: str
    query: str
    product_category: str
    rating: str = "N.A."
    reviews: tuple[tuple[str, str, str], ...] = ()

    def search_text(self) -> str:
        """The text WebShop indexes for search: title, description, first bullet and the options,
        lower-cased (WebShop's `convert_product_file_format.py` recipe)."""
        option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in self.options.items())
        first_bullet = self.bullet_points[0] if self.bullet_points else ""
        return " ".join([self.title, self.description, first_bullet, option_text]).lower()


def parse_pricing(pricing: Any) -> tuple[tuple[float, ...], str]:
    """WebShop's price parsing: "$a" or "$a - $b" (or a list of numbers) -> (prices, price tag).

    Returns at most two prices; no usable price gives `(100.0,)` and "$100.0".
    """
    values: list[float] = []
    if isinstance(pricing, str):
        for piece in pricing.split("$")[1:]:
            digits = re.sub(r"[^\d.]", "", piece)
            try:
                values.append(float(Decimal(digits)))
            except (InvalidOperation, ValueError):
                continue
    elif isinstance(pricing, (list, tuple)):
        for v in pricing:
            try:
                values.append(float(v))
            except (TypeError, ValueError):
                continue
    if not values:
        return (DEFAULT_PRICE,), f"${DEFAULT_PRICE}"
    if len(values) == 1:
        return (values[0],), f"${values[0]}"
    low, high = values[0], values[1]
    return (low, high), f"${low} to ${high}"


def price_of(product: Product) -> float:
    """The price a purchase of `product` costs: its single price, or a point inside its range drawn
    with a generator seeded by the ASIN (deterministic; WebShop draws it unseeded)."""
    if len(product.pricing) == 1:
        return product.pricing[0]
    low, high = product.pricing[0], product.pricing[1]
    return random.Random(f"webshop-price:{product.asin}").uniform(low, high)


def _shared(strings: dict[str, str] | None, text: str) -> str:
    """`text`, or the equal string already in `strings` (one object for a value many products repeat)."""
    return text if strings is None else strings.setdefault(text, text)


def _options_from_raw(customization_options: Any, strings: dict[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    options: dict[str, tuple[str, ...]] = {}
    if not isinstance(customization_options, Mapping):
        return options
    for name, contents in customization_options.items():
        if not contents:
            continue
        values = []
        for content in contents:
            value = content.get("value") if isinstance(content, Mapping) else content
            if value is None:
                continue
            values.append(_shared(strings, str(value).strip().replace("/", " | ").lower()))
        options[_shared(strings, str(name).lower())] = tuple(values)
    return options


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _reviews(value: Any) -> tuple[tuple[str, str, str], ...]:
    out = []
    for r in value or ():
        if isinstance(r, Mapping):
            score = r.get("score", r.get("stars", ""))
            out.append((str(r.get("title", "")), str(score), str(r.get("body", r.get("review", "")))))
    return tuple(out)


def _annotated_attributes(record: Mapping[str, Any] | None, strings: dict[str, str] | None = None) -> tuple[str, ...]:
    """WebShop's `Attributes` of a product from its `items_ins_v2` record: the record's list as it is
    (empty included), or ["DUMMY_ATTR"] when the product has no record or the record no `attributes`."""
    if record and "attributes" in record and record["attributes"] is not None:
        return tuple(_shared(strings, a) for a in _as_list(record["attributes"]))
    return ("DUMMY_ATTR",)


def product_from_raw(
    item: Mapping[str, Any], attributes: Mapping[str, Any] | None = None, strings: dict[str, str] | None = None
) -> Product:
    """A product from one raw `items_shuffle` record (processed as WebShop's `load_products`).

    Args:
        item: the raw record.
        attributes: the `items_ins_v2` record of this ASIN (for `Attributes`), if any.
        strings: shared strings of a catalog being loaded: values that many products repeat (category,
            query, category path, option names and values, attributes, price tags) are kept once.
    """
    asin = str(item["asin"])
    pricing, price_tag = parse_pricing(item.get("pricing"))
    return Product(
        asin=asin,
        title=str(item.get("name") or ""),
        description=str(item.get("full_description") or ""),
        bullet_points=tuple(_as_list(item.get("small_description"))) or ("",),
        pricing=pricing,
        price_tag=_shared(strings, price_tag),
        options=_options_from_raw(item.get("customization_options"), strings),
        attributes=_annotated_attributes(attributes, strings),
        category=_shared(strings, str(item.get("category") or "")),
        query=_shared(strings, str(item.get("query") or "").lower().strip()),
        product_category=_shared(strings, str(item.get("product_category") or "")),
    )


def product_from_processed(
    product: Mapping[str, Any], attributes: Mapping[str, Any] | None = None, strings: dict[str, str] | None = None
) -> Product:
    """A product from the `product` field of a `documents.jsonl` line (already processed by WebShop).

    Falls back to the raw field names where a processed one is missing. `strings`: see `product_from_raw`.
    """
    if "Title" not in product and "name" in product:
        return product_from_raw(product, attributes, strings)
    pricing, price_tag = parse_pricing(product.get("pricing"))
    raw_options = product.get("options")
    if isinstance(raw_options, Mapping):
        options = {_shared(strings, str(k).lower()): tuple(_shared(strings, str(v)) for v in (vals or ()))
                   for k, vals in raw_options.items()}  # fmt: skip
    else:
        options = _options_from_raw(product.get("customization_options"), strings)
    if product.get("Attributes") is not None:  # already processed: kept as it is, an empty list too
        attrs = tuple(_shared(strings, a) for a in _as_list(product["Attributes"]))
        if attrs == ("DUMMY_ATTR",) and attributes and "attributes" in attributes:
            attrs = _annotated_attributes(attributes, strings)
    else:
        attrs = _annotated_attributes(attributes, strings)
    return Product(
        asin=str(product.get("asin") or ""),
        title=str(product.get("Title") or ""),
        description=str(product.get("Description") or ""),
        bullet_points=tuple(_as_list(product.get("BulletPoints"))) or ("",),
        pricing=pricing,
        price_tag=_shared(strings, str(product.get("Price") or price_tag)),
        options=options,
        attributes=attrs,
        category=_shared(strings, str(product.get("category") or "")),
        query=_shared(strings, str(product.get("query") or "").lower().strip()),
        product_category=_shared(strings, str(product.get("product_category") or "")),
        rating=_shared(strings, str(product.get("Rating") if product.get("Rating") not in (None, "") else "N.A.")),
        reviews=_reviews(product.get("Reviews")),
    )


def _read_json(path: Path) -> Any:
    if not path.exists():
        raise CatalogError(f"{path}: no such file (pass the path of a WebShop data file)")
    try:
        return read_json_file(path)
    except DataFileError as e:  # names the file and the line
        raise CatalogError(str(e)) from None


def _iter_documents(path: Path) -> Iterator[dict[str, Any]]:
    """The `product` of each line of a WebShop `documents.jsonl`, read line by line."""
    try:
        for number, obj in read_jsonl_numbered(path):
            if not isinstance(obj.get("product"), dict):
                raise CatalogError(f"{path}:{number}: expected a WebShop document {{'id', 'contents', 'product'}}")
            yield obj["product"]
    except DataFileError as e:  # names the file and the line
        hint = " (pass the path of a WebShop documents.jsonl)" if "no such file" in str(e) else ""
        raise CatalogError(f"{e}{hint}") from None


def _iter_items(path: Path) -> Iterator[Any]:
    """The records of a raw `items_shuffle*.json` (one JSON array), parsed one at a time."""
    if not path.exists():
        raise CatalogError(f"{path}: no such file (pass the path of a WebShop data file)")
    try:
        yield from iter_json_array(path)
    except DataFileError as e:  # names the file and the line
        message = str(e)
        if "expected a JSON array" in message:
            message += " (a WebShop items file is a JSON list of items)"
        raise CatalogError(message) from None


def find_catalog_files(directory: str | Path) -> dict[str, Path]:
    """The WebShop data files in a folder: `items` (an `items_shuffle*.json`, else a
    `*documents*.jsonl`), `attributes` (`items_ins_v2*.json`) and `human` (`items_human_ins*.json`).

    Raises:
        CatalogError: the folder has no product file.
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise CatalogError(f"{folder}: not a folder of WebShop data files")

    def first(patterns: Iterable[str]) -> Path | None:
        for pattern in patterns:
            hits = sorted(folder.glob(pattern))
            if hits:
                return hits[0]
        return None

    items = first(["items_shuffle*.json", "*documents*.jsonl"])
    if items is None:
        raise CatalogError(
            f"{folder}: no WebShop product file (items_shuffle_*.json or documents.jsonl); "
            "get them from WebShop's setup.sh data download"
        )
    files = {"items": items}
    attributes = first(["items_ins_v2*.json"])
    if attributes is not None:
        files["attributes"] = attributes
    human = first(["items_human_ins*.json"])
    if human is not None:
        files["human"] = human
    return files


@dataclass
class Catalog:
    """The products of one WebShop catalog and what goal-building needs from the instruction files.

    Attributes:
        name: a short name for the catalog (used in task ids): the item file's stem, or
            "builtin-synthetic" for the embedded one.
        products: the products, in file order.
        by_asin: ASIN -> product.
        synthetic_instructions: ASIN -> `(instruction, instruction_attributes)` from `items_ins_v2`.
        human_instructions: ASIN -> its crowd-sourced instruction records.
        synthetic: the catalog was made by this project, not scraped (the embedded default).
    """

    name: str
    products: list[Product]
    synthetic_instructions: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    human_instructions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    synthetic: bool = False
    by_asin: dict[str, Product] = field(init=False, repr=False)
    _fingerprint: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.by_asin = {p.asin: p for p in self.products}

    def __len__(self) -> int:
        return len(self.products)

    def price(self, asin: str) -> float:
        """The price a purchase of `asin` costs (see `price_of`)."""
        return price_of(self.by_asin[asin])

    def documents(self) -> Iterable[dict[str, str]]:
        """`{"id", "contents"}` records for the search index, one per product."""
        for p in self.products:
            yield {"id": p.asin, "contents": p.search_text()}

    def fingerprint(self) -> str:
        """A hash of what the search index holds (ids and texts): equal catalogs share an index."""
        if self._fingerprint is None:
            h = hashlib.blake2b(digest_size=12)
            for doc in self.documents():
                h.update(doc["id"].encode("utf-8", "surrogatepass"))
                h.update(b"\x1f")
                h.update(doc["contents"].encode("utf-8", "surrogatepass"))
                h.update(b"\x1e")
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    # ------------------------------------------------------------------------------------------

    @classmethod
    def from_records(
        cls,
        name: str,
        records: Iterable[Mapping[str, Any]],
        *,
        processed: bool = False,
        attributes: Mapping[str, Mapping[str, Any]] | None = None,
        human: Mapping[str, list[dict[str, Any]]] | None = None,
        num_products: int | None = None,
        synthetic: bool = False,
    ) -> Catalog:
        """Build a catalog from product records (raw `items_shuffle` ones, or processed ones).

        Args:
            name: the catalog's short name.
            records: the product records, in order.
            processed: the records are processed products (a `documents.jsonl`'s `product` fields).
            attributes: the `items_ins_v2` mapping (attributes and synthetic instructions).
            human: the `items_human_ins` mapping (crowd-sourced instructions).
            num_products: keep only the first N records (WebShop's `num_products`).
            synthetic: the records were made by this project (the embedded catalog).
        """
        attributes = attributes or {}
        products: list[Product] = []
        synthetic_ins: dict[str, tuple[str, tuple[str, ...]]] = {}
        human_ins: dict[str, list[dict[str, Any]]] = {}
        seen: set[str] = set()
        strings: dict[str, str] = {}  # values many products repeat, kept once (see product_from_raw)
        for i, record in enumerate(records):
            if num_products is not None and i >= num_products:
                break
            if not isinstance(record, Mapping) or "asin" not in record:
                raise CatalogError(f"catalog {name}: record {i} is not a product (no 'asin')")
            asin = str(record["asin"])
            if asin == "nan" or len(asin) > MAX_ASIN_LENGTH or asin in seen:
                continue
            seen.add(asin)
            ins = attributes.get(asin)
            try:
                product = product_from_processed(record, ins,
                                                 strings) if processed else product_from_raw(record, ins, strings)
            except (TypeError, ValueError, AttributeError, KeyError) as e:  # a field of the wrong type
                raise CatalogError(
                    f"catalog {name}: record {i} ({asin}) is malformed ({type(e).__name__}: {e})") from None
            products.append(product)
            if ins and ins.get("instruction"):
                synthetic_ins[asin] = (str(ins["instruction"]),
                                       tuple(_shared(strings, a)
                                             for a in _as_list(ins.get("instruction_attributes"))))  # fmt: skip
            if human and asin in human:
                human_ins[asin] = list(human[asin])
            elif processed and isinstance(record.get("instructions"), list):
                human_ins[asin] = list(record["instructions"])
        if not products:
            raise CatalogError(f"catalog {name}: no products")
        return cls(name, products, synthetic_ins, human_ins, synthetic)

    @classmethod
    def from_files(
        cls,
        items: str | Path,
        *,
        attributes: str | Path | None = None,
        human: str | Path | None = None,
        num_products: int | None = None,
    ) -> Catalog:
        """Load a catalog from WebShop's files.

        Args:
            items: an `items_shuffle*.json` (raw) or a `documents.jsonl` (processed), or a folder
                holding them (with `items_ins_v2*.json` and `items_human_ins*.json` beside them).
            attributes: the `items_ins_v2*.json` (attributes and synthetic instructions).
            human: the `items_human_ins*.json` (crowd-sourced instructions).
            num_products: keep only the first N products (WebShop's `num_products`).
        """
        items_path = Path(items).expanduser()
        if items_path.is_dir():
            found = find_catalog_files(items_path)
            items_path = found["items"]
            attributes = attributes if attributes is not None else found.get("attributes")
            human = human if human is not None else found.get("human")
        attributes_map = _read_json(Path(attributes).expanduser()) if attributes is not None else {}
        if not isinstance(attributes_map, dict):
            raise CatalogError(f"{attributes}: expected {{asin: {{'attributes': [...], ...}}}}")
        human_map = _read_json(Path(human).expanduser()) if human is not None else None
        if human_map is not None and not isinstance(human_map, dict):
            raise CatalogError(f"{human}: expected {{asin: [instruction records]}}")
        # Products are read one at a time (the raw file is never held whole: WebShop's full item file is
        # gigabytes) and the reading stops after num_products.
        if items_path.suffix == ".jsonl":
            records: Iterable[Any] = _iter_documents(items_path)
            processed = True
        else:
            records = _iter_items(items_path)
            processed = False
        try:
            return cls.from_records(
                items_path.stem,
                records,
                processed=processed,
                attributes=attributes_map,
                human=human_map,
                num_products=num_products,
            )
        except CatalogError as e:  # name the file the bad record came from (the readers' errors already do)
            message = str(e)
            raise CatalogError(message if message.startswith(str(items_path)) else f"{items_path}: {message}") from None
