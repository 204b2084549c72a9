"""WebShop's reward for a purchase, component by component (semantics of WebShop's `get_reward`).

For goal attributes A, goal options O and a purchase of product p with chosen options o at price c:

    R = r_type * (|A matched| + |O matched| + 1[c <= price_upper]) / (|A| + |O| + 1)

- r_type (product type), from three signals: the query the two products were scraped with is equal;
  their category paths share at least 2 levels; title_score = |nouns(p.title) ∩ nouns(goal.name)| /
  |nouns(goal.name)| (0.2 when the goal name has no noun). r_type = 1 when any signal holds
  (title_score > 0.2), else 0.5; then 0.1 when title_score < 0.1, and 0 when title_score == 0.
- attributes: a goal attribute matches when some product attribute has fuzzy token-set similarity
  > 85 with it, or it occurs (as text) in the product's title, features or description (lower case).
- options: each goal option is colour-normalised (the first WebShop colour word contained in it),
  and matches when some chosen option, normalised the same way, has token-set similarity > 85.
  For synthetic goals WebShop compares the `(group, value)` pairs of the goal: a pair normalises to
  a colour only when its value *is* one, and otherwise is compared as the text of the pair
  ("('size', 'x-large')" -> "size x large"); this module keeps that behaviour.
- price: 1 when the product's price is at most the goal's bound.

Similarity is thefuzz's `token_set_ratio` (on rapidfuzz): text is reduced to ASCII by deleting
code points 128-255, lower-cased, non-alphanumerics become spaces; the score is rounded to an int.

Nouns: WebShop tags titles with spaCy's `en_core_web_sm` (tokens tagged NOUN or PROPN). That model
is not a PyPI package, so the default tagger here is a deterministic stand-in (`builtin_nouns`):
spaCy's own rule-based English tokenizer (no model; spaCy comes with TextWorld), then every word
token except English function words, numbers and measures ("3d", "50ml"), past participles (-ed and
irregular ones: "made", "built", ...), the word after a modal ("can Hold"), contracted verb forms
("incl'd"), a title's first word when it is in lower case (the model reads such a title as an
imperative: "starfrit Kitchen Scale"), the dimension sign "x" ("50 x 62"), and words with adjective
suffixes (-able, -ible, -ful, -ous, -ive, -less, -ly; not -ish, which ends nouns in titles: "Finish",
"Polish"); "|", "%" and "°" count, as the model tags them NOUN, and so do counts and zoom factors
fused with a number ("4pcs", "10x").

It still differs from the model on some words, because the model reads context and letter case:
"Natural" is a PROPN in one title and an ADJ in another, "Tie the knot" is a verb, and in title case
it tags most capitalised words, "Adjustable", "Heated" and "Stainless" included, PROPN, but not all
("Padded", "Compatible With"). So title_score may differ from WebShop's for a product other than the
target, and since r_type steps at title_score 0.1 and 0.2, one noun more or less in a goal name of
10 or 20 nouns moves the reward of many pairs at once. Capitalised -ed/-able/-less words stay out
of the nouns although the model mostly reads them as nouns: on the real sample that brought the two
taggers closer word by word but moved the reward of more pairs (two goal names sit at a threshold).
The rules were chosen while reading the disagreements on that one sample; no other set of real
titles was at hand to check them on. How often the total reward equals the model's, and the command
that measures it: docs/webshop-type-reward.md.

`noun_tagger("spacy")` uses spaCy's model where it is installed (`"spacy:NAME_OR_PATH"` names the
model package or folder).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

from agentgym_opsd.contract import EnvUnavailable
from environments.webshop.catalog import Product
from environments.webshop.goals import Goal

__all__ = [
    "COLOR_WORDS",
    "RewardBreakdown",
    "attribute_reward",
    "builtin_nouns",
    "fuzz_text",
    "noun_tagger",
    "normalize_color",
    "option_reward",
    "price_reward",
    "token_set_score",
    "type_reward",
    "webshop_reward",
]

MATCH_THRESHOLD = 85  # a fuzzy match needs a score above this

# WebShop's colour vocabulary, in its order (normalisation takes the first word contained).
COLOR_WORDS: tuple[str, ...] = tuple(
    """alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown
    burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac
    copper coral cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite
    grape graphite grass gray green grey heather indigo ivory ivy khaki lavender lemon leopard light
    lilac lime magenta maroon mauve merlot midnight mint mocha multicolor mushroom mustard natural
    navy nude olive orange peach pewter pink plum purple rainbow red rose royal rust sand sapphire
    seashell silver skull slate steel stone stonewash sunflower tan taupe teal tiger turquoise
    violet walnut wheat white wine yellow""".split()
)

_HIGH_LATIN = {code: None for code in range(128, 256)}


def fuzz_text(value: Any) -> str:
    """thefuzz's `full_process(value, force_ascii=True)`: str(), drop code points 128-255, then
    lower-case and turn non-alphanumerics into spaces."""
    return default_process(str(value).translate(_HIGH_LATIN))


def token_set_score(a: Any, b: Any) -> int:
    """thefuzz's `fuzz.token_set_ratio(a, b)`: 0-100, rounded to an int."""
    return int(round(fuzz.token_set_ratio(fuzz_text(a), fuzz_text(b))))


