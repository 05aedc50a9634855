#!/usr/bin/env bash
# Regenerate the Python stubs (+ mypy stubs) for proto/ocmfl/**.proto.
# Usage: hack/gen-proto.sh [OUT_DIR]   (default: the repository root, i.e. ocmfl/status/v1/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
mkdir -p "$OUT"
cd "$ROOT/proto"
mapfile -t PROTOS < <(find ocmfl -name '*.proto' | sort)
# protoc-gen-mypy / protoc-gen-mypy_grpc live next to the interpreter.
PATH="$(dirname "$PY"):$PATH"
export PATH
"$PY" -m grpc_tools.protoc -I . \
  --python_out="$OUT" --grpc_python_out="$OUT" \
  --mypy_out="$OUT" --mypy_grpc_out="$OUT" \
  "${PROTOS[@]}"
