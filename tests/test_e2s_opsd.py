"""scripts/experts_to_student_opsd.py (why ``opsd`` collapses) on a tiny chat model: the teacher sequence it shows is
the hand-written ChatML prompt with the hint and the reply, its per-format signal equals log π_T − log π_S summed
by hand from plain forwards, and its alignment guard stops the run when the router scores other text than the
reference (a teacher template other than the script's)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from lit_rl.models.loading import load_causal_lm, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _script():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("e2s_opsd", ROOT / "scripts/experts_to_student_opsd.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _chatml(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


@torch.no_grad()
def _sum_logprobs(model, tok, prompt: str, reply: list[int], first: int, last: int) -> float:
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    lp = model(torch.tensor([ids + reply])).logits[0].double().log_softmax(-1)
    return sum(float(lp[len(ids) - 1 + t, reply[t]]) for t in range(first, last))


def _perturbed_ckpt(model, path: Path) -> Path:
    """A run's Lightning checkpoint (``state_dict`` with the module's ``model.`` prefix), weights moved."""
    g = torch.Generator().manual_seed(0)
    sd = {f"model.{k}": v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
    torch.save({"state_dict": sd}, path)
    return path


@pytest.mark.parametrize("frozen", [False, True])
def test_opsd_probe_by_hand(tiny_model_dir, tmp_path, frozen):
    """Without --frozen the teacher is the student's weights (the start here); with --frozen and a run's
    checkpoint the student is the checkpoint and the teacher the start."""
    s = _script()
    start = load_causal_lm(str(tiny_model_dir)).eval()
    tok = load_tokenizer(str(tiny_model_dir))
    argv = ["--model", str(tiny_model_dir), "--prompts", "1", "--sampled", "1", "--max-new-tokens", "3"]
    student = start
    if frozen:
        ckpt = _perturbed_ckpt(start, tmp_path / "run.ckpt")
        argv += ["--ckpt", str(ckpt), "--frozen"]
        student = load_causal_lm(str(tiny_model_dir)).eval()
        student.load_state_dict({k[6:]: v for k, v in torch.load(ckpt)["state_dict"].items()})
    report = s.main(argv + ["--json", str(tmp_path / "r.json")])
    # the first held-out addition prompt of the e2s table (chat_mixed, heldout 64): 22 + 13
    user = "What is 22 + 13? Reply with only the number."
    hinted = _chatml(user + " (The correct answer is 35.)")
    assert report["alignment"]["teacher_sequence"] == hinted + "35" + tok.eos_token
    assert report["alignment"]["max_abs_router_vs_reference"] < 1e-5
    for name, prefix in (("eq", "22 + 13 = "), ("the", "The answer is ")):
        reply = tok(prefix + "35", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        n = len(tok(prefix, add_special_tokens=False)["input_ids"])
        for part, (a, b) in (("format_tokens", (0, n)), ("answer_and_eos", (n, len(reply)))):
            want = _sum_logprobs(start, tok, hinted, reply, a, b) - _sum_logprobs(
                student, tok, _chatml(user), reply, a, b
            )
            assert report["formats"]["signal"][name][part] == pytest.approx(want, rel=1e-6, abs=1e-9)
    cells = report["sampled"]["cells"]
    assert sum(c["n"] for k, c in cells.items() if k.endswith("row sum")) == report["sampled"]["rows"] == 4
    assert json.loads((tmp_path / "r.json").read_text())["frozen"] is frozen


def test_opsd_probe_stops_when_the_teacher_scores_other_text(tiny_model_dir, monkeypatch):
    s = _script()
    load = s.load
    monkeypatch.setattr(
        s,
        "load",
        lambda model, ckpt, template, frozen: load(model, ckpt, "{prompt} (Answer: {answer}.)", frozen),
    )
    with pytest.raises(SystemExit, match="router's teacher log-probs differ from a plain forward"):
        s.main(["--model", str(tiny_model_dir), "--prompts", "1", "--sampled", "1", "--max-new-tokens", "2"])
