# shellcheck shell=bash
# Sourced by hack/tools/build-<tool>.sh: a Go tool pinned in its wrapper module
# hack/tools/gomod/<tool>/go.mod, built once into ~/.cache/ocm-fl/bin/<tool>-<version>/.

# pinned_tool TOOL MODULE: sets mod (the wrapper module's directory), version (MODULE's version
# in its go.mod) and out (the build directory). When TOOL is built there already, prints its
# path and exits 0 (the caller has nothing to build).
pinned_tool() {
  local tool=$1 module=$2 root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mod="$root/hack/tools/gomod/$tool"
  version=$(awk -v module="$module" '$1 == module {print $2; exit}' "$mod/go.mod")
  if [ -z "$version" ]; then
    echo "build-$tool.sh: no $module version in $mod/go.mod" >&2
    exit 1
  fi
  out="${OCMFL_CACHE:-$HOME/.cache/ocm-fl}/bin/$tool-$version"
  if [ -x "$out/$tool" ]; then
    echo "$out/$tool"
    exit 0
  fi
  mkdir -p "$out"
  echo "building $tool $version into $out (first time only)" >&2
}
