"""WebShop's pages in its text observation mode, and the episode state they are rendered from.

A page is the list of its visible texts joined by " [SEP] " (WebShop's `observation_mode="text"`):

- search page: "WebShop", the instruction, the "Search" button (it has the search bar);
- results page: "Back to Search", "Page N (Total results: T)", "< Prev" (after page 1), "Next >",
  then per product its ASIN (a link), title and price; 10 products a page out of the top 50;
- item page: "Back to Search", "< Prev", each option group with its values, the title, price and
  rating, the "Description", "Features" and "Reviews" buttons ("Attributes" when enabled), "Buy Now";
- sub-pages (Description, Features, Reviews, Attributes): "Back to Search", "< Prev" and the content;
- done page (after "Buy Now"): what WebShop's done page holds, without its MTurk code: the thanks, the
  purchase ("Purchased", then "asin", "options" (JSON), "attrs", "category", "query", "product category"
  each followed by its value), the score, and "Reward Details" (WebShop's verbose reward info:
  r_type, r_att, w_att, query_match, category_match, title_score, then r_option/w_option and
  r_price/w_price where the goal has options and a price bound). The goal's own fields, which
  WebShop's page also carries, are left out: they are hindsight, never shown to the agent.

Every page but the done page starts with "Instruction:" and the instruction. Clickables are
lower-cased, as WebShop's `get_available_actions` lists them: buttons, product links (ASINs), then
option values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from environments.webshop.catalog import Product
from environments.webshop.reward import RewardBreakdown
from environments.webshop.search import PRODUCTS_PER_PAGE

__all__ = [
    "Session",
    "SEP",
    "SEARCH",
    "RESULTS",
    "ITEM",
    "SUB",
    "DONE",
    "SUB_PAGES",
    "BUY_NOW",
    "NEXT_PAGE",
    "PREV_PAGE",
    "BACK_TO_SEARCH",
    "render",
    "clickables",
    "done_texts",
    "reward_details",
]

SEP = " [SEP] "
SEARCH, RESULTS, ITEM, SUB, DONE = "search", "results", "item", "sub", "done"

BUY_NOW = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")


@dataclass
class Session:
    """The state of one episode's browser session (all an env instance holds beyond the shared world).

    Attributes:
        page: which page is shown (search, results, item, sub, done).
        keywords: the last search query (cleaned), or None.
        results: the ASINs the last search returned (at most 50).
        page_number: the results page (1-based).
        asin: the product being viewed, or None.
        options: the option values chosen on the item page, {group: value}.
        sub_page: the sub-page shown ("Description", ...), or None.
        purchase: the reward breakdown once "Buy Now" was clicked.
    """

    page: str = SEARCH
    keywords: str | None = None
    results: tuple[str, ...] = ()
    page_number: int = 1
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub_page: str | None = None
    purchase: RewardBreakdown | None = None

    def page_products(self) -> tuple[str, ...]:
        """The ASINs shown on the current results page."""
        start = (self.page_number - 1) * PRODUCTS_PER_PAGE
        return self.results[start : start + PRODUCTS_PER_PAGE]


def _join(texts: list[str]) -> str:
    return SEP.join(t.strip() for t in texts if t and t.strip())


def _header(instruction: str) -> list[str]:
    return ["Instruction:", instruction]


def render(session: Session, instruction: str, products: dict[str, Product], *, show_attrs: bool = False) -> str:
    """The text observation of the session's current page."""
    if session.page == SEARCH:
        return _join(["WebShop", *_header(instruction), "Search"])
    if session.page == RESULTS:
        texts = [*_header(instruction), BACK_TO_SEARCH,
                 f"Page {session.page_number} (Total results: {len(session.results)})"]
        if session.page_number > 1:
            texts.append(PREV_PAGE)
        texts.append(NEXT_PAGE)
        for asin in session.page_products():
            product = products[asin]
            texts += [asin, product.title, product.price_tag]
        return _join(texts)
    if session.page == DONE:
        return _join(done_texts(session, products))
    product = products[session.asin] if session.asin is not None else None
    if product is None:  # unreachable by construction; render the search page rather than fail
        return _join(["WebShop", *_header(instruction), "Search"])
    texts = [*_header(instruction), BACK_TO_SEARCH, PREV_PAGE]
    if session.page == ITEM:
        for group, values in product.options.items():
            texts += [group, *values]
        texts += [product.title, f"Price: {product.price_tag}", f"Rating: {product.rating}"]
        texts += ["Description", "Features", "Reviews"]
        if show_attrs:
            texts.append("Attributes")
        texts.append(BUY_NOW)
        return _join(texts)
    # A sub-page.
    if session.sub_page == "Description":
        texts.append(product.description)
    elif session.sub_page == "Features":
        texts += list(product.bullet_points)
    elif session.sub_page == "Reviews":
        for title, score, body in product.reviews:
            texts += [f'"{title}"', score, body]
    elif session.sub_page == "Attributes":
        texts += [*product.attributes, product.category, product.query, product.product_category]
    return _join(texts)


