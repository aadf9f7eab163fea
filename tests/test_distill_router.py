"""TeacherRouter / Teacher components: routing by domain (spy teachers), lazy loading, fallback, privileged
templates, tokenizer checks and cross-tokenizer scoring. No training here."""

from __future__ import annotations

import pytest
import torch
from _distill_helpers import Spy

from lit_rl.callbacks.teacher_inputs import privileged_prompt, teacher_view
from lit_rl.callbacks.teachers import Teacher, TeacherRouter, _pack
from lit_rl.core.logprobs import token_logprobs
from lit_rl.data.prompts import Prompt, render_prompt
from lit_rl.learners.policy import PolicyModule
from lit_rl.models.loading import load_causal_lm, load_tokenizer
from lit_rl.models.tiny import build_tiny_model

TINY = {"layers": 2, "hidden": 64, "heads": 2, "tokenizer": "char"}


@pytest.fixture(scope="module")
def two_teachers(tmp_path_factory):
    d = tmp_path_factory.mktemp("teachers")
    return [build_tiny_model(d / name, seed=s, **TINY) for name, s in (("add", 11), ("rev", 12))]


@pytest.fixture(scope="module")
def student(tiny_model_dir):
    # The spy teachers record whole rows: the plain forward (one (B, P+C) pass), not the shared-prompt pass
    # whose prompt and completion passes have other widths (tests/test_shared_prompt.py covers that one).
    return PolicyModule(model=str(tiny_model_dir), share_prompt_forward=False)


def _exp(tok, rows):
    """rows: (prompt record, completion text) → Experience in ``tok``'s tokens."""
    p_ids = [render_prompt(p, tok) for p, _ in rows]
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] for _, c in rows]
    return _pack(tok, p_ids, c_ids, [p for p, _ in rows], torch.zeros(len(rows)))


ADD = [
    Prompt(prompt="||+|=", answer="3", domain="addition", uid="a1"),
    Prompt(prompt="|+|=", answer="2", domain="addition", uid="a2"),
]
REV = [Prompt(prompt="rev abc:", answer="cba", domain="reverse", uid="r1")]


def test_spy_every_row_scored_by_its_own_domain_teacher(student, two_teachers):
    tok = student.tokenizer
    spies = {d: Spy(load_causal_lm(str(p)).eval()) for d, p in zip(("addition", "reverse"), two_teachers)}
    router = TeacherRouter({d: Teacher(model=s, tokenizer=tok) for d, s in spies.items()})
    rows = [(ADD[0], "3"), (REV[0], "cba"), (ADD[1], "5"), (REV[0], "abc"), (ADD[0], "4")]
    exp = _exp(tok, rows)
    router.on_experience(None, student, exp)
    for domain, spy in spies.items():
        seen = torch.cat(spy.seen)
        own = [i for i, (p, _) in enumerate(rows) if p.domain == domain]
        assert seen.shape[0] == len(own), (domain, seen.shape)  # every own row once, no other row
        for r in seen:  # each scored sequence is one of this domain's rows, never another domain's
            text = tok.decode(r[r != tok.pad_token_id])
            assert any(text == rows[i][0].prompt + rows[i][1] for i in own), (domain, text)
            assert not any(text == rows[i][0].prompt + rows[i][1] for i in range(len(rows)) if i not in own)
    # and the attached log-probs are the own teacher's, row by row
    for i, (p, _) in enumerate(rows):
        row = exp.select([i])
        want = token_logprobs(student.forward_logits(row, model=spies[p.domain].inner), row.completion_ids)
        torch.testing.assert_close(
            exp.teacher_logprobs[i : i + 1][row.loss_mask], want[row.loss_mask].float()
        )
    assert router.rows_total == {"addition": 3, "reverse": 2}


def test_unknown_domain_error_and_fallback(student, two_teachers):
    tok = student.tokenizer
    exp = _exp(tok, [(Prompt(prompt="x", answer="y", domain="poetry"), "y")])
    router = TeacherRouter({"addition": str(two_teachers[0]), "reverse": str(two_teachers[1])})
    with pytest.raises(
        ValueError, match=r"no teacher for domain 'poetry'; known domains: \['addition', 'reverse'\]"
    ):
        router.on_experience(None, student, exp)
    by_name = TeacherRouter({"addition": str(two_teachers[0])}, fallback="addition")
    by_name.on_experience(None, student, exp)
    assert by_name.fallback is by_name.teachers["addition"] and exp.teacher_logprobs is not None
    by_spec = TeacherRouter({"addition": str(two_teachers[0])}, fallback=str(two_teachers[1]))
    assert by_spec.route("poetry")[0] == "fallback"


