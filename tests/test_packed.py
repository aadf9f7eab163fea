"""Padding-free packing (models/packed.py, ``PolicyModule(padding_free=True)``): the packed layout by hand, and
the same hidden states, log-probs and gradients as the padded forward in float64."""

from __future__ import annotations

import json

import pytest
import torch

from lit_rl.learners import PolicyModule
from lit_rl.learners.heads import lm_head_projection
from lit_rl.models.packed import pack_rows, unsupported_reason
from lit_rl.rollout.engine import SamplingConfig
from tests._binding import bind_sampling
from tests._float64 import float64_rmsnorm
from tests.test_shared_prompt import COMPLETIONS, PROMPTS, _experience, embedding_inputs


def test_pack_rows_layout_by_hand():
    """Two units: prompt [5 6 7 8] + completions of rows 0 and 2 minus their last token ([11 12], [15 16 17 18]),
    then row 4's [19]; prompt [9 10] + rows 1 ([] of [14]), 3 (empty), 5 ([21 22 23 24])."""
    exp = _experience(PROMPTS, COMPLETIONS)
    pk = pack_rows(exp.input_ids, exp.attention_mask, exp.prompt_len, row_tokens=100)  # both units in one row
    unit_a = [5, 6, 7, 8, 11, 12, 15, 16, 17, 18, 19]
    unit_b = [9, 10, 21, 22, 23, 24]
    assert pk.input_ids.tolist() == [unit_a + unit_b]  # largest unit first (first-fit decreasing)
    assert pk.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 4, 5, 6, 7, 4] + [0, 1, 2, 3, 4, 5]]
    # index: t = 0 reads the prompt's last token, t >= 1 completion token t-1; 0 past the row's last token
    assert pk.index.tolist() == [
        [3, 4, 5, 0, 0],
        [12, 0, 0, 0, 0],
        [3, 6, 7, 8, 9],
        [0, 0, 0, 0, 0],
        [3, 10, 0, 0, 0],
        [12, 13, 14, 15, 16],
    ]
    m = pk.mask[0, 0]
    assert pk.mask.shape == (1, 1, 17, 17)
    assert m[4].nonzero().flatten().tolist() == [0, 1, 2, 3, 4]  # row 0's first fed token: prompt + itself
    assert m[6].nonzero().flatten().tolist() == [0, 1, 2, 3, 6]  # row 2's: not row 0's tokens
    assert m[10].nonzero().flatten().tolist() == [0, 1, 2, 3, 10]  # row 4's
    assert m[16].nonzero().flatten().tolist() == [11, 12, 13, 14, 15, 16]  # unit b: not unit a
    # two rows when the budget cannot hold both units; the shorter row is padded and its padding sees itself
    pk2 = pack_rows(exp.input_ids, exp.attention_mask, exp.prompt_len, row_tokens=11)
    assert pk2.input_ids.tolist() == [unit_a, unit_b + [0] * 5]
    assert pk2.index[5].tolist() == [11 + 1, 11 + 2, 11 + 3, 11 + 4, 11 + 5]
    assert pk2.mask[1, 0, 8].nonzero().flatten().tolist() == [
        6,
        7,
        8,
    ]  # padding: only padding, itself included
    # a group longer than the budget is split, its prompt repeated in each part: no packed row outgrows 8
    pk3 = pack_rows(exp.input_ids, exp.attention_mask, exp.prompt_len, row_tokens=8)
    assert pk3.input_ids.tolist() == [
        [5, 6, 7, 8, 15, 16, 17, 18],
        [9, 10, 21, 22, 23, 24, 0, 0],
        [5, 6, 7, 8, 11, 12, 0, 0],
        [5, 6, 7, 8, 19, 0, 0, 0],
    ]
    assert pk3.index.tolist() == [
        [19, 20, 21, 0, 0],
        [9, 0, 0, 0, 0],
        [3, 4, 5, 6, 7],
        [0, 0, 0, 0, 0],
        [27, 28, 0, 0, 0],
        [9, 10, 11, 12, 13],
    ]
    assert pk3.position_ids[2].tolist() == [0, 1, 2, 3, 4, 5, 0, 0]


