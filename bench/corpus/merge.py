"""Merge the first corpus run (4 rows) with the re-measured rows (hexyl, bat, cbindgen) into bench/corpus/."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "/work/wt-corpus")
from benchmarks import report, machine
from benchmarks.bench_corpus import CORPUS

first = json.loads(Path("/tmp/corpus-run/out/report.json").read_text())
second = json.loads(Path("/tmp/corpus-run2/rows.json").read_text())
again = {row["crate"]: row for row in second["crates"]}
rows = [again.get(r["crate"], r) for r in first["results"]["corpus"]["crates"]]
for row in rows:
    row.pop("flake_dir", None)
packaged = sum(1 for r in rows if r["packaged"])
started2 = float(sys.argv[1]); ended2 = os.path.getmtime("/tmp/corpus-run2/rows.json")
note = (
    f"Two runs: grcov, sniffglue, bindgen and sequoia-sop from the `python -m benchmarks --only corpus` run of {first['generated']} "
    f"({first['benchmarks']['corpus']['seconds']:.0f} s); hexyl, bat and cbindgen measured again by `python -m benchmarks.bench_corpus hexyl bat cbindgen` "
    f"({ended2 - started2:.0f} s) after two changes: the benchmark now packages a fresh copy of each crate (in the first run hexyl and cbindgen "
    "were nix store hits from the test suite, 0.2 s and 0.6 s), and bench-setup installs libonig-dev (in the first run bat failed: "
    "its onig_sys build script found no oniguruma, which the host stand-in takes from the host; Debian's onig_sys package brings only libonig5). "
    "The first run also lost cbindgen's plain cargo build (its directory was removed mid-build by hand)."
)
results = {"corpus": {"crates": rows, "packaged": packaged, "total": len(rows), "share_percent": round(100.0 * packaged / len(rows), 1), "goal_percent": 100.0, "note": note}}
runs = {"corpus": {**first["benchmarks"]["corpus"], "seconds": round(first["benchmarks"]["corpus"]["seconds"] + ended2 - started2, 1)}}
about = {k: v for k, v in first["machine"].items() if k != "load_at_end"}
built = report.build(results, runs, about, "full (corpus only)", runs["corpus"]["seconds"])
built["merged"] = "Not one `make bench`: this report joins two runs of the corpus benchmark (P8's note says which rows come from which, and why); every number was measured, and"
paths = report.write(built, Path("/work/wt-corpus/bench/corpus"))
print(paths)
print(json.dumps(built["figures"], indent=1)[:3000])
