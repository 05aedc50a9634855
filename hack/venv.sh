#!/usr/bin/env bash
# The project's Python environment, .venv, in seconds when the dependencies are cached.
#
# The dependencies (requirements.lock, exact versions, about 6 GB with torch) live in a shared
# environment under ~/.cache/ocm-fl/venv/, keyed by the lock file's and the interpreter's hash
# and built once per key. Each clone's .venv is small and its own: a fresh venv whose site
# directory adds the shared one (a .pth line), with this clone's code installed editable in it
# and the shared environment's commands (pytest, ruff, mypy, flower-*, ...) pointed at it. So a
# clone never runs another clone's code, and a second clone costs no reinstall.
# Remade when pyproject.toml or requirements.lock changes (hack/lock.sh remakes the lock).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

key=$( (cat requirements.lock; python3 -VV) | sha256sum | cut -c1-16)
cache=${OCMFL_VENV_CACHE:-$HOME/.cache/ocm-fl/venv}
deps=$cache/$key
stamp=.venv/.installed-$( (cat pyproject.toml requirements.lock; echo "$key") | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ -d "$deps" ]; then
  exit 0
fi

if [ ! -x "$deps/bin/python" ]; then
  echo "venv: building the shared dependencies $deps (once per requirements.lock)"
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.build-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  python3 -m venv "$tmp/env"
  "$tmp/env/bin/pip" install -q -U pip setuptools wheel
  "$tmp/env/bin/pip" install -q -r requirements.lock
  # Scripts name their interpreter by path: they are rewritten per clone below, so the move
  # does not matter.
  rm -rf "$deps"
  mv "$tmp/env" "$deps"
  # Keep this key and the one used before it; older ones only take disk (ls skips the
  # hidden .build- directories of builds under way).
  # shellcheck disable=SC2012
  ls -1t "$cache" | tail -n +3 | while read -r old; do rm -rf "${cache:?}/$old"; done
fi

rm -rf .venv
python3 -m venv --without-pip .venv
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
deps_site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
# addsitedir, not a bare path: the shared directory's own .pth files are processed too.
echo "import site; site.addsitedir('$deps_site')" > "$site/_ocmfl_shared_deps.pth"
# The shared environment's commands, each run by this clone's interpreter (binaries linked).
for script in "$deps"/bin/*; do
  [ -f "$script" ] || continue
  name=$(basename "$script")
  case $name in python* | activate* | Activate.ps1) continue ;; esac
  if head -c 2 "$script" | grep -q '#!'; then
    { echo "#!$root/.venv/bin/python"; tail -n +2 "$script"; } > ".venv/bin/$name"
    chmod +x ".venv/bin/$name"
  else
    ln -sf "$script" ".venv/bin/$name"
  fi
done
# This clone's code, editable; its dependencies are all in the shared directory already.
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
touch "$stamp"
echo "venv: .venv uses $deps"