def test_teachers_load_lazily_and_offload(student, two_teachers):
    router = TeacherRouter({"addition": str(two_teachers[0]), "reverse": str(two_teachers[1])}, offload=True)
    assert not any(t.loaded for t in router.teachers.values())  # nothing loaded at construction
    router.on_experience(None, student, _exp(student.tokenizer, [(ADD[0], "3")]))
    assert router.teachers["addition"].loaded and not router.teachers["reverse"].loaded
    assert next(router.teachers["addition"].model.parameters()).device.type == "cpu"


def test_router_dtype_loads_path_teachers_in_it_and_scores_with_them(student, two_teachers):
    """`TeacherRouter(dtype="bfloat16")`: teachers from a path (and `self_frozen` copies) that set no dtype of
    their own are loaded in bfloat16; a Teacher's own dtype wins and `self` (the student's live weights) is not
    copied. The attached log-probs are the bfloat16 teacher's: equal to its own forward, off the float32 one's
    by its rounding only."""
    tok = student.tokenizer
    own = Teacher(source=str(two_teachers[1]), dtype="float32")
    router = TeacherRouter(
        {"addition": str(two_teachers[0]), "reverse": own, "poetry": "self", "chess": "self_frozen"},
        dtype="bfloat16",
    )
    got = {d: t.dtype for d, t in router.teachers.items()}
    assert got == {"addition": "bfloat16", "reverse": "float32", "poetry": None, "chess": "bfloat16"}
    frozen = router.teachers["chess"]
    frozen.snapshot(student)
    assert {p.dtype for p in frozen.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in student.model.parameters()} == {
        torch.float32
    }  # the copy was cast, not the student

    exp = _exp(tok, [(ADD[0], "3"), (ADD[1], "5"), (ADD[0], "12")])
    router.on_experience(None, student, exp)
    model, m = router.teachers["addition"].model, exp.loss_mask
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    bf16 = token_logprobs(student.forward_logits(exp, model=model), exp.completion_ids).float()
    f32 = token_logprobs(
        student.forward_logits(exp, model=load_causal_lm(str(two_teachers[0]))), exp.completion_ids
    )
    to_bf16, to_f32 = (
        (exp.teacher_logprobs - bf16)[m].abs().max(),
        (exp.teacher_logprobs - f32)[m].abs().max(),
    )
    # measured: 0 and 1.4e-3 (the tiny teacher); a float32 load would make the second 0
    assert to_bf16 < 1e-5 and 1e-4 < to_f32 < 0.05, (to_bf16, to_f32)


def test_a_teacher_dtype_is_checked_where_it_is_declared(two_teachers):
    with pytest.raises(ValueError, match=r"^TeacherRouter\.dtype='bfloat'; valid values: .*bfloat16"):
        TeacherRouter({"addition": str(two_teachers[0])}, dtype="bfloat")
    with pytest.raises(ValueError, match=r"^Teacher\.dtype='half'; valid values: .*float16"):
        Teacher(source=str(two_teachers[0]), dtype="half")


def test_missing_teacher_path_fails_at_construction(tmp_path):
    with pytest.raises(FileNotFoundError, match="TeacherRouter.teachers.addition="):
        TeacherRouter({"addition": str(tmp_path / "nope")})


def test_privileged_template_fields_and_missing_field():
    p = Prompt(prompt="||+|=", answer="3", domain="addition", uid="a1", metadata={"hint": "count"})
    assert privileged_prompt("{prompt}(answer: {answer})", p).prompt == "||+|=(answer: 3)"
    assert privileged_prompt("[{hint}] {prompt}", p).prompt == "[count] ||+|="
    chat = Prompt(messages=[{"role": "user", "content": "2+2?"}], answer="4", uid="c1")
    assert (
        privileged_prompt("{prompt} The answer is {answer}.", chat).messages[-1]["content"]
        == "2+2? The answer is 4."
    )
    with pytest.raises(ValueError, match=r"field 'solution'.*uid='a1'.*prompt='\|\|\+\|='"):
        privileged_prompt("{prompt} {solution}", p)


