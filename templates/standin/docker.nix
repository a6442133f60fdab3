# The subset of nixpkgs' dockerTools.buildLayeredImage that flakebot's service flakes use: the closure of what the
# config names (from exportReferencesGraph) as one layer per store path, then a customisation layer made by
# fakeRootCommands / extraCommands (run at the image root; chown is recorded, as fakeroot records it), written as
# nixpkgs writes it: a gzip'd docker-archive ($out is the .tar.gz), loadable by `docker load` and `skopeo copy`.
{ lib, host, system }:
let
  fail = message: throw "flakebot stand-in dockerTools.buildLayeredImage: ${message}";
  names = list: lib.concatStringsSep ", " list;
  # nixpkgs' arguments this stand-in does not implement: an image that needs them builds with --nixpkgs pinned.
  unsupported = [ "fromImage" "fromImageName" "fromImageTag" "enableFakechroot" "includeStorePaths" "uid" "gid"
    "uname" "gname" "compressor" "layeringPipeline" "streamScript" "diskSize" "buildVMMemorySize" "copyToRoot"
    "runAsRoot" "meta" "passthru" "architecture" "created" "mtime" ];
  accepted = [ "name" "tag" "contents" "config" "extraCommands" "fakeRootCommands" "maxLayers" ];

  buildLayeredImage = args:
    let
      given = builtins.attrNames args;
      notImplemented = builtins.filter (name: builtins.elem name unsupported) given;
      unknown = builtins.filter (name: !(builtins.elem name accepted) && !(builtins.elem name unsupported)) given;
      config = args.config or { };
      configJson = builtins.toJSON config;
      # What the image holds: the store paths its config and contents name, with their closures (as nixpkgs'
      # closureRoots: the config's references and the contents).
      roots = lib.hostDerivation {
        name = "${args.name}-image-roots";
        inherit system configJson;
        builder = host.bash;
        args = [ "-c" "printf '%s\\n' \"$configJson\" $contents > $out; exit 0" ];
        PATH = host.path;
        contents = args.contents or [ ];
      };
      tag = args.tag or "latest";
    in
    if notImplemented != [ ] then fail "${names notImplemented} is valid for nixpkgs' buildLayeredImage but not implemented by this offline stand-in; build with --nixpkgs pinned"
    else if unknown != [ ] then fail "unexpected argument ${names unknown} (not one of nixpkgs' buildLayeredImage)"
    else if !(args ? name) then fail "buildLayeredImage needs a name"
    else if (args.contents or [ ]) != [ ] then fail "contents (linked into the image root) is not implemented by this offline stand-in; name the programs in config, or build with --nixpkgs pinned"
    else lib.hostDerivation {
      name = "${builtins.replaceStrings [ "/" ] [ "-" ] args.name}.tar.gz";
      inherit system configJson tag;
      imageName = args.name;
      builder = host.bash;
      args = [ "-e" ./docker-image.sh ];
      PATH = host.path;
      exportReferencesGraph = [ "closure" roots ];
      extraCommands = args.extraCommands or "";
      fakeRootCommands = args.fakeRootCommands or "";
      maxLayers = toString (args.maxLayers or 100);
      rootsPath = roots;
    } // { imageName = args.name; imageTag = tag; };
in
{
  inherit buildLayeredImage;
}
