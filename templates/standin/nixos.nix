# A stand-in for the part of nixpkgs' lib and NixOS's module system that a flakebot service module uses, to
# evaluate it where no NixOS is (flakebot.services.nixos): mkOption, mkEnableOption, mkIf, mkDefault, getExe,
# optionalAttrs, mapAttrsToList and
# evalModules over modules given as functions, attribute sets or paths, with imports. Definitions merge as NixOS
# merges them: attribute sets by name (an mkIf pushed down to the values, so a condition may read config), lists
# concatenated, and of several values the one with the highest priority (a plain definition over mkDefault over an
# option's default); two different values at one priority are an error, as there.
rec {
  mkOption = option: option // { _type = "option"; };
  mkEnableOption = description: mkOption { default = false; inherit description; };
  mkIf = condition: content: { _type = "if"; inherit condition content; };
  mkDefault = content: { _type = "override"; priority = 1000; inherit content; };
  types = { package = "package"; port = "port"; bool = "bool"; str = "str"; listOf = t: "listOf ${t}"; nullOr = t: "nullOr ${t}"; attrsOf = t: "attrsOf ${t}"; };
  optionalAttrs = condition: set: if condition then set else { };
  mapAttrsToList = f: set: map (name: f name set.${name}) (builtins.attrNames set);
  getExe = package: "${package}/bin/${package.meta.mainProgram or (throw "lib.getExe: the package has no meta.mainProgram")}";

  isIf = value: builtins.isAttrs value && (value._type or null) == "if";
  isOverride = value: builtins.isAttrs value && (value._type or null) == "override";
  isSet = value: builtins.isAttrs value && !(value ? _type) && !(value ? outPath);
  # The value under any mkIf and mkDefault wrappers (conditions not read: used only to see a definition's shape).
  shape = value: if isIf value || isOverride value then shape value.content else value;

  # One module as an attribute set: a function gets the module arguments, a path is imported.
  load = args: module:
    if builtins.isFunction module then module args
    else if builtins.isPath module || builtins.isString module then load args (import module)
    else module;
  collect = args: module:
    let loaded = load args module; in [ loaded ] ++ builtins.concatLists (map (collect args) (loaded.imports or [ ]));
  configOf = module: module.config or (builtins.removeAttrs module [ "imports" "options" "_file" "key" "meta" ]);

  # An options tree as definitions of its defaults (at the lowest priority).
  defaultsOf = options:
    if (options._type or null) == "option" then
      (if options ? default then { _type = "override"; priority = 1500; content = options.default; }
       else mkIf false null)  # no default: no definition
    else builtins.mapAttrs (name: defaultsOf) options;

  merge = path: definitions:
    let
      shapes = map shape definitions;
    in
    if definitions != [ ] && builtins.all isSet shapes then
      let
        names = builtins.attrNames (builtins.foldl' (acc: s: acc // s) { } shapes);
        under = name: definition:
          if isIf definition then map (value: mkIf definition.condition value) (under name definition.content)
          else if isOverride definition then map (value: definition // { content = value; }) (under name definition.content)
          else if definition ? ${name} then [ definition.${name} ] else [ ];
      in
      builtins.listToAttrs (map (name: { inherit name; value = merge (path ++ [ name ]) (builtins.concatMap (under name) definitions); }) names)
    else leaf path definitions;

  # Leaves: conditions read, the highest priority kept; lists concatenated.
  leaf = path: definitions:
    let
      unwrap = priority: value:
        if isIf value then (if value.condition then unwrap priority value.content else [ ])
        else if isOverride value then unwrap value.priority value.content
        else [ { inherit priority value; } ];
      live = builtins.concatMap (unwrap 100) definitions;
      best = builtins.foldl' (low: d: if d.priority < low then d.priority else low) 10000 live;
      chosen = map (d: d.value) (builtins.filter (d: d.priority == best) live);
      where = builtins.concatStringsSep "." path;
    in
    if chosen == [ ] then throw "The option `${where}' is used but not defined."
    else if builtins.all builtins.isList chosen then builtins.concatLists chosen
    else if builtins.all (v: v == builtins.head chosen) chosen then builtins.head chosen
    else throw "The option `${where}' has conflicting definition values.";

  evalModules = { modules, specialArgs ? { } }:
    let
      args = specialArgs // { inherit config; lib = self; };
      self = import ./nixos.nix;
      loaded = builtins.concatMap (collect args) modules;
      config = merge [ ] (map defaultsOf (map (m: m.options or { }) loaded) ++ map configOf loaded);
    in
    { inherit config; };
}