def test_privileged_view_keeps_completion_tokens_aligned(student):
    tok = student.tokenizer
    exp = _exp(tok, [(ADD[0], "3"), (REV[0], "cba")])
    view = teacher_view("{prompt}(answer: {answer})", exp, tok)
    assert torch.equal(view.completion_ids, exp.completion_ids)
    assert torch.equal(view.attention_mask[:, view.prompt_len :], exp.attention_mask[:, exp.prompt_len :])
    assert tok.decode(view.input_ids[1][view.attention_mask[1].bool()]) == "rev abc:(answer: cba)cba"
    with pytest.raises(ValueError, match="field 'solution'"):
        teacher_view("{solution}", exp, tok)


def test_full_vocab_loss_with_other_tokenizer_suggests_sampled(student, tmp_path):
    from lit_rl.learners.distill import DistillModule

    bpe = build_tiny_model(tmp_path / "bpe", seed=3, **{**TINY, "tokenizer": "bpe", "vocab_size": 300})
    router = TeacherRouter({"addition": str(bpe)})
    mod = DistillModule(model=student.model_path, losses={"topk_reverse_kl": 1.0})
    exp = _exp(mod.tokenizer, [(ADD[0], "3")])
    with pytest.raises(ValueError, match="different|differ.*reverse_kl_sampled"):
        router.on_experience(None, mod, exp)
    with pytest.raises(ValueError, match="reverse_kl_sampled"):
        router.teacher_logits(mod, exp, "reverse_kl_full")


def test_cross_tokenizer_sampled_scoring_sums_to_the_teacher_sequence_logprob(student, tmp_path):
    """With a different tokenizer the teacher re-tokenises the completion text; per-student-token log-probs are
    sums over teacher tokens, so a row's total equals the teacher's log-prob of the whole completion text."""
    bpe = build_tiny_model(tmp_path / "bpe", seed=3, **{**TINY, "tokenizer": "bpe", "vocab_size": 300})
    router = TeacherRouter({"reverse": str(bpe)})
    rows = [(REV[0], "cba"), (Prompt(prompt="rev abcab:", answer="bacba", domain="reverse"), "bacba")]
    exp = _exp(student.tokenizer, rows)
    router.on_experience(None, student, exp)
    tmodel, ttok = load_causal_lm(str(bpe)).eval(), load_tokenizer(str(bpe))
    for i, (p, c) in enumerate(rows):
        t = _exp(ttok, [(p, c)])
        want = token_logprobs(student.forward_logits(t, model=tmodel), t.completion_ids)[t.loss_mask].sum()
        got = exp.teacher_logprobs[i][exp.loss_mask[i]]
        assert got.sum().item() == pytest.approx(want.item(), rel=1e-5)
        assert torch.all(got <= 0) and torch.isfinite(got).all()


def _byte_spans(tok, ids):
    """Cumulative UTF-8 byte end of each byte-level BPE token, read from its byte-alphabet symbols."""
    # the byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 are shifted past 255
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    to_byte = {chr(b): b for b in kept} | {chr(256 + n): b for n, b in enumerate(shifted)}
    ends, n = [], 0
    for sym in tok.convert_ids_to_tokens(ids):
        n += len(sym)  # one alphabet symbol per byte
        assert all(c in to_byte for c in sym), sym
        ends.append(n)
    return ends


