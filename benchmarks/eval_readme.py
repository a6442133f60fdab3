"""`make eval`'s last step: put bench/eval.md's table into docs/eval.md between its eval markers, so the docs' table
is the one `flakebot eval` just wrote, never typed by hand.

    python -m benchmarks.eval_readme [EVAL_MD] [README]
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.readme import MissingSection, write_section

REPO = Path(__file__).resolve().parent.parent


def update_readme(readme: Path, eval_md: Path) -> None:
    """Replace what stands between the eval markers with the table rows of `eval_md` (the markers must be there)."""
    table = [line for line in eval_md.read_text().splitlines() if line.startswith("|")]
    if not table:
        raise SystemExit(f"error: {eval_md} holds no table. Fix: run 'flakebot eval' first")
    try:
        write_section(readme, "eval", "\n".join(table))
    except MissingSection as exc:
        raise SystemExit(f"error: {exc}. Fix: add the two markers where the table goes") from None


def main(argv: list[str]) -> None:
    eval_md = Path(argv[0]) if argv else REPO / "bench" / "eval.md"
    readme = Path(argv[1]) if len(argv) > 1 else REPO / "docs" / "eval.md"
    update_readme(readme, eval_md)
    print(f"{readme}: eval table from {eval_md}")


if __name__ == "__main__":
    main(sys.argv[1:])