def reward_details(purchase: RewardBreakdown) -> dict[str, object]:
    """WebShop's verbose reward info (`get_reward(..., verbose=True)`), keys in its order."""
    info: dict[str, object] = {
        "r_type": purchase.r_type,
        "r_att": purchase.r_att,
        "w_att": purchase.w_att,
        "query_match": purchase.query_match,
        "category_match": purchase.category_match,
        "title_score": purchase.title_score,
    }
    if purchase.r_option is not None:
        info.update(r_option=purchase.r_option, w_option=purchase.w_option)
    if purchase.r_price is not None:
        info.update(r_price=purchase.r_price, w_price=purchase.w_price)
    return info


def done_texts(session: Session, products: dict[str, Product]) -> list[str]:
    """The texts of the done page (see the module docstring)."""
    reward = 0.0 if session.purchase is None else session.purchase.reward
    texts = ["Thank you for shopping with us!"]
    product = products.get(session.asin) if session.asin is not None else None
    if product is not None:
        texts += ["Purchased", "asin", product.asin, "options", json.dumps(session.options)]
        texts += ["attrs", str(list(product.attributes)), "category", product.category, "query", product.query]
        texts += ["product category", product.product_category]
    texts += ["Your score (min 0.0, max 1.0)", f"{reward}"]
    if session.purchase is not None:
        texts += ["Reward Details", json.dumps(reward_details(session.purchase))]
    return texts


def clickables(
    session: Session, products: dict[str, Product], *, show_attrs: bool = False
) -> dict[str, tuple[str, str] | None]:
    """The page's clickables: lower-cased text -> the `(group, value)` it chooses (None for buttons
    and links). Order: buttons, product links, option values (a value shared by two groups sets the
    later group, as in WebShop)."""
    out: dict[str, tuple[str, str] | None] = {}
    if session.page == SEARCH:
        out["search"] = None
    elif session.page == RESULTS:
        out[BACK_TO_SEARCH.lower()] = None
        if session.page_number > 1:
            out[PREV_PAGE.lower()] = None
        out[NEXT_PAGE.lower()] = None
        for asin in session.page_products():
            out[asin.lower()] = None
    elif session.page == ITEM and session.asin is not None:
        out[BACK_TO_SEARCH.lower()] = None
        out[PREV_PAGE.lower()] = None
        for name in SUB_PAGES[:3] + (("Attributes",) if show_attrs else ()):
            out[name.lower()] = None
        out[BUY_NOW.lower()] = None
        for group, values in products[session.asin].options.items():
            for value in values:
                out[value.lower()] = (group, value)
    elif session.page == SUB:
        out[BACK_TO_SEARCH.lower()] = None
        out[PREV_PAGE.lower()] = None
    return out