def normalize_color(option: str | tuple[str, str]) -> str | tuple[str, str]:
    """The first WebShop colour word contained in `option`, or `option` unchanged.

    For a string, "contained" is a substring test ("navy blue" -> "blue", "washed" -> "ash"); for a
    `(group, value)` pair it is membership, so only a value that is exactly a colour word normalises.
    """
    for color in COLOR_WORDS:
        if color in option:
            return color
    return option


# ------------------------------------------------------------------------------------------------
# Nouns of a product title (for the type reward).

_FUNCTION_WORDS = frozenset(
    """a an the this that these those each every either neither both all any some no another such
    i me my mine we us our ours you your yours he him his she her hers it its they them their theirs
    who whom whose which what whatever whichever
    of in on at by for with without within into onto upon from to toward towards over under above
    below between among through throughout during before after behind beside besides beyond near
    around about across along against off out up down via per than like unlike inside outside
    and or nor but yet so plus versus vs
    is are was were be been being am do does did done have has had having will would shall should
    can could may might must
    not very too also just only more most less least much many few several own same other
    if then when while where how why because as until unless whether though although
    one two three four five six seven eight nine ten
    s t""".split()
)
_WORD = re.compile(r"[A-Za-z0-9]+")
_POSSESSIVE = re.compile(r"['\u2019]s\b")
_PAST_PARTICIPLE = re.compile(r"[a-z]{3,}ed$")
_NOUNS_IN_ED = frozenset("bed red seed speed feed shed need weed tweed breed steed sled led".split())
# Irregular past participles: verbs like the -ed ones ("Made in Korea", "Made with Biotin").
_IRREGULAR_PARTICIPLES = frozenset(
    "made built sold grown known shown worn sewn woven given taken written broken frozen chosen proven".split()
)
# After a modal the model reads a verb ("Connections can Support ...").
_MODALS = frozenset("can could will would may might must shall should".split())
# -ish is left out: in titles it mostly ends nouns ("Finish", "Polish", "Goldfish"), which the model tags as such.
_ADJECTIVE_SUFFIX = re.compile(r"(able|ible|ful|ous|ive|less|ly)$")
_SYMBOL_NOUNS = frozenset({"|", "%", "°"})  # the model tags these NOUN in titles
# A number fused with a count or a zoom factor ("2pcs", "12x") is NN to the model; other measures
# ("50ml", "42W", "3D", "700MHz") are NUM or ADJ as often as not, and stay out.
_COUNT_OR_FACTOR = re.compile(r"\d+(x|pcs)")


@lru_cache(maxsize=1)
def _tokenizer() -> Callable[[str], list[tuple[str, bool]]] | None:
    """spaCy's rule-based English tokenizer (`spacy.blank("en")`, no model): `text -> [(token as
    written, is a number or punctuation)]`, or None without spaCy."""
    try:
        import spacy  # noqa: PLC0415 (heavy; TextWorld depends on it)
    except ImportError:
        return None
    tokenizer = spacy.blank("en").tokenizer

    def tokens(text: str) -> list[tuple[str, bool]]:
        return [(t.text, t.is_punct or t.like_num) for t in tokenizer(text)]

    return tokens


