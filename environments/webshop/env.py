"""`WebShopEnv`: buy the product an instruction asks for, on WebShop's pages, for WebShop's reward.

The agent reads WebShop's text pages (see `pages.py`) and acts with `search[QUERY]` (on the search
page) or `click[TEXT]` (a button, product link or option value of the current page), one action per
turn inside `<action></action>`. Clicking "Buy Now" ends the episode with WebShop's reward (see
`reward.py`); its parts are in the final step's `info["reward_info"]`. Every step's info holds the
page's `available_actions` (`has_search_bar`, `clickables`), and `admissible_actions` lists them as
actions (`click[...]`, or one example `search[...]` on the search page: any query is valid there).

An action that is well formed but not available on the page (a search without the search bar, a
click on something the page does not show) is an invalid step: nothing changes and the page is
shown again with the reason. (WebShop's own text env lets a search through from any page; here a
search needs the search bar, so that the available actions are exactly the valid ones.)

Options (keyword arguments of `gymnasium.make("agentgym/WebShop-v0", ...)`):
    catalog: None / "builtin" (the embedded SYNTHETIC catalog), or a WebShop data folder, an
        `items_shuffle*.json` or a `documents.jsonl`; attributes=, human= name the instruction files
        when they are not beside it; num_products= keeps the first N products.
    split: "test" (default), "eval", "train" or "all" (see `goals.split_ranges`).
    goals: "auto" (human goals when the catalog has human instructions), "human" or "synthetic".
    index_dir: where the search index is kept (default: a cache folder, see `search.py`).
    type_tagger: "builtin", "spacy" or "spacy:MODEL" (the noun tagger of the type reward, see `reward.py`).
    show_attrs: show the "Attributes" button on item pages (WebShop's `show_attrs`, off by default).
    turn_labels: label every turn, in `hindsight().details["turn_labels"]` (off by default; below).

Turn labels (privileged, for evaluating credit): one dict per turn with `progress`, `delta` (-1 for
progress, +1 for a turn that undid progress, 0 otherwise), `expert_action` (the goal-driven expert's
action in the state the turn was taken in) and `event`, one of (None for the rest, invalid turns too):

| event | delta | the turn |
|---|---|---|
| search_found_target | -1 | searched, and the results (all pages) hold the target product |
| page_toward_target | -1 | turned the results page toward the page that lists the target |
| clicked_target | -1 | opened the target's item page from the results |
| chose_goal_option | -1 | on the target's page, chose a value that matches one more goal option |
| bought_target | -1 | clicked Buy Now on the target (whatever the options) |
| page_away_from_target | +1 | turned the results page away from the page that lists the target |
| unchose_goal_option | +1 | on the target's page, replaced a value that matched a goal option |
| left_target | +1 | left the target's item page, or left results that list it for the search page |
| bought_other | 0 | bought another product |
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from pathlib import Path
from typing import Any

from agentgym_opsd.contract import Hindsight, TextEnv, Transition, hash_state
from agentgym_opsd.parsing import ParsedAction
from environments.webshop.catalog import Product
from environments.webshop.goals import SPLITS, Goal
from environments.webshop.pages import (
    BACK_TO_SEARCH,
    BUY_NOW,
    DONE,
    ITEM,
    NEXT_PAGE,
    PREV_PAGE,
    RESULTS,
    SEARCH,
    SUB,
    SUB_PAGES,
    Session,
    clickables,
    render,
)
from environments.webshop.reward import (
    MATCH_THRESHOLD,
    RewardBreakdown,
    normalize_color,
    option_reward,
    token_set_score,
)
from environments.webshop.search import PRODUCTS_PER_PAGE, clean_query
from environments.webshop.world import WebShopWorld, get_world

__all__ = ["WebShopEnv", "INSTRUCTIONS"]

INSTRUCTIONS = """You are shopping on WebShop, an online store. Buy the product that best matches the instruction shown on every page: the right kind of product, with the requested attributes and options, within the price limit.

