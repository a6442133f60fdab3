"""The tests' own registry (tests/fakes/registry.py): what setup installs for them, not what else is installed."""

from __future__ import annotations

import os

from tests.conftest import DEBIAN_REGISTRY
from tests.fakes.registry import closure, listed_packages

LISTING = "\n".join(
    [
        "ii \tlibrust-csv-dev\tlibrust-csv-1-dev (= 1.1.6-1)\tlibrust-csv-core-0.1+default-dev (>= 0.1.6-~~), librust-serde-1+default-dev",
        "ii \tlibrust-csv-core-dev\tlibrust-csv-core-0.1+default-dev (= 0.1.6-1)\tlibrust-memchr-2-dev | librust-memchr-dev",
        "ii \tlibrust-memchr-dev\tlibrust-memchr-2-dev (= 2.5.0-1)\t",
        "ii \tlibrust-serde-dev\tlibrust-serde-1+default-dev (= 1.0.1-1)\t",
        "ii \tlibrust-kube-dev\tlibrust-kube-0-dev\tlibrust-serde-1+default-dev",
        "un \tlibrust-gone-dev\t\t",
    ]
)


def test_closure_follows_provides_and_leaves_other_installed_crates_out() -> None:
    found = closure(LISTING, ["librust-csv-dev", "librust-gone-dev"])
    assert found == ["librust-csv-core-dev", "librust-csv-dev", "librust-memchr-dev", "librust-serde-dev"]


def test_registry_holds_the_listed_crates_and_only_links() -> None:
    assert "librust-csv-dev" in listed_packages()
    names = sorted(os.listdir(DEBIAN_REGISTRY))
    assert any(n.startswith("csv-1.") for n in names) and any(n.startswith("hexyl-") for n in names)
    assert all((DEBIAN_REGISTRY / n).is_symlink() for n in names)