def _is_noun(words: Sequence[tuple[str, bool]], i: int, spacy_tokens: bool) -> bool:
    """Whether token `i` of a title (as written) is a noun to the rules of the module docstring."""
    written, number_or_punct = words[i]
    word = written.lower()
    if word in _SYMBOL_NOUNS:
        return True
    if number_or_punct:
        return False
    if word[:1].isdigit() or not any(c.isalpha() for c in word) or word == "'s":
        # numbers and measures ("3d", "42w", "50ml") are NUM to the model; counts ("2pcs", "12x") are NN
        return bool(_COUNT_OR_FACTOR.fullmatch(word))
    if word in _FUNCTION_WORDS and not (spacy_tokens and word in ("s", "t")):
        return False  # "s" and "t" stand for the pieces of "women's", "don't" that only the regex tokenizer makes
    if word == "x":
        return False  # the dimension sign of "50 x 62", "42W x 32L" (SYM)
    if i == 0 and written.isalpha() and written.islower():
        return False  # a title that starts in lower case reads as an imperative: its first word is a verb
    if "'" in word[1:] or "\u2019" in word[1:]:
        return False  # a contracted verb form ("incl'd")
    if word in _IRREGULAR_PARTICIPLES or (i > 0 and words[i - 1][0].lower() in _MODALS):
        return False
    if _PAST_PARTICIPLE.search(word) and word not in _NOUNS_IN_ED:
        return False
    return not (len(word) > 5 and _ADJECTIVE_SUFFIX.search(word))


@lru_cache(maxsize=1 << 16)
def builtin_nouns(text: str) -> tuple[str, ...]:
    """The built-in stand-in for spaCy's NOUN/PROPN tokens of a title, lower case, in order
    (duplicates kept, as WebShop counts them); see the module docstring for the rules."""
    tokens = _tokenizer()
    if tokens is None:  # no spaCy: word tokens of the regex tokenizer
        words = [(w, w.isdigit()) for w in _WORD.findall(_POSSESSIVE.sub(" ", text))]
    else:
        words = tokens(text)
    spacy_tokens = tokens is not None
    return tuple(w.lower() for i, (w, _) in enumerate(words) if _is_noun(words, i, spacy_tokens))


def noun_tagger(name: str = "builtin") -> Callable[[str], Sequence[str]]:
    """The noun tagger of the type reward: "builtin" (the default) or "spacy" (WebShop's own,
    `en_core_web_sm`, when spaCy and that model are installed; "spacy:NAME_OR_PATH" loads another
    model package or folder)."""
    if name == "builtin":
        return builtin_nouns
    kind, _, model = name.partition(":")
    if kind != "spacy":
        raise ValueError(f"type_tagger must be 'builtin', 'spacy' or 'spacy:MODEL', got {name!r}")
    model = model or "en_core_web_sm"
    try:
        import spacy  # noqa: PLC0415 (optional, heavy)

        nlp = spacy.load(model)
    except (ImportError, OSError) as e:
        raise EnvUnavailable(
            f"type_tagger={name!r} needs spaCy with the {model} model ({e}); install both "
            "(`pip install spacy` and the model package), or use type_tagger='builtin'"
        ) from None

    @lru_cache(maxsize=1 << 16)
    def spacy_nouns(text: str) -> tuple[str, ...]:
        return tuple(t.text.lower() for t in nlp(text) if t.pos_ in ("NOUN", "PROPN"))

    return spacy_nouns


# ------------------------------------------------------------------------------------------------
# The components.


def type_reward(purchased: Product, goal: Goal,
                nouns: Callable[[str], Sequence[str]] = builtin_nouns) -> dict[str, Any]:
    """r_type and its signals: `{"r_type", "query_match", "category_match", "title_score"}`."""
    query_match = purchased.query == goal.query
    purchased_levels = {level.strip() for level in purchased.product_category.split("›")}
    goal_levels = {level.strip() for level in goal.product_category.split("›")}
    category_match = len(purchased_levels & goal_levels) >= 2

    purchased_nouns = list(nouns(purchased.title))
    desired_nouns = list(nouns(goal.name))
    if not desired_nouns:
        title_score = 0.2
    else:
        title_score = len(set(purchased_nouns) & set(desired_nouns)) / len(desired_nouns)

    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def attribute_reward(purchased: Product, goal: Goal) -> tuple[float, int, list[str]]:
    """`(r_att, number of goal attributes matched, the matched ones)`."""
    title = purchased.title.lower()
    features = " ".join(purchased.bullet_points).lower()
    description = purchased.description.lower()
    matched = []
    for g_attr in goal.attributes:
        if any(token_set_score(p_attr, g_attr) > MATCH_THRESHOLD for p_attr in purchased.attributes):
            matched.append(g_attr)
        elif g_attr in title or g_attr in features or g_attr in description:
            matched.append(g_attr)
    return len(matched) / len(goal.attributes), len(matched), matched


