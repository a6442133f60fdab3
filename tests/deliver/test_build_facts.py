"""The manifest's `build` section: native inputs with their reasons, features turned on, tests that could not run."""

from __future__ import annotations

from flakebot.deliver.manifest import build_facts


def test_a_packaged_copy_that_left_out_dev_dependencies_says_its_tests_did_not_run() -> None:
    package = {
        "native_inputs": {
            "buildInputs": ["zlib"],
            "because": {"zlib": ["build log: Package zlib was not found in the pkg-config search path."]},
        },
        "build_features": ["cli"],
        "dropped_dev_dependencies": [
            {
                "name": "serial_test",
                "manifest": "Cargo.toml",
                "table": "dev-dependencies",
                "reason": "no matching package",
            }
        ],
    }
    facts = build_facts(package)
    assert facts["features"] == ["cli"] and facts["native_inputs"]["because"]["zlib"][0].startswith("build log: ")
    assert (
        facts["untested"]
        == "the crate's own tests did not run: they need dev-dependencies left out: serial_test (no matching package)"
    )


def test_the_acquire_stages_note_wins_and_a_plain_build_has_nothing_untested() -> None:
    assert build_facts({}, "only the acceptance tests ran")["untested"] == "only the acceptance tests ran"
    assert build_facts({}) == {"native_inputs": {}, "features": [], "untested": ""}