def test_pack_rows_declines_layouts_it_cannot_pack():
    exp = _experience([[5, 6], [7]], [[1, 2], [3]])
    holed = exp.attention_mask.clone()
    holed[0, exp.prompt_len] = 0  # a hole inside the completion
    assert pack_rows(exp.input_ids, holed, exp.prompt_len) is None
    assert (
        pack_rows(exp.input_ids[:, : exp.prompt_len], exp.attention_mask[:, : exp.prompt_len], exp.prompt_len)
        is None
    )
    no_prompt = exp.attention_mask.clone()
    no_prompt[1, : exp.prompt_len] = 0
    assert pack_rows(exp.input_ids, no_prompt, exp.prompt_len) is None


@pytest.fixture
def float64_norm():
    with float64_rmsnorm():
        yield


def _logprobs_and_grads(module, exp, padding_free: bool, row_tokens=None):
    module.update_settings(padding_free=padding_free, pack_row_tokens=row_tokens)
    module.model.zero_grad(set_to_none=True)
    w = torch.linspace(-1.0, 2.0, exp.completion_len, dtype=torch.float64)
    out = module.forward_outputs(exp, hidden=True)
    lp, ent, _ = module.logprobs_of(exp, out, entropy=True)
    ((lp * w + 0.3 * ent) * exp.loss_mask).sum().backward()  # the entropy bonus backpropagates too
    grads = {n: p.grad.clone() for n, p in module.model.named_parameters() if p.grad is not None}
    return lp.detach(), out["hidden"].detach(), grads


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_equals_padded_float64(tiny_model_dir, float64_norm, attn):
    """Log-probs, the hidden states a value head reads, and every parameter's gradient: packed (one row, and
    rows of 6 tokens: 3 packed rows) against the padded forward, float64, to summation-order rounding."""
    m = PolicyModule(model=str(tiny_model_dir), share_prompt_forward=False, padding_free=False)
    m.model.double()
    bind_sampling(m, SamplingConfig(temperature=0.7))
    exp = _experience(PROMPTS, COMPLETIONS)
    # the reference is always padded sdpa: padded eager in float64 turns padding rows into NaN (their additive
    # mask overflows to -inf in its float32 softmax) and 0 x NaN reaches the real tokens
    lp0, h0, g0 = _logprobs_and_grads(m, exp, False)
    m.model.config._attn_implementation = attn
    real = exp.attention_mask[:, exp.prompt_len :].bool()
    assert float(lp0[real].abs().min()) > 0 and set(g0) == {n for n, _ in m.model.named_parameters()}
    # eager's softmax runs in float32 inside transformers; sdpa stays in float64
    tol = {"rtol": 1e-10, "atol": 1e-12} if attn == "sdpa" else {"rtol": 1e-5, "atol": 1e-6}
    for row_tokens in (None, 6):
        lp1, h1, g1 = _logprobs_and_grads(m, exp, True, row_tokens)
        assert (lp1[~real] == 0).all()  # padding: not computed
        torch.testing.assert_close(lp1[real], lp0[real], **tol)
        torch.testing.assert_close(h1[real], h0[real], **tol)
        assert set(g1) == set(g0)
        for n in g0:
            torch.testing.assert_close(g1[n], g0[n], msg=n, **tol)


def test_packed_forward_computes_real_tokens_only(tiny_model_dir):
    """What the decoder sees: one packed row of 11 + 6 tokens instead of 6 rows x (4 + 5)."""
    m = PolicyModule(model=str(tiny_model_dir), padding_free=True)
    lm_head_projection(m.model)  # the head's one-time numerical check (one small forward) is not counted here
    exp = _experience(PROMPTS, COMPLETIONS)
    with embedding_inputs(m.model) as seen, torch.no_grad():
        m.completion_logprobs(exp)
    assert seen == [(1, 17)]