Pages are shown as text; [SEP] separates their parts. Take exactly one action per turn, written inside <action></action>:
- search[QUERY]: search the store (only on the search page, the one with the search bar).
- click[TEXT]: click something the current page shows: a product id on a results page, an option value on a product page, or a button: Next >, < Prev, Back to Search, Description, Features, Reviews, Buy Now.
On a product page, click the option values you want (size, color, ...) before Buy Now. Buy Now buys the product and ends the episode; the score from 0 to 1 says how well the purchase matches the instruction.
You may reason first inside <think></think>. Example turn: <think>I need to find the product first.</think><action>search[red cotton t-shirt for women]</action>"""  # noqa: E501 (the prompt the model reads: one paragraph a line)

_ACTION = re.compile(r"^(search|click)\s*\[(.*)\]$", re.IGNORECASE | re.DOTALL)
_PRICE_CLAUSE = re.compile(r",? and price lower than [\d.,]+ dollars\s*$", re.IGNORECASE)
_MAX_OPTION_COMBINATIONS = 4096  # the expert tries every option combination up to this many


def _search_example(instruction: str) -> str:
    """The instruction without its price clause, as a search query (the example search action)."""
    return clean_query(_PRICE_CLAUSE.sub("", instruction)) or "product"


class WebShopEnv(TextEnv):
    """WebShop in text mode: search, browse, choose options, buy (see the module docstring)."""

    instructions = INSTRUCTIONS
    action_tags = ("action",)
    max_turns = 15

    def __init__(
        self,
        catalog: str | Path | None = None,
        *,
        split: str = "test",
        goals: str = "auto",
        attributes: str | Path | None = None,
        human: str | Path | None = None,
        num_products: int | None = None,
        index_dir: str | Path | None = None,
        type_tagger: str = "builtin",
        show_attrs: bool = False,
        turn_labels: bool = False,
        max_turns: int | None = None,
        allow_bare_action: bool | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            max_turns=max_turns, allow_bare_action=allow_bare_action, render_mode=render_mode, turn_labels=turn_labels
        )
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.world: WebShopWorld = get_world(
            catalog,
            attributes=attributes,
            human=human,
            num_products=num_products,
            goals=goals,
            index_dir=index_dir,
            type_tagger=type_tagger,
        )
        self.split = split
        self.goal_indices = self.world.splits[split]
        self.show_attrs = bool(show_attrs)
        self.world.search  # build or open the shared index now, so that errors show at construction
        # Per-episode state.
        self.goal_index = -1
        self.goal: Goal | None = None
        self.session = Session()
        self._plan: tuple[str, str, dict[str, str]] | None = None

    # ------------------------------------------------------------------------------------------
    # Tasks.

    @property
    def num_tasks(self) -> int:
        return len(self.goal_indices)

    def task_index(self, task_id: str) -> int:
        prefix = f"{self.world.catalog.name}/goal-"
        if task_id.startswith(prefix) and task_id[len(prefix) :].isdigit():
            goal_index = int(task_id[len(prefix) :])
            if goal_index in self.goal_indices:
                return self.goal_indices.index(goal_index)
        raise KeyError(f"no task {task_id!r} in the {self.split} split of catalog {self.world.catalog.name}")

    def _load_task(self, index: int, options: dict[str, Any]) -> str:
        self.goal_index = self.goal_indices[index]
        self.goal = self.world.goals[self.goal_index]
        self.task_id = f"{self.world.catalog.name}/goal-{self.goal_index}"
        self.task_type = self.goal.category or "all"
        self.session = Session()
        self._plan = None
        return self._render()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        observation, info = super().reset(seed=seed, options=options)
        info["available_actions"] = self.available_actions()
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = super().step(action)
        info["available_actions"] = self.available_actions()  # after malformed turns too
        return observation, reward, terminated, truncated, info

    # ------------------------------------------------------------------------------------------
    # Pages and actions.

    def _render(self) -> str:
        assert self.goal is not None
        return render(self.session, self.goal.instruction_text, self.world.catalog.by_asin, show_attrs=self.show_attrs)

    def _clickables(self) -> dict[str, tuple[str, str] | None]:
        return clickables(self.session, self.world.catalog.by_asin, show_attrs=self.show_attrs)

    def available_actions(self) -> dict[str, Any]:
        """WebShop's `get_available_actions()`: `{"has_search_bar": bool, "clickables": [...]}`."""
        return {"has_search_bar": self.session.page == SEARCH, "clickables": list(self._clickables())}

    def admissible_actions(self) -> list[str] | None:
        if self.goal is None or self.session.page == DONE:
            return []
        if self.session.page == SEARCH:
            return [f"search[{_search_example(self.goal.instruction_text)}]"]
        return [f"click[{text}]" for text in self._clickables()]

    def _refuse(self, reason: str) -> Transition:
        observation = f"Invalid action: {reason}. Nothing happened.{' [SEP] '}{self._render()}"
        return Transition(observation, 0.0, False, admissible=False)

    def _invalid(self, parsed: ParsedAction) -> str:
        return (f"Invalid action: {parsed.error}. Write one action as <action>search[...]</action> or "
                f"<action>click[...]</action>. [SEP] {self._render()}")

    def _apply(self, action: ParsedAction) -> Transition:
        match = _ACTION.match(action.content or "")
        if match is None:
            return self._refuse("an action is search[QUERY] or click[TEXT]")
        name, argument = match.group(1).lower(), match.group(2).strip().lower()
        if not argument:
            return self._refuse(f"{name}[...] needs text inside the brackets")
        if name == "search":
            if self.session.page != SEARCH:
                return self._refuse("search needs the search bar: click[Back to Search] first")
            self._search(argument)
        else:
            table = self._clickables()
            if argument not in table or argument == "search":
                return self._refuse(f"{argument!r} is not clickable on this page")
            if argument == BUY_NOW.lower():
                return self._buy()
            self._click(argument, table[argument])
        return Transition(self._render(), 0.0, False, admissible=True)

    def _search(self, query: str) -> None:
        s = self.session
        s.keywords = clean_query(query)
        s.results = self.world.search.search(s.keywords)
        s.page, s.page_number, s.asin, s.options, s.sub_page = RESULTS, 1, None, {}, None

    def _click(self, text: str, option: tuple[str, str] | None) -> None:
        s = self.session
        if text == BACK_TO_SEARCH.lower():
            self.session = Session()
        elif s.page == RESULTS and text == NEXT_PAGE.lower():
            s.page_number += 1
        elif s.page == RESULTS and text == PREV_PAGE.lower():
            s.page_number -= 1
        elif s.page == SUB and text == PREV_PAGE.lower():
            s.page, s.sub_page = ITEM, None
        elif s.page == ITEM and text == PREV_PAGE.lower():
            # Back to the results page: like WebShop, this forgets the product and its options.
            s.page, s.asin, s.options = RESULTS, None, {}
        elif s.page == ITEM and option is not None:
            group, value = option
            s.options[group] = value
        elif s.page == ITEM:
            s.page, s.sub_page = SUB, next(name for name in SUB_PAGES if name.lower() == text)
        elif s.page == RESULTS:
            asin = next(a for a in s.page_products() if a.lower() == text)
            s.page, s.asin, s.options = ITEM, asin, {}

    def _buy(self) -> Transition:
        s = self.session
        assert self.goal is not None and s.asin is not None
        s.purchase = self.world.reward(self.goal, s.asin, dict(s.options))
        s.page = DONE
        info = {
            "reward_info": s.purchase.to_dict(),
            "purchased": {"asin": s.asin, "options": dict(s.options)},
        }
        return Transition(self._render(), s.purchase.reward, True, admissible=True, info=info)

    def state_key(self) -> str:
        s = self.session
        return hash_state(
            self.world.catalog.name,
            self.goal_index,
            s.page,
            s.keywords,
            s.page_number,
            s.asin,
            sorted(s.options.items()),
            s.sub_page,
        )

    # ------------------------------------------------------------------------------------------
    # Hindsight.

    def hindsight(self) -> Hindsight:
        goal = self.goal
        if goal is None:
            return Hindsight(False, 0.0, "No episode has started.", {})
        catalog = self.world.catalog
        target = catalog.by_asin[goal.asin]
        purchase = self.session.purchase
        lines = [
            f"Instruction: {goal.instruction_text}",
            f"Target product: {target.asin}: {target.title} ({target.price_tag}; costs "
            f"${catalog.price(target.asin):.2f})",
            f"Target attributes: {', '.join(target.attributes)}",
            "Target options: "
            + ("; ".join(f"{g}: {', '.join(v)}" for g, v in target.options.items()) if target.options else "none"),
            f"Goal attributes: {', '.join(goal.attributes)}",
            f"Goal options: {', '.join(goal.options_list()) if goal.goal_options else 'none'}",
            f"Price upper bound: ${goal.price_upper:.2f}",
        ]
        details: dict[str, Any] = {
            "catalog": catalog.name,
            "synthetic_catalog": catalog.synthetic,
            "goal_index": self.goal_index,
            "goal": goal.to_dict(),
            "target": {
                "asin": target.asin,
                "title": target.title,
                "attributes": list(target.attributes),
                "options": {g: list(v) for g, v in target.options.items()},
                "price": catalog.price(target.asin),
                "price_tag": target.price_tag,
            },
            "purchased": None,
            "reward_info": None,
        }
        if purchase is not None and self.session.asin is not None:
            bought = catalog.by_asin[self.session.asin]
            lines.append(
                f"Purchased: {bought.asin}: {bought.title} with options {dict(self.session.options) or 'none'} "
                f"at ${purchase.price:.2f}"
            )
            lines.append(_explain(purchase, goal))
            details["purchased"] = {"asin": bought.asin, "title": bought.title, "options": dict(self.session.options)}
            details["reward_info"] = purchase.to_dict()
        if self.turn_labels is not None:
            details["turn_labels"] = [dict(label) for label in self.turn_labels]
        score = purchase.reward if purchase is not None else 0.0
        return Hindsight(purchase is not None and purchase.reward == 1.0, float(score), "\n".join(lines), details)

    # ------------------------------------------------------------------------------------------
    # Turn labels (privileged; see the module docstring).

    def _label_context(self) -> tuple[Session, str | None]:
        return dataclasses.replace(self.session, options=dict(self.session.options)), self._expert_next()

    def _label_turn(
        self, parsed: ParsedAction, transition: Transition, before: tuple[Session, str | None]
    ) -> dict[str, Any]:
        was, expert = before
        event = None
        if parsed.ok and transition.admissible:
            verb = _ACTION.match(parsed.content or "")  # a valid turn is search[...] or click[...]
            event = self._turn_event(was, verb is not None and verb.group(1).lower() == "search", transition.terminated)
        delta = _EVENT_DELTA.get(event, 0)
        return {"progress": delta < 0, "delta": delta, "expert_action": expert, "event": event}

    def _turn_event(self, was: Session, searched: bool, bought: bool) -> str | None:
        """What a valid turn did relative to the target product (`was`: the session before it)."""
        assert self.goal is not None
        s, target = self.session, self.goal.asin
        if searched:
            return "search_found_target" if target in s.results else None
        if bought:
            return "bought_target" if s.asin == target else "bought_other"
        at_target_before = was.page in (ITEM, SUB) and was.asin == target
        at_target_after = s.page in (ITEM, SUB) and s.asin == target
        if at_target_after and not at_target_before:
            return "clicked_target"
        if at_target_before and not at_target_after:
            return "left_target"
        if at_target_before:
            matched_before = self._goal_options_matched(was.options)
            matched_after = self._goal_options_matched(s.options)
            if matched_after != matched_before:
                return "chose_goal_option" if matched_after > matched_before else "unchose_goal_option"
            return None
        if was.page == RESULTS and target in was.results:
            if s.page == SEARCH:
                return "left_target"
            if s.page == RESULTS and s.page_number != was.page_number:
                wanted = was.results.index(target) // PRODUCTS_PER_PAGE + 1
                closer = abs(wanted - s.page_number) < abs(wanted - was.page_number)
                return "page_toward_target" if closer else "page_away_from_target"
        return None

    def _goal_options_matched(self, options: dict[str, str]) -> int:
        assert self.goal is not None
        if not self.goal.goal_options:
            return 0
        return option_reward(list(options.values()), self.goal.goal_options)[1]

    # ------------------------------------------------------------------------------------------
    # The expert (privileged: reads the goal and the search engine).

    def expert_action(self) -> str | None:
        """The next action of a shopper who knows the target: search for it with a query that
        finds it (the instruction, else the goal's query and attributes, else the target's title),
        open it, choose the option values that match the goal, buy. When no query finds the target,
        it buys the best-scoring product those queries find."""
        action = self._expert_next()
        return None if action is None else self.format_action(action)

    def _expert_next(self) -> str | None:
        s, goal = self.session, self.goal
        if goal is None or s.page == DONE:
            return None
        query, asin, options = self._expert_plan()
        if s.page == SEARCH:
            return f"search[{query}]"
        if s.page == SUB:
            return f"click[{PREV_PAGE}]"
        if s.page == RESULTS:
            if s.keywords != query or asin not in s.results:
                return f"click[{BACK_TO_SEARCH}]"
            wanted_page = s.results.index(asin) // PRODUCTS_PER_PAGE + 1
            if wanted_page == s.page_number:
                return f"click[{asin}]"
            return f"click[{NEXT_PAGE}]" if wanted_page > s.page_number else f"click[{PREV_PAGE}]"
        # The item page.
        if s.asin != asin:
            return f"click[{PREV_PAGE}]"
        table = self._clickables()
        for group, value in options.items():
            if s.options.get(group) != value and table.get(value.lower()) == (group, value):
                return f"click[{value}]"
        return f"click[{BUY_NOW}]"

    def _expert_plan(self) -> tuple[str, str, dict[str, str]]:
        """(query, ASIN to buy, options to choose), computed once per episode."""
        if self._plan is not None:
            return self._plan
        goal = self.goal
        assert goal is not None
        target = self.world.catalog.by_asin[goal.asin]
        queries = [
            _search_example(goal.instruction_text),
            clean_query(" ".join([goal.query, *goal.attributes])),
            clean_query(target.title),
        ]
        queries = [q for q in dict.fromkeys(queries) if q]
        found = {q: self.world.search.search(q) for q in queries}
        # The first query that shows the target on page 1, else the first that finds it at all.
        on_first_page = [q for q in queries if target.asin in found[q][:PRODUCTS_PER_PAGE]]
        anywhere = [q for q in queries if target.asin in found[q]]
        if on_first_page or anywhere:
            query = (on_first_page or anywhere)[0]
            self._plan = (query, target.asin, self._best_options(target)[0])
            return self._plan
        # The target cannot be found: buy the best product the queries find.
        best: tuple[float, str, str, dict[str, str]] | None = None
        for q in queries:
            for asin in found[q]:
                options, reward = self._best_options(self.world.catalog.by_asin[asin])
                if best is None or reward > best[0]:
                    best = (reward, q, asin, options)
        if best is None:  # nothing found at all: search and buy nothing (the expert gives up)
            self._plan = (queries[0], target.asin, {})
        else:
            self._plan = (best[1], best[2], best[3])
        return self._plan

    def _best_options(self, product: Product) -> tuple[dict[str, str], float]:
        """The option values of `product` that score best for the goal, and that score."""
        goal = self.goal
        assert goal is not None
        if not product.options:
            return {}, self.world.reward(goal, product.asin, {}).reward
        groups = list(product.options)
        if math.prod(max(len(product.options[g]), 1) for g in groups) <= _MAX_OPTION_COMBINATIONS:
            candidates = (
                dict(zip(groups, values, strict=True))
                for values in itertools.product(*(product.options[g] for g in groups))
            )
        else:
            candidates = iter([_greedy_options(product, goal)])
        # Only the option term of the reward depends on the choice: maximise the options matched.
        n_wanted = len(goal.goal_options)
        best_options: dict[str, str] = {}
        best_matched = -1
        for options in candidates:
            matched = option_reward(list(options.values()), goal.goal_options)[1]
            if matched > best_matched:
                best_options, best_matched = options, matched
                if matched == n_wanted:
                    break
        return best_options, self.world.reward(goal, product.asin, best_options).reward


