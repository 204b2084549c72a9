"""WebShop goals (what to buy) and their fixed splits.

Goals are built the way WebShop's `get_human_goals` / `get_synthetic_goals` build them:

- human goals, one per crowd-sourced instruction (`items_human_ins.json`); instructions without
  attributes are skipped; the goal options are the instruction's list of option values;
- synthetic goals, one per product with an `items_ins_v2` instruction and per combination of that
  product's option values (groups in sorted order); the instruction reads
  "<instruction> with <group>: <value>, and <group>: <value>"; the goal options are
  `{group: value}`.

Both append ", and price lower than P dollars", where P is the larger of two of the four multiples
of $10 just above the product's price (no bound, P = 1e6, when fewer than two are left below
$1000). WebShop draws P from the unseeded global RNG; here the draw is seeded by the ASIN (and the
instruction's position for human goals), so a goal is the same everywhere.

The goal list is then shuffled with `random.seed(233)` as WebShop does, and split by goal index:
test = goals [0, 500), eval = [500, 1500), train = the rest (WebShop's baseline splits over its
12,087 human goals). A catalog with fewer goals keeps the same proportions (test = the first
500/12087 of the goals, eval the next 1000/12087), with at least one goal in test and eval. A goal's
index never depends on a worker or a seed: goal i is the same task everywhere.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from environments.webshop.catalog import Catalog

__all__ = [
    "Goal",
    "build_goals",
    "human_goals",
    "synthetic_goals",
    "split_ranges",
    "price_upper_bound",
    "SPLITS",
    "SHUFFLE_SEED",
    "WEBSHOP_HUMAN_GOALS",
]

PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))  # $10 .. $990
NO_PRICE_BOUND = 1_000_000.0
SHUFFLE_SEED = 233
WEBSHOP_HUMAN_GOALS = 12_087  # the size of WebShop's human goal set, which the split bounds refer to
TEST_END, EVAL_END = 500, 1500
SPLITS = ("test", "eval", "train", "all")


@dataclass(frozen=True)
class Goal:
    """One task: the instruction and what the reward compares a purchase against.

    Attributes:
        asin: the target product.
        instruction_text: what the agent is told to buy.
        attributes: the goal attributes (phrases the purchase should have).
        goal_options: `{group: value}` for synthetic goals, a list of option values for human goals
            (WebShop's two shapes; the reward treats them as WebShop does).
        price_upper: the price bound (1e6 when the instruction states none).
        query, category, product_category, name: the target product's, for the type reward.
        kind: "human" or "synthetic".
        weight: WebShop's sampling weight (1 for human goals; the mean inverse attribute frequency
            for synthetic ones). Kept for reference: tasks are chosen by index, not sampled.
    """

    asin: str
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: Mapping[str, str] | tuple[str, ...]
    price_upper: float
    query: str
    category: str
    product_category: str
    name: str
    kind: str
    weight: float = 1.0

    def options_list(self) -> list[str]:
        """The goal options as text ("color: red" for a synthetic goal, the value for a human one)."""
        if isinstance(self.goal_options, Mapping):
            return [f"{k}: {v}" for k, v in self.goal_options.items()]
        return list(self.goal_options)

    def to_dict(self) -> dict[str, Any]:
        return {
            "asin": self.asin,
            "instruction_text": self.instruction_text,
            "attributes": list(self.attributes),
            "goal_options": dict(self.goal_options)
            if isinstance(self.goal_options, Mapping)
            else list(self.goal_options),
            "price_upper": self.price_upper,
            "query": self.query,
            "category": self.category,
            "product_category": self.product_category,
            "name": self.name,
            "kind": self.kind,
            "weight": self.weight,
        }


def price_upper_bound(price: float, seed: str) -> tuple[float, str]:
    """WebShop's price bound for a product of price `price`: the larger of two of the (up to) four
    multiples of $10 above the price, drawn with a generator seeded by `seed`.

    Returns:
        `(bound, text)`: the text is ", and price lower than P.PP dollars", or "" with no bound.
    """
    above = [p for p in PRICE_STEPS if p > price][:4]
    if len(above) < 2:
        return NO_PRICE_BOUND, ""
    upper = max(random.Random(seed).sample(above, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def human_goals(catalog: Catalog) -> list[Goal]:
    """One goal per crowd-sourced instruction with at least one attribute (WebShop's rule)."""
    goals = []
    for product in catalog.products:
        for k, record in enumerate(catalog.human_instructions.get(product.asin, ())):
            attributes = tuple(str(a) for a in (record.get("instruction_attributes") or ()))
            if not attributes:
                continue
            upper, price_text = price_upper_bound(catalog.price(product.asin), f"webshop-goal:{product.asin}:{k}")
            goals.append(
                Goal(
                    asin=product.asin,
                    instruction_text=str(record.get("instruction") or "").strip(".") + price_text,
                    attributes=attributes,
                    goal_options=tuple(str(o) for o in (record.get("instruction_options") or ())),
                    price_upper=upper,
                    query=product.query,
                    category=product.category,
                    product_category=product.product_category,
                    name=product.title,
                    kind="human",
                )
            )
    return goals


def synthetic_goals(catalog: Catalog) -> list[Goal]:
    """One goal per product with a synthetic instruction and per combination of its option values."""
    drafts: list[dict[str, Any]] = []
    for product in catalog.products:
        if product.asin not in catalog.synthetic_instructions:
            continue
        instruction, attributes = catalog.synthetic_instructions[product.asin]
        if not attributes:
            continue  # WebShop asserts this never happens; such a goal could not be scored
        upper, price_text = price_upper_bound(catalog.price(product.asin), f"webshop-goal:{product.asin}")
        names = sorted(product.options)
        for combination in itertools.product(*(product.options[n] for n in names)):
            goal_options = dict(zip(names, combination, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = f" with {option_text}" if option_text else ""
            drafts.append(
                dict(
                    asin=product.asin,
                    instruction_text=f"{instruction}{option_text}{price_text}",
                    attributes=attributes,
                    goal_options=goal_options,
                    price_upper=upper,
                    query=product.query,
                    category=product.category,
                    product_category=product.product_category,
                    name=product.title,
                    kind="synthetic",
                )
            )
    counts = Counter(a for d in drafts for a in d["attributes"])
    return [Goal(**d, weight=sum(1.0 / counts[a] for a in d["attributes"]) / len(d["attributes"])) for d in drafts]


def build_goals(catalog: Catalog, kind: str = "auto") -> list[Goal]:
    """The catalog's goals in WebShop's fixed order (shuffled with seed 233).

    Args:
        kind: "human", "synthetic", or "auto" (human goals when the catalog has human
            instructions, synthetic ones otherwise).
    """
    if kind not in ("auto", "human", "synthetic"):
        raise ValueError(f"goals must be 'auto', 'human' or 'synthetic', got {kind!r}")
    if kind == "auto":
        kind = "human" if catalog.human_instructions else "synthetic"
    goals = human_goals(catalog) if kind == "human" else synthetic_goals(catalog)
    random.Random(SHUFFLE_SEED).shuffle(goals)
    return goals


def split_ranges(num_goals: int) -> dict[str, range]:
    """Goal-index ranges of each split: WebShop's [0, 500), [500, 1500), rest, scaled down
    proportionally when there are fewer goals than WebShop's 12,087; "all" is every goal."""
    n = int(num_goals)
    if n >= WEBSHOP_HUMAN_GOALS:
        test_end, eval_end = TEST_END, EVAL_END
    else:
        test_end = round(n * TEST_END / WEBSHOP_HUMAN_GOALS)
        eval_end = round(n * EVAL_END / WEBSHOP_HUMAN_GOALS)
        if n >= 1:
            test_end = max(test_end, 1)
        if n >= 2:
            eval_end = min(max(eval_end, test_end + 1), n)
        eval_end = max(eval_end, test_end)
    return {
        "test": range(0, test_end),
        "eval": range(test_end, eval_end),
        "train": range(eval_end, n),
        "all": range(0, n),
    }