def test_padding_free_settings_are_checked(tiny_model_dir, tmp_path):
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="pack_row_tokens"):
            PolicyModule(model=str(tiny_model_dir), padding_free=True, pack_row_tokens=bad)
    with pytest.raises(ValueError, match="padding_free must be true, false or null"):
        PolicyModule(model=str(tiny_model_dir), padding_free="yes")
    # a real model with sliding-window layers: refused when it loads, before any rollout
    from lit_rl.models.tiny import build_tiny_model

    d = build_tiny_model(tmp_path / "sliding", arch="qwen2", layers=2, hidden=32, heads=2, tokenizer="char")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=0,
        layer_types=["sliding_attention", "sliding_attention"],
    )
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="padding_free cannot pack a model with sliding-window"):
        PolicyModule(model=str(d), padding_free=True)
    m = PolicyModule(model=str(tiny_model_dir))
    m.model.config._attn_implementation = "flash_attention_2"
    assert "attn_implementation in ['sdpa', 'eager']" in unsupported_reason(m.model)


def test_packed_materialised_logits_equal_padded_float64(tiny_model_dir, float64_norm):
    """The materialised path (the test reference; ZeRO-3, whose head weight the chunked path cannot read) packs
    too: the packed rows' logits gathered back equal the padded forward's, and so do its hidden states."""
    m = PolicyModule(model=str(tiny_model_dir), share_prompt_forward=False, padding_free=False)
    m.model.double()
    exp = _experience(PROMPTS, COMPLETIONS)
    real = exp.attention_mask[:, exp.prompt_len :].bool()
    with torch.no_grad(), embedding_inputs(m.model) as seen:
        z0, h0 = m.forward_logits(exp, return_hidden=True)
        m.update_settings(padding_free=True)
        z1, h1 = m.forward_logits(exp, return_hidden=True)
    assert seen == [(6, exp.prompt_len + exp.completion_len), (1, 17)]
    torch.testing.assert_close(z1[real], z0[real], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(h1[real], h0[real], rtol=1e-10, atol=1e-12)


def test_padding_free_null_packs_where_the_model_allows(tiny_model_dir, tmp_path):
    """The default (null): uneven and full-length rows both run packed, the decoder input of ``true``; a float64
    model runs padded, as ``false`` (transformers' RMSNorm computes in float32 inside, so the exact float64
    checks compare layouts); a model the packed mask cannot drive loads and runs padded instead of being
    refused."""
    full = [[11, 12, 13, 14, 15]] * 6

    def seen_for(module, completions):
        with embedding_inputs(module.model) as seen, torch.no_grad():
            module.completion_logprobs(_experience(PROMPTS, completions))
        return seen

    auto, on, off = (PolicyModule(model=str(tiny_model_dir), padding_free=v) for v in (None, True, False))
    for m in (auto, on, off):
        lm_head_projection(m.model)
    assert PolicyModule(model=str(tiny_model_dir)).config.forward.padding_free is None  # the default
    assert seen_for(auto, COMPLETIONS) == seen_for(on, COMPLETIONS) == [(1, 17)]
    assert seen_for(auto, full) == seen_for(on, full) == [(1, 30)]  # [5 6 7 8] + 3 rows x 4, [9 10] + 3 x 4
    assert seen_for(off, full) == [(2, 4), (6, 4)]  # distinct prompts once, then the rows (shared prompt)
    auto.model.double()
    off.model.double()
    assert seen_for(auto, COMPLETIONS) == seen_for(off, COMPLETIONS) == [(6, 9)]  # float64: plain padded
    # a model the packed mask cannot drive (sliding-window layers): loads, and runs padded
    from lit_rl.models.tiny import build_tiny_model

    d = build_tiny_model(tmp_path / "sliding", arch="qwen2", layers=2, hidden=32, heads=2, tokenizer="char")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(
        use_sliding_window=True, sliding_window=4, max_window_layers=0, layer_types=["sliding_attention"] * 2
    )
    (d / "config.json").write_text(json.dumps(cfg))
    sliding, sliding_off = PolicyModule(model=str(d)), PolicyModule(model=str(d), padding_free=False)
    for m in (sliding, sliding_off):
        lm_head_projection(m.model)
    assert unsupported_reason(sliding.model) is not None
    assert seen_for(sliding, COMPLETIONS) == seen_for(sliding_off, COMPLETIONS) != [(1, 17)]