_EVENT_DELTA = {
    "search_found_target": -1,
    "page_toward_target": -1,
    "clicked_target": -1,
    "chose_goal_option": -1,
    "bought_target": -1,
    "page_away_from_target": 1,
    "unchose_goal_option": 1,
    "left_target": 1,
    "bought_other": 0,
}


def _greedy_options(product: Product, goal: Goal) -> dict[str, str]:
    """Per option group, the value that matches the most goal options (for huge option grids)."""
    wanted = list(goal.goal_options.items()) if isinstance(goal.goal_options, dict) else list(goal.goal_options)
    chosen = {}
    for group, values in product.options.items():
        def matches(value: str) -> int:
            v = normalize_color(value)
            return sum(token_set_score(v, normalize_color(g)) > MATCH_THRESHOLD for g in wanted)

        chosen[group] = max(values, key=matches)
    return chosen


def _explain(purchase: RewardBreakdown, goal: Goal) -> str:
    """The reward breakdown as one line of text."""
    parts = [
        f"Reward {purchase.reward:.3f} = r_type {purchase.r_type} x "
        f"(attributes {purchase.num_attr_matches}/{len(goal.attributes)} + "
        f"options {purchase.num_option_matches}/{len(goal.goal_options)} + price {int(bool(purchase.r_price))}) / "
        f"{len(goal.attributes) + len(goal.goal_options) + 1}",
        f"type: query match {purchase.query_match}, category match {purchase.category_match}, "
        f"title score {purchase.title_score:.2f}",
    ]
    if purchase.missed_attributes:
        parts.append(f"missed attributes: {', '.join(purchase.missed_attributes)}")
    if purchase.missed_options:
        parts.append(f"missed options: {', '.join(purchase.missed_options)}")
    if not purchase.r_price:
        parts.append(f"price ${purchase.price:.2f} is above ${goal.price_upper:.2f}")
    return "; ".join(parts)
