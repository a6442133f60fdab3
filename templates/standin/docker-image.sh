# Builder of the stand-in's dockerTools.buildLayeredImage (run as `bash -e docker-image.sh`): the closure in
# $NIX_BUILD_TOP/closure (exportReferencesGraph) less the roots file itself, one layer per store path (the last
# layer takes the rest once maxLayers - 1 are used), then the customisation layer from extraCommands and
# fakeRootCommands (a recorded chown: fakeroot's effect, without fakeroot), a config and manifest.json, gzip'd.
set -euo pipefail
work="$NIX_BUILD_TOP/image"
mkdir -p "$work/archive" "$work/root"
tarOptions=(--sort=name --mtime=@1 --numeric-owner --owner=0 --group=0 --format=gnu)

# exportReferencesGraph's file: path, deriver, count, references..., repeated; the paths are the lines that start
# a record. Store paths only, sorted, the roots file left out.
mapfile -t paths < <(awk 'BEGIN { state = 0 } state == 0 { print; state = 1; next } state == 1 { state = 2; next }
  state == 2 { n = $1; state = (n > 0) ? 3 : 0; next } state == 3 { n--; if (n == 0) state = 0 }' \
  "$NIX_BUILD_TOP/closure" | grep -v -x "$rootsPath" | sort -u)

layers=()
addLayer() {  # a layer tar already written at $work/layer.tar: moved into the archive under its digest
  local digest
  digest=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  mkdir -p "$work/archive/$digest"
  mv "$work/layer.tar" "$work/archive/$digest/layer.tar"
  layers+=("$digest")
}

# The stand-in builds with this machine's toolchain, so its programs link this machine's dynamic loader and libraries
# (real nixpkgs' closure carries its own glibc). They go into the image at the paths the loader looks them up (the
# program's PT_INTERP; each DT_NEEDED in its DT_RUNPATH, else the system's library directories), each file's own
# needs followed too, so the image runs where this machine's /usr is not. Read with readelf: nothing is run.
hostLibs="$work/hostlibs"
mkdir -p "$hostLibs"
libDirs=("/lib/$(uname -m)-linux-gnu" "/usr/lib/$(uname -m)-linux-gnu" /lib64 /usr/lib64 /lib /usr/lib)
declare -A added=()
queue=()
for path in "${paths[@]}"; do
  while IFS= read -r -d '' file; do
    if [ "$(od -An -tx1 -N4 "$file" | tr -d ' \n')" = 7f454c46 ]; then queue+=("$file"); fi
  done < <(find "$path" -type f -print0)
done
addHost() {  # $1: a path as the loader opens it (outside the store); its file's content there, and its own needs
  local at="$1" real
  [ -n "${added[$at]:-}" ] && return 0
  real=$(readlink -f "$at")
  added[$at]=1
  mkdir -p "$hostLibs$(dirname "$at")"
  cp "$real" "$hostLibs$at"
  chmod "$(stat -c %a "$real")" "$hostLibs$at"
  queue+=("$real")
}
i=0
while [ "$i" -lt "${#queue[@]}" ]; do
  file="${queue[$i]}"
  i=$((i + 1))
  interp=$(readelf -lW "$file" 2>/dev/null | sed -n 's/.*\[Requesting program interpreter: \(.*\)\]$/\1/p')
  if [ -n "$interp" ] && [ "${interp#/nix/store/}" = "$interp" ]; then addHost "$interp"; fi
  dynamic=$(readelf -dW "$file" 2>/dev/null || true)
  runpath=$(sed -n 's/.*(RU*N*PATH).*\[\(.*\)\]$/\1/p' <<< "$dynamic" | sed "s|\$ORIGIN|$(dirname "$file")|g" | tr ':' ' ')
  for needed in $(sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p' <<< "$dynamic"); do
    found=""
    for dir in $runpath "${libDirs[@]}"; do
      if [ -e "$dir/$needed" ]; then found="$dir/$needed"; break; fi
    done
    if [ -z "$found" ]; then
      echo "flakebot stand-in dockerTools: $needed (needed by $file) is not on this machine" >&2
      exit 1
    fi
    if [ "${found#/nix/store/}" = "$found" ]; then
      addHost "$found"
    elif [ -L "$found" ]; then  # a store path linking a host library (a stand-in package): the target goes in too
      target=$(readlink "$found")
      case "$target" in /nix/store/*) ;; /*) addHost "$target" ;; esac
    fi
  done
done
withHostLibs=0
if [ "${#added[@]}" -gt 0 ]; then withHostLibs=1; fi

perLayer=$((maxLayers - 1 - withHostLibs))
if [ "$perLayer" -lt 1 ]; then perLayer=1; fi
i=0
rest=()
for path in "${paths[@]}"; do
  if [ "$i" -lt $((perLayer - 1)) ] || [ "${#paths[@]}" -le "$perLayer" ]; then
    tar -cf "$work/layer.tar" "${tarOptions[@]}" -C / --no-recursion nix nix/store
    tar -rf "$work/layer.tar" "${tarOptions[@]}" -C / "${path#/}"
    addLayer
  else
    rest+=("${path#/}")
  fi
  i=$((i + 1))
done
if [ "${#rest[@]}" -gt 0 ]; then
  tar -cf "$work/layer.tar" "${tarOptions[@]}" -C / --no-recursion nix nix/store
  tar -rf "$work/layer.tar" "${tarOptions[@]}" -C / "${rest[@]}"
  addLayer
fi

if [ "$withHostLibs" = 1 ]; then
  (cd "$hostLibs" && find . -mindepth 1 -printf '%P\n' | sort) > "$NIX_BUILD_TOP/host-files"
  tar -cf "$work/layer.tar" "${tarOptions[@]}" -C "$hostLibs" --no-recursion -T "$NIX_BUILD_TOP/host-files"
  addLayer
fi

# The customisation layer: the commands run at the image root; `chown` records owners for the tar.
owners="$NIX_BUILD_TOP/owners"
: > "$owners"
chown() {
  local recursive="" spec=""
  while [ $# -gt 0 ]; do
    case "$1" in -R | --recursive) recursive=1 ;; --verbose | -v) ;; -*) echo "stand-in chown: $1 not implemented" >&2; return 1 ;;
      *) if [ -z "$spec" ]; then spec="$1"; else
        if [ -n "$recursive" ]; then find "$1" -print | sed "s|^|$spec |" >> "$owners"; else echo "$spec $1" >> "$owners"; fi
      fi ;; esac
    shift
  done
}
(cd "$work/root" && eval "$extraCommands")
(cd "$work/root" && eval "$fakeRootCommands")
(cd "$work/root" && find . -mindepth 1 -printf '%P\n' | sort) > "$NIX_BUILD_TOP/custom-files"
tar -cf "$work/layer.tar" "${tarOptions[@]}" -C "$work/root" --no-recursion -T /dev/null
while IFS= read -r file; do
  owner=$(awk -v f="$file" '{ sub("^\\./", "", $2) } $2 == f { o = $1 } END { print o }' "$owners")
  uid="${owner%%:*}"; gid="${owner#*:}"
  if [ -z "$owner" ]; then uid=0; gid=0; fi
  if [ "$gid" = "$owner" ]; then gid="$uid"; fi
  tar -rf "$work/layer.tar" --sort=name --mtime=@1 --numeric-owner --owner="$uid" --group="$gid" --format=gnu \
    -C "$work/root" --no-recursion "$file"
done < "$NIX_BUILD_TOP/custom-files"
addLayer

diffIds=$(printf '"sha256:%s"\n' "${layers[@]}" | jq -s .)
layerFiles=$(printf '"%s/layer.tar"\n' "${layers[@]}" | jq -s .)
jq -n --argjson config "$configJson" --argjson diffIds "$diffIds" '{
  architecture: "amd64", os: "linux", created: "1970-01-01T00:00:01Z", config: $config,
  rootfs: { type: "layers", diff_ids: $diffIds },
  history: [ $diffIds[] | { created: "1970-01-01T00:00:01Z", comment: "flakebot stand-in buildLayeredImage" } ]
}' > "$work/config.json"
configDigest=$(sha256sum "$work/config.json" | cut -d' ' -f1)
mv "$work/config.json" "$work/archive/$configDigest.json"
jq -n --arg config "$configDigest.json" --arg tag "$imageName:$tag" --argjson layers "$layerFiles" \
  '[{ Config: $config, RepoTags: [ $tag ], Layers: $layers }]' > "$work/archive/manifest.json"
tar -cf "$work/image.tar" "${tarOptions[@]}" -C "$work/archive" .
gzip -9n < "$work/image.tar" > "$out"
# End with a builtin: see DESIGN.md (Nix kills a builder whose last command closed its output early).
exit 0
