"""flakebot's templates: the generated flake (flake.nix.j2), USAGE.md (usage.md.j2), the frozen acceptance test
(acceptance.rs.j2), the model prompts (prompts/) and the host stand-in for nixpkgs (standin/).

Data, not code: this folder is the package `flakebot.templates` (pyproject.toml maps it), so the wheel ships it
and flakebot.render finds it the same way installed or editable.
"""
