"""The embedded default: a SYNTHETIC world of fictional entities, its passage corpus and its questions.

Nothing here is real. A seeded generator invents countries, cities, rivers, people, works and
companies with made-up names, writes one encyclopedia-style passage per entity (each says that the
entity is fictional), and asks questions about them:

- single-hop: the answer is in one passage ("What is the capital of Velmora?");
- two-hop: the answer needs a second search for an entity named in the first passage ("In which city
  was the author of The Amber Lantern born?": the work's passage names the author, the author's
  passage names the city). The passages are written so that no single passage answers a two-hop
  question.

Every question records its supporting passages and sentences (hindsight). The corpus is small
(about 130 passages, 470 questions), builds a Lucene index in a second, and lets the whole stack
(index, server, env, agents, trainer) run with no downloads. Ids start with `synthetic-`.

    corpus = synthetic_corpus()                     # [{"id", "contents"}]
    questions = synthetic_questions("test")         # [QAExample], split "train" or "test"
    index_dir = ensure_synthetic_index()            # built once, cached under data_home()
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from environments.searchqa.data import QAExample, data_home
from retrieval_index.lucene import BM25Searcher, build_index, read_index_info
from retrieval_index.process import RetrievalServer

__all__ = [
    "SYNTHETIC_VERSION",
    "SyntheticWorld",
    "synthetic_world",
    "synthetic_corpus",
    "synthetic_questions",
    "ensure_synthetic_index",
    "serve_synthetic",
]

SYNTHETIC_VERSION = 1
SEED = 20240611
SPLITS = ("train", "test")

_SYLLABLES = (
    "ka lo mer vin tor sel qua dri bel nor fen zar ul os rin tam vex lum gor pel sar thi wen yor "
    "bri cal dun eth fal gra hes ith jor kel mab nev oth pra quil rho sten tev ush vor wyn xan yel zed"
).split()
_OCCUPATIONS = {  # occupation -> (kind of work, past participle, the creator as questions name them)
    "novelist": ("novel", "written", "writer"),
    "composer": ("symphony", "composed", "composer"),
    "painter": ("painting", "painted", "painter"),
    "poet": ("poetry collection", "written", "poet"),
    "architect": ("building", "designed", "architect"),
}
_ADJECTIVES = ("Amber Glass Silent Hollow Crimson Distant Iron Velvet Salt Winter Golden Broken Hidden Paper Quiet "
               "Copper Ashen").split()
_NOUNS = ("Lantern Orchard Tide Harbor Garden Bell Mirror Bridge Compass Feather Tower Meadow Ember Candle Sparrow "
          "Anchor Willow").split()
_PRODUCTS = ("clockwork instruments", "glass lenses", "river barges", "woollen textiles", "printing presses",
             "telegraph cables", "porcelain", "sailcloth")
_SEA_WORDS = ("Sea of", "Gulf of", "Bay of")


@dataclass
class Entity:
    kind: str
    name: str
    facts: dict[str, object] = field(default_factory=dict)

    @property
    def doc_id(self) -> str:
        return f"synthetic-{self.kind}-{self.name.lower().replace(' ', '-')}"


@dataclass
class SyntheticWorld:
    """The generated entities and, per entity, its passage sentences (title -> sentences)."""

    entities: dict[str, Entity]
    sentences: dict[str, list[str]]
    questions: list[QAExample]


class _Names:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: tuple[int, int] = (2, 3)) -> str:
        while True:
            n = self.rng.randint(*syllables)
            w = "".join(self.rng.choice(_SYLLABLES) for _ in range(n)).capitalize()
            if w.lower() not in self.used and len(w) >= 5:
                self.used.add(w.lower())
                return w


def _generate(seed: int = SEED) -> SyntheticWorld:
    rng = random.Random(seed)
    names = _Names(rng)
    ents: dict[str, Entity] = {}

    def add(e: Entity) -> Entity:
        ents[e.name] = e
        return e

    seas = [add(Entity("sea", f"{rng.choice(_SEA_WORDS)} {names.word()}")) for _ in range(4)]
    rivers = [
        add(Entity("river", f"{names.word()} River",
                   {"length_km": rng.randrange(80, 2400, 10), "sea": rng.choice(seas).name}))
        for _ in range(10)
    ]
    countries = [add(Entity("country", names.word(), {"founded": rng.randint(900, 1850),
                                                      "currency": names.word((1, 2)).lower()})) for _ in range(10)]
    cities = []
    for country in countries:
        for i in range(3):
            city = add(Entity("city", names.word(), {
                "country": country.name,
                "river": rng.choice(rivers).name,
                "founded": rng.randint(600, 1900),
                "population": rng.randrange(8_000, 2_000_000, 1000),
            }))  # fmt: skip
            cities.append(city)
            if i == 0:
                country.facts["capital"] = city.name
    people = []
    for _ in range(40):
        occupation = rng.choice(sorted(_OCCUPATIONS))
        person = add(Entity("person", f"{names.word((1, 2))} {names.word()}", {
            "born": rng.randint(1700, 1960),
            "birthplace": rng.choice(cities).name,
            "occupation": occupation,
        }))  # fmt: skip
        people.append(person)
    works = []
    used_titles: set[str] = set()
    creators = [p for p in people]
    rng.shuffle(creators)
    for person in creators[:30]:
        while True:
            adjective, noun = rng.choice(_ADJECTIVES), rng.choice(_NOUNS)
            title = f"The {adjective} {noun}" if rng.random() < 0.5 else f"The {noun} of {names.word()}"
            if title not in used_titles:
                used_titles.add(title)
                break
        kind = _OCCUPATIONS[str(person.facts["occupation"])][0]
        works.append(add(Entity("work", title, {
            "creator": person.name, "year": int(person.facts["born"]) + rng.randint(22, 60), "kind": kind})))
    companies = []
    for _ in range(12):
        founder = rng.choice(people)
        companies.append(add(Entity("company", f"{names.word()} {rng.choice(['Works', 'Company', 'Foundry', 'Guild'])}",
                                    {
            "founder": founder.name,
            "headquarters": rng.choice(cities).name,
            "founded": int(founder.facts["born"]) + rng.randint(20, 50),
            "product": rng.choice(_PRODUCTS),
        })))  # fmt: skip

    # Passages: sentence lists per title. No passage mentions facts that would short-cut a two-hop question.
    sentences: dict[str, list[str]] = {}
    for s in seas:
        sentences[s.name] = [
            f"The {s.name} is a fictional body of water in a synthetic world made for testing search agents."]
    for r in rivers:
        sentences[r.name] = [
            f"The {r.name} is a fictional river.",
            f"It is {r.facts['length_km']} kilometres long.",
            f"The {r.name} flows into the {r.facts['sea']}.",
        ]
    for c in countries:
        sentences[c.name] = [
            f"{c.name} is a fictional country.",
            f"Its capital is {c.facts['capital']}.",
            f"{c.name} was founded in {c.facts['founded']}.",
            f"The currency of {c.name} is the {c.facts['currency']}.",
        ]
    for c in cities:
        sentences[c.name] = [
            f"{c.name} is a fictional city in {c.facts['country']}.",
            f"The {c.facts['river']} flows through {c.name}.",
            f"{c.name} was founded in {c.facts['founded']} and has {c.facts['population']:,} inhabitants.",
        ]
    for p in people:
        surname = p.name.split()[-1]
        sentences[p.name] = [
            f"{p.name} is a fictional {p.facts['occupation']}.",
            f"{surname} was born in {p.facts['born']} in {p.facts['birthplace']}.",
        ]
    for w in works:
        verb = _OCCUPATIONS[next(k for k, v in _OCCUPATIONS.items() if v[0] == w.facts["kind"])][1]
        sentences[w.name] = [
            f"{w.name} is a fictional {w.facts['kind']}.",
            f"It was {verb} by {w.facts['creator']} in {w.facts['year']}.",
        ]
    for co in companies:
        sentences[co.name] = [
            f"{co.name} is a fictional company that makes {co.facts['product']}.",
            f"It was founded by {co.facts['founder']} in {co.facts['founded']}.",
            f"Its headquarters are in {co.facts['headquarters']}.",
        ]

    questions = _questions(ents, sentences)
    return SyntheticWorld(ents, sentences, questions)


def _sentence(sentences: dict[str, list[str]], title: str, needle: str) -> dict[str, str]:
    for s in sentences[title]:
        if needle in s:
            return {"title": title, "sentence": s}
    raise AssertionError(f"no sentence of {title!r} mentions {needle!r}")  # a generator bug


def _questions(ents: dict[str, Entity], sentences: dict[str, list[str]]) -> list[QAExample]:
    out: list[QAExample] = []

    def ask(kind: str, subject: str, question: str, answer: object, support: list[tuple[str, object]]) -> None:
        digest = hashlib.blake2b(question.encode(), digest_size=5).hexdigest()
        facts = [_sentence(sentences, title, str(needle)) for title, needle in support]
        out.append(QAExample(f"synthetic-{digest}", question, [str(answer)], "synthetic",
                             question_type=kind, supporting=facts,
                             source=f"synthetic v{SYNTHETIC_VERSION}"))  # fmt: skip

    by_kind: dict[str, list[Entity]] = {}
    for e in ents.values():
        by_kind.setdefault(e.kind, []).append(e)
    one, two = "single-hop", "two-hop"
    for c in by_kind["country"]:
        f = c.facts
        ask(one, c.name, f"What is the capital of {c.name}?", f["capital"], [(c.name, f["capital"])])
        ask(one, c.name, f"In what year was {c.name} founded?", f["founded"], [(c.name, f["founded"])])
        ask(one, c.name, f"What is the currency of {c.name}?", f["currency"], [(c.name, f["currency"])])
    for c in by_kind["city"]:
        f = c.facts
        country = ents[str(f["country"])]
        river = ents[str(f["river"])]
        ask(one, c.name, f"In which country is the city of {c.name}?", f["country"], [(c.name, f["country"])])
        ask(one, c.name, f"Which river flows through {c.name}?", f["river"], [(c.name, f["river"])])
        if country.facts["capital"] != c.name:  # the capital is named in its country's passage: one hop
            ask(two, c.name, f"What is the currency of the country in which {c.name} lies?", country.facts["currency"],
                [(c.name, country.name), (country.name, country.facts["currency"])])  # fmt: skip
        ask(two, c.name, f"Into which body of water does the river that flows through {c.name} empty?",
            river.facts["sea"], [(c.name, river.name), (river.name, river.facts["sea"])])  # fmt: skip
    for r in by_kind["river"]:
        ask(one, r.name, f"Into which body of water does the {r.name} flow?", r.facts["sea"],
            [(r.name, r.facts["sea"])])
    for p in by_kind["person"]:
        f = p.facts
        city = ents[str(f["birthplace"])]
        ask(one, p.name, f"In what year was {p.name} born?", f["born"], [(p.name, f["born"])])
        ask(one, p.name, f"In which city was {p.name} born?", f["birthplace"], [(p.name, f["birthplace"])])
        ask(one, p.name, f"What was the profession of {p.name}?", f["occupation"], [(p.name, f["occupation"])])
        ask(two, p.name, f"In which country was {p.name} born?", city.facts["country"],
            [(p.name, city.name), (city.name, city.facts["country"])])  # fmt: skip
    for w in by_kind["work"]:
        f = w.facts
        creator = ents[str(f["creator"])]
        noun = _OCCUPATIONS[str(creator.facts["occupation"])][2]
        ask(one, w.name, f"Who created {w.name}?", f["creator"], [(w.name, f["creator"])])
        ask(one, w.name, f"In what year was {w.name} completed?", f["year"], [(w.name, f["year"])])
        ask(two, w.name, f"In which city was the {noun} of {w.name} born?", creator.facts["birthplace"],
            [(w.name, creator.name), (creator.name, creator.facts["birthplace"])])  # fmt: skip
        ask(two, w.name, f"In what year was the {noun} of {w.name} born?", creator.facts["born"],
            [(w.name, creator.name), (creator.name, creator.facts["born"])])  # fmt: skip
    for co in by_kind["company"]:
        f = co.facts
        founder = ents[str(f["founder"])]
        hq = ents[str(f["headquarters"])]
        ask(one, co.name, f"Who founded {co.name}?", f["founder"], [(co.name, f["founder"])])
        ask(one, co.name, f"What does {co.name} make?", f["product"], [(co.name, f["product"])])
        ask(two, co.name, f"What was the profession of the founder of {co.name}?", founder.facts["occupation"],
            [(co.name, founder.name), (founder.name, founder.facts["occupation"])])  # fmt: skip
        ask(two, co.name, f"In which country does {co.name} have its headquarters?", hq.facts["country"],
            [(co.name, hq.name), (hq.name, hq.facts["country"])])  # fmt: skip
    return out


@lru_cache(maxsize=1)
def synthetic_world() -> SyntheticWorld:
    """The generated world (deterministic: the same on every machine)."""
    return _generate(SEED)


def synthetic_corpus() -> list[dict[str, str]]:
    """The passages, `{"id", "contents": "\\"Title\\"\\ntext"}`, one per entity."""
    world = synthetic_world()
    return [
        {"id": world.entities[title].doc_id, "contents": f'"{title}"\n' + " ".join(sents)}
        for title, sents in world.sentences.items()
    ]


def _split_of(example: QAExample) -> str:
    # A fixed fifth of the questions is the test split (by the id's hash, stable everywhere).
    return "test" if int(example.id.rsplit("-", 1)[1], 16) % 5 == 0 else "train"


def synthetic_questions(split: str = "test") -> list[QAExample]:
    """The questions of one split (`train`, `test`, or `all`), in a fixed order."""
    if split not in (*SPLITS, "all"):
        raise ValueError(f"synthetic split {split!r}: choose from {SPLITS + ('all',)}")
    questions = synthetic_world().questions
    return [q for q in questions if split == "all" or _split_of(q) == split]


def corpus_fingerprint() -> str:
    data = json.dumps(synthetic_corpus(), sort_keys=True).encode()
    return hashlib.blake2b(data, digest_size=6).hexdigest()


def ensure_synthetic_index(root: str | Path | None = None, *, progress: bool = False) -> Path:
    """The Lucene index of the synthetic corpus, built on first use and cached.

    Cached at `root` (default `data_home()/searchqa/synthetic`) under a name that changes whenever
    the corpus does, so a stale index is never served.
    """
    base = Path(root) if root is not None else data_home() / "searchqa" / "synthetic"
    index_dir = base / f"index-v{SYNTHETIC_VERSION}-{corpus_fingerprint()}"
    info = read_index_info(index_dir)
    if info is not None and info.get("num_docs") == len(synthetic_corpus()):
        return index_dir
    build_index(synthetic_corpus(), index_dir, progress=progress, overwrite=True)
    BM25Searcher(index_dir).close()  # opens: the index is usable
    return index_dir


def serve_synthetic(root: str | Path | None = None, *, port: int | None = None):
    """Build (or reuse) the synthetic index and serve it from a child process on loopback.

    Returns the started `RetrievalServer` (`.url`, `.stop()`; also a context manager), e.g. for
    `make demo`: `with serve_synthetic() as server: gym.make("agentgym/SearchQA-Synthetic-v0", server_url=server.url)`.
    (Without `server_url` the env starts such a server itself, once per process.)
    """
    return RetrievalServer(ensure_synthetic_index(root), port=port).start()