def _goal_option_items(goal_options: Mapping[str, str] | Sequence[str]) -> list[Any]:
    # WebShop passes a dict's items(), i.e. (group, value) pairs, and a list as it is.
    if isinstance(goal_options, Mapping):
        return list(goal_options.items())
    return list(goal_options)


def option_reward(chosen_options: Sequence[str],
                  goal_options: Mapping[str, str] | Sequence[str]) -> tuple[float | None, int, list[Any]]:
    """`(r_option or None without goal options, number matched, the matched goal options)`.

    Args:
        chosen_options: the option values chosen on the item page.
        goal_options: the goal's options (`{group: value}` or a list of values).
    """
    chosen = [normalize_color(o) for o in chosen_options]
    wanted = _goal_option_items(goal_options)
    matched = []
    for g_option in wanted:
        g_norm = normalize_color(g_option)
        if any(token_set_score(p_option, g_norm) > MATCH_THRESHOLD for p_option in chosen):
            matched.append(g_option)
    r_option = len(matched) / len(wanted) if wanted else None
    return r_option, len(matched), matched


def price_reward(price: float, goal: Goal) -> bool | None:
    """1 when the price is within the goal's bound (None when the goal has no positive bound)."""
    return (price <= goal.price_upper) if goal.price_upper > 0 else None


@dataclass(frozen=True)
class RewardBreakdown:
    """The reward of a purchase and its parts (WebShop's verbose `get_reward` info, and more).

    Attributes:
        reward: the total, in [0, 1].
        r_type, r_att, r_option, r_price: the components (r_option None without goal options,
            r_price None without a price bound).
        w_att, w_option, w_price: the weights of the components in the total (before r_type).
        query_match, category_match, title_score: the type signals.
        num_attr_matches, num_option_matches: counts.
        matched_attributes, missed_attributes, matched_options, missed_options: which ones.
        price: the price paid.
    """

    reward: float
    r_type: float
    r_att: float
    r_option: float | None
    r_price: bool | None
    w_att: float
    w_option: float
    w_price: float
    query_match: bool
    category_match: bool
    title_score: float
    num_attr_matches: int
    num_option_matches: int
    matched_attributes: list[str]
    missed_attributes: list[str]
    matched_options: list[str]
    missed_options: list[str]
    price: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _option_label(option: Any) -> str:
    return f"{option[0]}: {option[1]}" if isinstance(option, tuple) else str(option)


def webshop_reward(
    purchased: Product,
    goal: Goal,
    price: float,
    chosen_options: Mapping[str, str],
    nouns: Callable[[str], Sequence[str]] = builtin_nouns,
) -> RewardBreakdown:
    """The reward of buying `purchased` at `price` with `chosen_options` ({group: value}) for `goal`."""
    type_info = type_reward(purchased, goal, nouns)
    r_price = price_reward(price, goal)
    r_att, num_attr, matched_attrs = attribute_reward(purchased, goal)
    r_option, num_option, matched_options = option_reward(list(chosen_options.values()), goal.goal_options)

    n_attr, n_option = len(goal.attributes), len(goal.goal_options)
    denominator = n_attr + n_option + 1
    reward = (num_attr + num_option + (1 if r_price else 0)) / denominator * type_info["r_type"]

    wanted_options = _goal_option_items(goal.goal_options)
    return RewardBreakdown(
        reward=reward,
        r_type=type_info["r_type"],
        r_att=r_att,
        r_option=r_option,
        r_price=r_price,
        w_att=n_attr / denominator,
        w_option=n_option / denominator,
        w_price=1 / denominator,
        query_match=type_info["query_match"],
        category_match=type_info["category_match"],
        title_score=type_info["title_score"],
        num_attr_matches=num_attr,
        num_option_matches=num_option,
        matched_attributes=list(matched_attrs),
        missed_attributes=[a for a in goal.attributes if a not in matched_attrs],
        matched_options=[_option_label(o) for o in matched_options],
        missed_options=[_option_label(o) for o in wanted_options if o not in matched_options],
        price=float(price),
    )
