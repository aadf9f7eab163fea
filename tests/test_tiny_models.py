"""Tests for lit_rl.models.tiny: the locally built tiny causal LMs and tokenizers."""

from __future__ import annotations

import json
import os
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rl.models import tiny
from lit_rl.models.tiny import (
    EOS_ID,
    IM_END_ID,
    IM_START_ID,
    PAD_ID,
    UNK_ID,
    build_tiny_model,
    build_tokenizer,
    default_corpus,
    ensure_tiny_model,
)

# Printable ASCII minus the control whitespace (\t \r \v \f), which the char vocab excludes.
ASCII = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")
ROUNDTRIP = [
    "",
    "a",
    "12+34=46",
    "What is 7 * 8?\nThe answer is 56.\n",
    "  leading, double  spaces and trailing  ",
    "\n\nblank lines\n\n\n",
    "x = [1, 2]; print(x)  # ok",
    "Hello , world ! it 's a test .",  # spaces before punctuation must survive decoding
    ASCII,
]
SMALL = {"layers": 1, "hidden": 32, "heads": 2}  # cheapest valid model, for build-mechanics tests


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


# ----------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_special_token_ids_and_settings(kind):
    tok = build_tokenizer(kind)
    assert tok.convert_tokens_to_ids(
        ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>"]
    ) == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert (PAD_ID, EOS_ID, IM_START_ID, IM_END_ID, UNK_ID) == (0, 1, 2, 3, 4)
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id, tok.bos_token_id) == (0, 1, 4, None)
    assert tok.padding_side == "left"
    assert tok.model_max_length == 512


def test_char_vocab_is_one_token_per_character():
    tok = build_tokenizer("char")
    assert len(tok) == 101  # 5 specials + "\n" + 95 printable ASCII
    chars = ["\n"] + [chr(c) for c in range(0x20, 0x7F)]
    ids = [tok(c)["input_ids"] for c in chars]
    assert ids == [[5 + i] for i in range(96)]  # documented order, one id each
    assert tok.decode(list(range(5, 101))) == "".join(chars)


def test_encode_adds_no_bos_or_eos():
    tok = build_tokenizer("char")
    # id of a printable char = 6 + (code point - 0x20): after 5 specials and "\n".
    assert tok("ab")["input_ids"] == [6 + ord("a") - 0x20, 6 + ord("b") - 0x20]
    assert tok("")["input_ids"] == []


@pytest.mark.parametrize("text", ROUNDTRIP)
def test_char_roundtrip_in_memory(text):
    tok = build_tokenizer("char")
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)
    assert UNK_ID not in ids
    assert tok.decode(ids) == text


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_llama_dir"])
def test_char_roundtrip_after_reload_matches_in_memory(fixture, request):
    # qwen2 reloads as Qwen2Tokenizer (pipeline rebuilt from vocab), llama verbatim: both must agree.
    loaded = AutoTokenizer.from_pretrained(request.getfixturevalue(fixture))
    mem = build_tokenizer("char")
    assert len(loaded) == 101
    for text in ROUNDTRIP:
        ids = loaded(text)["input_ids"]
        assert ids == mem(text)["input_ids"]
        assert loaded.decode(ids) == text
    assert loaded.padding_side == "left"
    assert (loaded.pad_token_id, loaded.eos_token_id) == (PAD_ID, EOS_ID)


def test_unknown_characters(tiny_model_dir, tiny_llama_dir):
    text = "aé"  # é is two UTF-8 bytes
    a = build_tokenizer("char")("a")["input_ids"][0]
    assert build_tokenizer("char")(text)["input_ids"] == [a, UNK_ID, UNK_ID]
    assert AutoTokenizer.from_pretrained(tiny_llama_dir)(text)["input_ids"] == [a, UNK_ID, UNK_ID]
    # Documented transformers behaviour: Qwen2Tokenizer's rebuilt BPE has no unk, so unknown bytes vanish.
    assert AutoTokenizer.from_pretrained(tiny_model_dir)(text)["input_ids"] == [a]


