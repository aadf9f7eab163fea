"""TeacherRouter / Teacher components: routing by domain (spy teachers), lazy loading, fallback, privileged
templates, tokenizer checks and cross-tokenizer scoring. No training here."""
from __future__ import annotations

import pytest
import torch

from _distill_helpers import Spy
from lit_rl.callbacks.teachers import Teacher, TeacherRouter, _pack, privileged_prompt, teacher_view
from lit_rl.core.logprobs import token_logprobs
from lit_rl.data.prompts import Prompt, render_prompt
from lit_rl.models.loading import load_causal_lm, load_tokenizer
from lit_rl.models.tiny import build_tiny_model
from lit_rl.modules.policy import PolicyModule

TINY = {"layers": 2, "hidden": 64, "heads": 2, "tokenizer": "char"}


@pytest.fixture(scope="module")
def two_teachers(tmp_path_factory):
    d = tmp_path_factory.mktemp("teachers")
    return [build_tiny_model(d / name, seed=s, **TINY) for name, s in (("add", 11), ("rev", 12))]


@pytest.fixture(scope="module")
def student(tiny_model_dir):
    return PolicyModule(model=str(tiny_model_dir))


def _exp(tok, rows):
    """rows: (prompt record, completion text) → Experience in ``tok``'s tokens."""
    p_ids = [render_prompt(p, tok) for p, _ in rows]
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] for _, c in rows]
    return _pack(tok, p_ids, c_ids, [p for p, _ in rows], torch.zeros(len(rows)))


ADD = [Prompt(prompt="||+|=", answer="3", domain="addition", uid="a1"),
       Prompt(prompt="|+|=", answer="2", domain="addition", uid="a2")]
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
        torch.testing.assert_close(exp.teacher_logprobs[i:i + 1][row.loss_mask], want[row.loss_mask].float())
    assert router.rows_total == {"addition": 3, "reverse": 2}


def test_unknown_domain_error_and_fallback(student, two_teachers):
    tok = student.tokenizer
    exp = _exp(tok, [(Prompt(prompt="x", answer="y", domain="poetry"), "y")])
    router = TeacherRouter({"addition": str(two_teachers[0]), "reverse": str(two_teachers[1])})
    with pytest.raises(ValueError, match=r"no teacher for domain 'poetry'; known domains: \['addition', 'reverse'\]"):
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


def test_missing_teacher_path_fails_at_construction(tmp_path):
    with pytest.raises(FileNotFoundError, match="Teacher.source"):
        TeacherRouter({"addition": str(tmp_path / "nope")})


def test_privileged_template_fields_and_missing_field():
    p = Prompt(prompt="||+|=", answer="3", domain="addition", uid="a1", metadata={"hint": "count"})
    assert privileged_prompt("{prompt}(answer: {answer})", p).prompt == "||+|=(answer: 3)"
    assert privileged_prompt("[{hint}] {prompt}", p).prompt == "[count] ||+|="
    chat = Prompt(messages=[{"role": "user", "content": "2+2?"}], answer="4", uid="c1")
    assert privileged_prompt("{prompt} The answer is {answer}.", chat).messages[-1]["content"] == \
        "2+2? The answer is 4."
    with pytest.raises(ValueError, match=r"field 'solution'.*uid='a1'.*prompt='\|\|\+\|='"):
        privileged_prompt("{prompt} {solution}", p)


def test_privileged_view_keeps_completion_tokens_aligned(student):
    tok = student.tokenizer
    exp = _exp(tok, [(ADD[0], "3"), (REV[0], "cba")])
    view = teacher_view(student, Teacher("self", template="{prompt}(answer: {answer})"), exp, tok)
    assert torch.equal(view.completion_ids, exp.completion_ids)
    assert torch.equal(view.attention_mask[:, view.prompt_len:], exp.attention_mask[:, exp.prompt_len:])
    assert tok.decode(view.input_ids[1][view.attention_mask[1].bool()]) == "rev abc:(answer: cba)cba"
    with pytest.raises(ValueError, match="field 'solution'"):
        teacher_view(student, Teacher("self", template="{solution}"), exp, tok)


def test_full_vocab_loss_with_other_tokenizer_suggests_sampled(student, tmp_path):
    from lit_rl.modules.distill import DistillModule

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
