"""The ranking shared by every registry: normalisation, BM25F relevance, tool-making signals, `why`."""

from __future__ import annotations

import pytest

from flakebot.crates import CrateInfo
from flakebot.crates.rank import Ranker, is_permissive, query_terms, rank, stem, terms, version_key
from flakebot.errors import SearchError


def crate(name: str, description: str = "", **fields: object) -> CrateInfo:
    return CrateInfo(name=name, version=str(fields.pop("version", "1.0.0")), description=description, **fields)  # type: ignore[arg-type]


FILLER = [crate(f"filler{i}", f"unrelated helper number {i} for networking") for i in range(20)]


@pytest.mark.parametrize(
    "forms",
    [
        ("parse", "parser", "parsing", "parses"),
        ("argument", "arguments"),
        ("view", "viewer", "views"),
        ("library", "libraries"),
        ("box", "boxes"),
        ("dedupe", "deduper"),
    ],
)
def test_word_forms_fold_together(forms: tuple[str, ...]) -> None:
    assert len({stem(f) for f in forms}) == 1


def test_separators_and_stopwords() -> None:
    assert terms("serde_json") == terms("serde-json") == terms("Serde JSON")
    assert terms("I need a tool to view the hex") == terms("view hex")


@pytest.mark.parametrize("query", ["", "   ", "the of a", "I need a tool for the"])
def test_query_without_meaning_is_refused(query: str) -> None:
    with pytest.raises(SearchError) as info:
        query_terms(query)
    assert info.value.fix and ("empty" in info.value.message or "only common words" in info.value.message)


def test_exact_name_ranks_first_even_against_denser_text() -> None:
    crates = [crate("csv-core", "csv csv parsing core for csv"), crate("csv", "Fast CSV parsing"), *FILLER]
    found = rank("csv", crates)
    assert [c.crate.name for c in found[:2]] == ["csv", "csv-core"]
    assert found[0].why.startswith("exact name")


def test_underscore_and_dash_names_are_one_name() -> None:
    crates = [crate("serde_json", "A JSON serialization file format"), crate("json5", "JSON5 parser"), *FILLER]
    for query in ("serde_json", "serde-json", "Serde JSON"):
        assert rank(query, crates)[0].crate.name == "serde_json"


def test_binary_licence_repository_and_popularity_break_ties() -> None:
    same = "viewer for hex dumps"
    plain = crate("plainhex", same, license="GPL-3.0-only")
    tool = crate(
        "toolhex",
        same,
        license="MIT OR Apache-2.0",
        bin_names=["toolhex"],
        repository="https://example.org/t",
        downloads=5_000_000,
    )
    found = rank("hex viewer", [plain, tool, *FILLER])
    assert [c.crate.name for c in found] == ["toolhex", "plainhex"]
    assert "bin toolhex" in found[0].why and "5M downloads" in found[0].why
    assert "licence GPL-3.0-only" in found[1].why


def test_yanked_and_proc_macros_sink() -> None:
    crates = [
        crate("argyank", "parse command line arguments", yanked=True),
        crate("argmacro", "parse command line arguments", proc_macro=True),
        crate("argplain", "parse command line arguments"),
        *FILLER,
    ]
    found = rank("command line argument parser", crates)
    assert [c.crate.name for c in found] == ["argplain", "argmacro", "argyank"]
    assert "yanked" in found[2].why and "proc-macro" in found[1].why


def test_newest_version_per_name_and_only_matches_returned() -> None:
    crates = [
        crate("clap", "argument parser", version="2.34.0"),
        crate("clap", "argument parser", version="4.0.32"),
        *FILLER,
    ]
    found = Ranker(crates).search("argument parser", limit=10)
    assert [(c.crate.name, c.crate.version) for c in found] == [("clap", "4.0.32")]
    assert Ranker(crates).search("kubernetes operator") == []


def test_family_root_is_preferred() -> None:
    crates = [
        crate("regex-syntax", "A regular expression parser."),
        crate("regex-automata", "Automata construction and matching using regular expressions."),
        crate("regex", "An implementation of regular expressions for Rust."),
        *FILLER,
    ]
    found = rank("regular expressions", crates)
    assert found[0].crate.name == "regex" and "family root" in found[0].why


def test_every_candidate_explains_itself_and_limit_holds() -> None:
    crates = [crate(f"hexthing{i}", f"hex tool {i}") for i in range(15)] + FILLER
    found = rank("hex", crates, limit=5)
    assert len(found) == 5
    assert all(c.why and c.score > 0 for c in found)
    assert [c.score for c in found] == sorted((c.score for c in found), reverse=True)


@pytest.mark.parametrize(
    ("expr", "permissive"),
    [
        ("MIT", True),
        ("MIT OR Apache-2.0", True),
        ("MIT/Apache-2.0", True),
        ("Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT", True),
        ("Unlicense/MIT", True),
        ("GPL-3.0-only", False),
        ("MIT AND GPL-2.0", False),
        ("GPL-2.0 OR MIT", True),
        ("see LICENSE", False),
        ("", False),
    ],
)
def test_permissive_licences(expr: str, permissive: bool) -> None:
    assert is_permissive(expr) is permissive


def test_version_order() -> None:
    versions = ["1.0.0", "0.9.10", "1.0.0-alpha.5", "0.10.0", "2.34.0", "4.0.32"]
    assert sorted(versions, key=version_key) == ["0.9.10", "0.10.0", "1.0.0-alpha.5", "1.0.0", "2.34.0", "4.0.32"]