def test_chat_template_exact(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1=?"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1=?<|im_end|>\n"
    )
    with_prompt = tok.apply_chat_template(msgs[1:], tokenize=False, add_generation_prompt=True)
    assert with_prompt == "<|im_start|>user\n1+1=?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(with_prompt)["input_ids"]
    # Chat markers are single special ids, never spelled out character by character.
    assert ids[0] == IM_START_ID and ids.count(IM_START_ID) == 2 and ids.count(IM_END_ID) == 1
    # 55 chars; two 12-char <|im_start|> and one 10-char <|im_end|> each collapse to one id.
    assert len(ids) == 55 - 2 * 11 - 9 == 24
    assert tok.decode(ids) == with_prompt


def test_bpe_tokenizer_roundtrip_and_compression():
    tok = build_tokenizer("bpe", vocab_size=400)
    assert 261 < len(tok) <= 400
    for text in ROUNDTRIP + ["unicode: héllo ✓ 日本"]:
        ids = tok(text)["input_ids"]
        assert UNK_ID not in ids
        assert tok.decode(ids) == text
    arith = "What is 12 + 34? The answer is 46."
    assert len(tok(arith)["input_ids"]) < len(arith)  # merges were learned


def test_bpe_custom_corpus_and_floor():
    corpus = ["abc abc abc abd"] * 50
    t1, t2 = build_tokenizer("bpe", corpus=corpus, vocab_size=300), build_tokenizer("bpe", corpus=corpus)
    assert t1.get_vocab() == t2.get_vocab()  # tiny corpus runs out of merges before either cap
    assert len(t1) < 300
    with pytest.raises(ValueError, match="vocab_size.*>= 261"):
        build_tokenizer("bpe", vocab_size=260)


def test_default_corpus_deterministic():
    a, b = default_corpus(), default_corpus()
    assert a == b and len(a) == 3000
    assert default_corpus(seed=1) != a
    assert any("=" in line for line in a) and any(line.startswith("def ") for line in a)


def test_unknown_tokenizer_kind():
    with pytest.raises(ValueError, match=r"\['char', 'bpe'\].*'word'"):
        build_tokenizer("word")


# ----------------------------------------------------------------------------- model files