def test_cross_tokenizer_multibyte_characters_split_across_byte_level_tokens(tmp_path):
    """Student and teacher are byte-level BPEs with different merges; the completion holds é, 中, 文 and an emoji.
    The student (default ASCII corpus) spells each as 2-4 byte tokens; the teacher merges some whole and splits
    others differently (文 = 2+1 bytes, 😀 = 2+1+1). The teacher must score the true text, each row's sum is its
    log-prob of that text, and every teacher token's log-prob lands on the student token holding the last byte
    of the teacher token's last character (computed here independently, from UTF-8 byte offsets)."""
    from lit_rl.models.tiny import build_tokenizer

    sdir = build_tiny_model(tmp_path / "student", seed=0, **{**TINY, "tokenizer": "bpe", "vocab_size": 300})
    tdir = build_tiny_model(tmp_path / "teacher", seed=3, **{**TINY, "tokenizer": "bpe", "vocab_size": 300})
    student = PolicyModule(model=str(sdir))
    ttok = build_tokenizer("bpe", corpus=["a中b 文c 😀d é", "x中 y文 z😀 é"] * 50, vocab_size=266)
    tmodel = load_causal_lm(str(tdir)).eval()
    assert len(ttok) <= tmodel.config.vocab_size
    router = TeacherRouter({"reverse": Teacher(model=tmodel, tokenizer=ttok)})
    texts = ["héllo 中文 ok 😀!", "é😀中"]
    rows = [(Prompt(prompt="say:", domain="reverse"), t) for t in texts]
    exp = _exp(student.tokenizer, rows)
    stok = student.tokenizer
    for i, text in enumerate(texts):  # non-vacuous: the student splits characters across tokens
        ids = exp.completion_ids[i][exp.loss_mask[i]].tolist()
        assert stok.decode(ids) == text and any("\ufffd" in stok.decode([t]) for t in ids)
    router.on_experience(None, student, exp)
    for i, (p, text) in enumerate(rows):
        t = _exp(ttok, [(p, text)])
        t_lp = token_logprobs(student.forward_logits(t, model=tmodel), t.completion_ids)[t.loss_mask]  # (Ct,)
        s_ids = exp.completion_ids[i][exp.loss_mask[i]].tolist()
        s_bytes = _byte_spans(stok, s_ids)
        enc = ttok(text, add_special_tokens=False, return_offsets_mapping=True)
        assert enc["input_ids"] == t.completion_ids[0][t.loss_mask[0]].tolist()
        want = torch.zeros(len(s_ids), dtype=torch.float64)
        for k, (_, e) in enumerate(enc["offset_mapping"]):
            last_byte = len(text[:e].encode()) - 1  # last byte of the teacher token's last character
            owner = next(j for j, end in enumerate(s_bytes) if last_byte < end)
            want[owner] += float(t_lp[k])
        got = exp.teacher_logprobs[i][exp.loss_mask[i]].double()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert float(got.sum()) == pytest.approx(float(t_lp.double().sum()), rel=1e-5)
        # the student tokens inside a split character get nothing: their character is not complete yet
        assert (
            got[torch.tensor(["\ufffd" in stok.decode(s_ids[: j + 1])[-1:] for j in range(len(s_ids))])] == 0
        ).all()


def test_char_ends_windows_and_the_exact_fallback(tmp_path):
    """``char_ends`` by hand on a byte-level BPE, and with a decoder that edits text across tokens (strips a
    leading space, as SentencePiece decoders do) where the windowed pass cannot be trusted and every prefix is
    decoded instead."""
    from lit_rl.callbacks.teacher_inputs import char_ends
    from lit_rl.models.tiny import build_tokenizer

    tok = build_tokenizer("bpe", vocab_size=300)  # ASCII corpus: é = 2 byte tokens, 中 = 3
    ids = tok("aé 中", add_special_tokens=False)["input_ids"]
    assert len(ids) == 7  # a, é(2), space, 中(3)
    assert char_ends(tok, ids, "aé 中") == [1, 1, 2, 3, 3, 3, 4]

    class Strip:  # decode(" x") == "x": not concatenative at the window start
        def decode(self, ids):
            return tok.decode(ids).lstrip(" ")

        def batch_decode(self, seqs):
            return [self.decode(s) for s in seqs]

    ids = tok(" a 中 b", add_special_tokens=False)["input_ids"]  # "Ġa", "Ġ", 中 as 3 bytes, "Ġb"
    text = Strip().decode(ids)
    assert text == "a 中 b" and len(ids) == 6
    # prefixes decode to "a", "a ", "a �", "a �", "a 中", "a 中 b" (the lone "Ġ" window decodes to "", which
    # derails the windowed pass; the final check catches it)
    assert char_ends(Strip(), ids, text) == [1, 2, 2, 2, 3, 5]
