# The subset of nixpkgs' `lib` that generated flakes use.
{ host }:
let
  licenses = builtins.mapAttrs (name: entry: entry // { url = "https://spdx.org/licenses/${entry.spdxId}.html"; })
    (builtins.fromJSON (builtins.readFile ./licenses.json));
in
rec {
  inherit licenses;

  systems.flakeExposed = [ "x86_64-linux" "aarch64-linux" "x86_64-darwin" "aarch64-darwin" ];

  genAttrs = names: f: builtins.listToAttrs (map (name: { inherit name; value = f name; }) names);

  concatStringsSep = builtins.concatStringsSep;

  subtractLists = remove: builtins.filter (x: !(builtins.elem x remove));

  optionalAttrs = cond: attrs: if cond then attrs else { };

  # Every stand-in derivation: it reads this machine's toolchain and registry (extra-sandbox-paths). With remote
  # builders set (nix_builders), host.json names the toolchain's digest as a system feature, so Nix builds it only
  # here (which then advertises the feature) or on a builder advertising the identical toolchain.
  hostDerivation = attrs: derivation (attrs // optionalAttrs (host ? systemFeature) { requiredSystemFeatures = [ host.systemFeature ]; });

  setAttrByPath = path: value:
    if path == [ ] then value
    else { ${builtins.head path} = setAttrByPath (builtins.tail path) value; };

  isDerivation = value: builtins.isAttrs value && (value.type or null) == "derivation";

  # Merge nested attribute sets, right side winning; a derivation on the right replaces, a plain set on the right
  # merges into a derivation on the left (curl gets curl.dev, as a nixpkgs package has its outputs as attributes).
  recursiveUpdate = left: right:
    left // builtins.mapAttrs
      (name: value:
        if left ? ${name} && builtins.isAttrs value && builtins.isAttrs left.${name} && !(isDerivation value)
        then recursiveUpdate left.${name} value
        else value)
      right;

  fakeHash = "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
}
