"""One ranking for every registry: text relevance (BM25F) of a need, then tool-making signals.

Relevance compares the need with a crate's name, keywords, categories and description after the
same normalisation on both sides: lower case, '-' and '_' split words, simple plural and suffix
folding (parse/parser/parsing meet), stopwords dropped. Signals then nudge the order towards
crates a tool can start from: ships a binary, permissive licence, has a repository, popular, not
yanked, not a proc-macro. Every candidate carries a short `why`.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from functools import lru_cache

from flakebot.crates import Candidate, CrateInfo
from flakebot.errors import SearchError

STOPWORDS = frozenset(
    """a an and any are as at be by can do does for from get gets give i in into is it its me my need needs of on or
    our please rust should so some something that the then this to tool tools crate crates want wants we which with
    would you your using use""".split()
)
# Field weights: a word in the name says more about a crate than one in its description.
WEIGHTS = {"name": 3.0, "keywords": 2.0, "categories": 0.5, "description": 1.0}
K1 = 1.2
B = 0.75
PERMISSIVE = frozenset(
    "mit apache-2.0 bsd-2-clause bsd-3-clause 0bsd isc zlib unlicense cc0-1.0 bsl-1.0 mit-0 wtfpl".split()
)
_WORD = re.compile(r"[a-z0-9]+")
_LICENSE_ID = re.compile(r"[A-Za-z0-9.+-]+")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Fold plurals and a few suffixes so 'arguments'/'argument' and 'parser'/'parse' match."""
    if len(word) <= 3 or word.isdigit():
        return word
    for suffix, repl in (("sses", "ss"), ("ies", "y"), ("xes", "x"), ("ches", "ch"), ("shes", "sh")):
        if word.endswith(suffix):
            word = word[: -len(suffix)] + repl
            break
    else:
        if word.endswith("s") and not word.endswith(("ss", "us", "is")):
            word = word[:-1]
    for suffix in ("ing", "er", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            return word[: -len(suffix)]
    return word[:-1] if word.endswith("e") and len(word) > 4 else word


def words(text: str) -> list[str]:
    """Lower-case words of `text`; '-' and '_' separate words like spaces do."""
    return _WORD.findall(text.lower())


def terms(text: str) -> list[str]:
    """The index terms of `text`: words minus stopwords, stemmed."""
    return [stem(w) for w in words(text) if w not in STOPWORDS]


def stop_words_removed(query: str) -> list[str]:
    """The words of a query that carry meaning, as typed (for registries with their own search)."""
    return [w for w in words(query) if w not in STOPWORDS]


def query_terms(query: str) -> list[str]:
    """The distinct terms of a search query; SearchError when there are none."""
    if not query or not query.strip():
        raise SearchError(
            "the search query is empty",
            fix="describe the tool or crate you need, e.g. 'flakebot search \"csv dedupe\"'",
        )
    found = list(dict.fromkeys(terms(query)))
    if not found:
        raise SearchError(
            f"the search query '{query.strip()}' has only common words",
            fix="name what the tool works on or does, e.g. 'csv', 'hex dump viewer'",
        )
    return found


def normal_name(name: str) -> str:
    """A crate name with '_' and '-' made equal and case folded (crates.io treats them as one)."""
    return name.lower().replace("_", "-")


def version_key(version: str) -> tuple[int, int, int, int, str]:
    """Sort key for a semver string: releases after their pre-releases."""
    core, _, pre = version.partition("+")[0].partition("-")
    parts = [int(p) if p.isdigit() else 0 for p in core.split(".")[:3]]
    parts += [0] * (3 - len(parts))
    return parts[0], parts[1], parts[2], 0 if pre else 1, pre


def newest_per_name(crates: Iterable[CrateInfo]) -> list[CrateInfo]:
    """One crate per name, the newest version (a yanked version only when nothing else is left)."""
    best: dict[str, CrateInfo] = {}
    for crate in crates:
        key = normal_name(crate.name)
        held = best.get(key)
        if held is None or _preference(crate) > _preference(held):
            best[key] = crate
    return list(best.values())


def _preference(crate: CrateInfo) -> tuple[bool, tuple[int, int, int, int, str]]:
    return not crate.yanked, version_key(crate.version)


def is_permissive(license_expr: str) -> bool:
    """True when some alternative of an SPDX-ish expression ('MIT OR Apache-2.0', 'MIT/Apache-2.0') is all permissive."""
    for alternative in re.split(r"\s+OR\s+|/", license_expr):
        ids = [i.lower() for i in _LICENSE_ID.findall(alternative) if i.upper() not in ("AND", "WITH")]
        ids = [i for i in ids if not i.endswith("-exception")]
        if ids and all(i in PERMISSIVE for i in ids):
            return True
    return False


def _fields(crate: CrateInfo) -> dict[str, str]:
    return {
        "name": crate.name,
        "keywords": " ".join(crate.keywords),
        "categories": " ".join(c.split("::")[-1] for c in crate.categories),
        "description": crate.description,
    }


class Ranker:
    """An inverted index over crates (newest version per name), queried with BM25F plus signals."""

    def __init__(self, crates: Iterable[CrateInfo]) -> None:
        self.crates = newest_per_name(crates)
        self.postings: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.lengths: list[float] = []
        for doc, crate in enumerate(self.crates):
            weighted: dict[str, float] = defaultdict(float)
            for field, text in _fields(crate).items():
                for term in terms(text):
                    weighted[term] += WEIGHTS[field]
            self.lengths.append(sum(weighted.values()) or 1.0)
            for term, tf in weighted.items():
                self.postings[term].append((doc, tf))
        self.avg_length = sum(self.lengths) / len(self.lengths) if self.lengths else 1.0
        self.by_name = {normal_name(c.name): i for i, c in enumerate(self.crates)}

    def __len__(self) -> int:
        return len(self.crates)

    def search(self, query: str, limit: int = 10) -> list[Candidate]:
        """The best `limit` crates for `query`, best first; [] when nothing matches."""
        wanted = query_terms(query)
        spelled = {stem(w): w for w in words(query) if w not in STOPWORDS}
        relevance, matched = self._bm25(wanted)
        exact = self.by_name.get("-".join(w for w in words(query) if w not in STOPWORDS))
        if exact is not None:
            relevance.setdefault(exact, 0.0)
            matched.setdefault(exact, [])
        roots = _family_roots([normal_name(self.crates[doc].name) for doc in relevance])
        scored = []
        for doc, text_score in relevance.items():
            crate = self.crates[doc]
            score, reasons = _signals(crate, text_score, doc == exact)
            if normal_name(crate.name) in roots:
                score *= 1.15
                reasons.insert(0, "family root")
            scored.append(
                Candidate(crate, score, _why([spelled.get(t, t) for t in matched[doc]], reasons, doc == exact))
            )
        return heapq.nlargest(limit, scored, key=lambda c: (c.score, version_key(c.crate.version), c.crate.name))

    def _bm25(self, wanted: list[str]) -> tuple[dict[int, float], dict[int, list[str]]]:
        total = len(self.crates)
        relevance: dict[int, float] = defaultdict(float)
        matched: dict[int, list[str]] = defaultdict(list)
        for term in wanted:
            postings = self.postings.get(term, [])
            if not postings:
                continue
            idf = math.log(1 + (total - len(postings) + 0.5) / (len(postings) + 0.5))
            for doc, tf in postings:
                norm = K1 * (1 - B + B * self.lengths[doc] / self.avg_length)
                relevance[doc] += idf * tf * (K1 + 1) / (tf + norm)
                matched[doc].append(term)
        return relevance, matched


def _family_roots(names: list[str]) -> set[str]:
    """Names that prefix other matching names (regex for regex-syntax): the crate users start from."""
    ordered = sorted(names)
    return {a for a, b in zip(ordered, ordered[1:], strict=False) if b.startswith(a + "-")}


def _signals(crate: CrateInfo, text_score: float, exact: bool) -> tuple[float, list[str]]:
    """The final score of a crate and the signals that moved it."""
    bonus, reasons = 0.0, []
    if exact:
        bonus += 1.0
    if crate.bin_names:
        bonus += 0.25
        reasons.append("bin " + ",".join(crate.bin_names[:2]))
    elif crate.has_lib:
        reasons.append("lib")
    if crate.license and is_permissive(crate.license):
        bonus += 0.1
    elif crate.license:
        reasons.append(f"licence {crate.license}")
    if crate.repository:
        bonus += 0.05
    popular = crate.recent_downloads or crate.downloads
    if popular:
        bonus += 0.3 * min(1.0, math.log10(popular + 1) / 8)
        reasons.append(f"{_count(crate.downloads or popular)} downloads")
    score = (text_score + (2.0 if exact else 0.0)) * (1 + bonus)
    if crate.proc_macro:
        score *= 0.7
        reasons.append("proc-macro")
    if crate.yanked:
        score *= 0.1
        reasons.append("yanked")
    return score, reasons


def _why(matched: list[str], reasons: list[str], exact: bool) -> str:
    head = ["exact name"] if exact else []
    if matched:
        head.append("matches " + ", ".join(matched[:4]))
    return "; ".join(head + reasons)


def _count(n: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0", "")
    return str(n)


def rank(query: str, crates: Iterable[CrateInfo], limit: int = 10) -> list[Candidate]:
    """Rank `crates` for `query` (one-off; keep a Ranker to query the same crates again)."""
    return Ranker(crates).search(query, limit)