def test_config_and_generation_config(tiny_model_dir):
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["model_type"] == "qwen2"
    assert (cfg["eos_token_id"], cfg["pad_token_id"], cfg["bos_token_id"]) == (1, 0, 1)
    assert cfg["dtype"] == cfg["torch_dtype"] == "float32"
    assert cfg["max_position_embeddings"] == 512 and cfg["tie_word_embeddings"] is True
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (101, 64, 2)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]) == (2, 2, 256)
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"], gen["bos_token_id"]) == (1, 0, 1)
    files = {p.name for p in tiny_model_dir.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert not any(name.endswith(".bin") for name in files)


def test_forward_shapes_and_tied_embeddings(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = tok(["1+1=", "12+34="], return_tensors="pt", padding=True)
    assert batch["input_ids"].tolist()[0][:2] == [PAD_ID, PAD_ID]  # left padding
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, 6, 101) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_generate_left_padding_invariant(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = tok(["7*8=", "123+456="], return_tensors="pt", padding=True)
    out = model.generate(
        **batch, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    assert out.sequences.shape == (2, 8 + 4)
    alone = model.generate(
        **tok(["7*8="], return_tensors="pt"),
        max_new_tokens=4,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    # The padded row must see the same distribution as the unpadded prompt (mask + positions right).
    torch.testing.assert_close(out.logits[0][0], alone.logits[0][0], rtol=1e-5, atol=1e-5)


def test_generate_stops_at_eos(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = tok(["ab", "abcd"], return_tensors="pt", padding=True)
    allowed_only_eos = [i for i in range(101) if i != EOS_ID]
    out = model.generate(**batch, max_new_tokens=10, do_sample=False, suppress_tokens=allowed_only_eos)
    # eos comes from generation_config.json: both rows end after one token.
    assert torch.equal(out[:, :4], batch["input_ids"]) and out[:, -1].tolist() == [EOS_ID, EOS_ID]
    assert out.shape == (2, 5)


def test_llama_arch_loads(tiny_llama_dir):
    cfg = json.loads((tiny_llama_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7]])).logits
    assert logits.shape == (1, 3, 101)


def test_bpe_model_reload_matches_in_memory(tmp_path):
    path = build_tiny_model(tmp_path / "m", tokenizer="bpe", vocab_size=400, **SMALL)
    cfg = json.loads((path / "config.json").read_text())
    loaded, mem = AutoTokenizer.from_pretrained(path), build_tokenizer("bpe", vocab_size=400)
    assert cfg["vocab_size"] == len(loaded) == len(mem)
    for text in ROUNDTRIP:
        assert loaded(text)["input_ids"] == mem(text)["input_ids"]


def test_build_deterministic_in_seed(tmp_path):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = _weights(build_tiny_model(tmp_path / "a", seed=3, **SMALL))
    assert torch.equal(torch.rand(3), expected_next)  # the caller's RNG stream is not disturbed
    b = _weights(build_tiny_model(tmp_path / "b", seed=3, **SMALL))
    c = _weights(build_tiny_model(tmp_path / "c", seed=4, **SMALL))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert all(v.dtype == torch.float32 for v in a.values())


def test_untied_and_gqa_options(tmp_path):
    path = build_tiny_model(
        tmp_path / "m", layers=1, hidden=64, heads=4, kv_heads=2, intermediate=96, tie_word_embeddings=False
    )
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["tie_word_embeddings"]) == (
        2,
        96,
        False,
    )
    assert "lm_head.weight" in _weights(path)


def test_refuses_non_empty_dir_unless_overwrite(tmp_path):
    out = build_tiny_model(tmp_path / "m", seed=0, **SMALL)
    before = _weights(out)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        build_tiny_model(out, seed=1, **SMALL)
    assert build_tiny_model(out, seed=1, overwrite=True, **SMALL) == out
    after = _weights(out)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp dirs left behind


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"arch": "gpt2"}, r"arch must be one of \['qwen2', 'llama'\], got 'gpt2'"),
        ({"tokenizer": "word"}, "tokenizer must be one of"),
        ({"hidden": 30, "heads": 4}, r"hidden \(30\) must be divisible by heads \(4\)"),
        ({"hidden": 36, "heads": 4}, "head dim hidden/heads = 9 must be even"),
        ({"heads": 4, "kv_heads": 3}, r"heads \(4\) must be divisible by kv_heads \(3\)"),
        ({"layers": 0}, "layers must be a positive int"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_tiny_model(tmp_path / "m", **kwargs)
    assert not (tmp_path / "m").exists()


def test_ensure_is_idempotent(tmp_path):
    out = ensure_tiny_model(tmp_path / "m", **SMALL)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert ensure_tiny_model(tmp_path / "m", **SMALL) == out
    assert ensure_tiny_model(tmp_path / "m", seed=9) == out  # existing build wins, arguments unchecked
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    with pytest.raises(TypeError, match="unexpected arguments"):
        ensure_tiny_model(tmp_path / "other", hiden=32)


def test_ensure_loses_race_gracefully(tmp_path, monkeypatch):
    # Simulate another process finishing its rename while this one is still building.
    out = tmp_path / "m"
    real = tiny._build_into

    def racing(tmp_dir, **kwargs):
        n = real(tmp_dir, **kwargs)
        out.mkdir()
        (out / "config.json").write_text("{}")
        return n

    monkeypatch.setattr(tiny, "_build_into", racing)
    assert ensure_tiny_model(out, **SMALL) == out.resolve()
    assert (out / "config.json").read_text() == "{}"  # the winner's files are untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # loser's temp dir removed


def test_cli_builds_and_reports(tmp_path):
    out = tmp_path / "cli"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "lit_rl.models.tiny",
            str(out),
            "--layers",
            "1",
            "--hidden",
            "32",
            "--heads",
            "2",
            "--arch",
            "llama",
            "--seed",
            "5",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    # the last two lines are ours; DeepSpeed (installed by default) logs its accelerator choice to stdout on import
    lines = res.stdout.strip().splitlines()[-2:]
    assert lines[0] == str(out.resolve())
    model = AutoModelForCausalLM.from_pretrained(out)
    assert lines[1] == f"parameters: {sum(p.numel() for p in model.parameters())}"
    assert type(model).__name__ == "LlamaForCausalLM"
    same = _weights(build_tiny_model(tmp_path / "api", arch="llama", seed=5, **SMALL))
    assert all(torch.equal(v, same[k]) for k, v in _weights(out).items())
