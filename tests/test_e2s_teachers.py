"""Teachers refused at setup, before any rollout, with the reason: a checkpoint that cannot be read (missing,
no config, no weights) and a tokenizer the student's losses cannot use (another vocabulary under a
full-distribution loss; the same vocabulary with another eos). Tiny models, no training."""

from __future__ import annotations

import shutil

import lightning as L
import pytest

from lit_rl.callbacks import RolloutCallback
from lit_rl.callbacks.teachers import Teacher, TeacherRouter
from lit_rl.data.datamodule import PromptDataModule
from lit_rl.learners.distill import DistillModule
from lit_rl.models.loading import load_tokenizer
from lit_rl.models.tiny import build_tiny_model
from lit_rl.rewards import ExactAnswerReward
from tests._binding import bind_sampling

TINY = {"layers": 1, "hidden": 32, "heads": 2}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    d = tmp_path_factory.mktemp("e2s_teachers")
    char = build_tiny_model(d / "char", seed=1, tokenizer="char", **TINY)
    bpe = build_tiny_model(d / "bpe", seed=2, tokenizer="bpe", vocab_size=300, **TINY)
    return d, char, bpe


def _setup(student: str, router: TeacherRouter, losses=None) -> DistillModule:
    mod = DistillModule(model=student, losses=losses or {"reverse_kl_sampled": 1.0})
    router.setup(None, mod, "fit")  # what Lightning does first: the callbacks' setup (self_frozen snapshots)
    bind_sampling(mod, teacher_router=router)  # RolloutCallback.setup's binding: the router for the module
    mod.setup("fit")
    return mod


def test_a_missing_teacher_path_names_its_domain_and_path(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"TeacherRouter\.teachers\.multiplication='.*nope'.*does not exist"
    ):
        TeacherRouter({"addition": "self", "multiplication": str(tmp_path / "nope")})


def test_a_directory_that_is_not_a_readable_model_is_refused_at_setup(dirs):
    d, char, _ = dirs
    broken = d / "broken_config"
    shutil.copytree(char, broken, dirs_exist_ok=True)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(
        ValueError,
        match=r"^TeacherRouter\.teachers\.addition \(.*broken_config\): cannot be loaded, its config",
    ):
        _setup(str(char), TeacherRouter({"addition": str(broken)}))

    no_weights = d / "no_weights"
    shutil.copytree(char, no_weights, dirs_exist_ok=True)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(
        ValueError,
        match=r"teachers\.compare \(.*no_weights\): cannot be loaded, the directory "
        r"holds no weights \(model\.safetensors",
    ):
        _setup(str(char), TeacherRouter({"addition": str(char), "compare": str(no_weights)}))


def test_another_vocabulary_is_refused_for_full_distribution_losses_only(dirs):
    _, char, bpe = dirs
    with pytest.raises(ValueError) as err:
        _setup(str(char), TeacherRouter({"addition": str(bpe)}), {"reverse_kl_full": 1.0})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(
        f"TeacherRouter.teachers.addition ({bpe}): its tokenizer differs"
    )
    assert "vocabularies of 300 vs the student's 101 tokens" in msg and "'reverse_kl_full'" in msg
    assert "Use losses: {reverse_kl_sampled: 1.0}" in msg
    router = TeacherRouter({"addition": str(bpe)})
    _setup(str(char), router)  # the sampled reverse KL re-tokenises the student's text: accepted
    assert router.teachers["addition"].tokenizer is not None and not router.teachers["addition"].loaded


def test_same_vocabulary_with_another_eos_is_refused(dirs):
    d, char, _ = dirs
    other_eos = d / "other_eos"
    shutil.copytree(char, other_eos, dirs_exist_ok=True)
    tok = load_tokenizer(str(char))
    tok.eos_token = "<|im_end|>"  # a chat-tuned copy whose tokenizer ends turns with another token
    tok.save_pretrained(other_eos)
    with pytest.raises(
        ValueError,
        match=r"teachers\.addition \(.*other_eos\): same vocabulary as the student but "
        r"eos token '<\|im_end\|>' \(id \d+\) vs the student's '<\|endoftext\|>' \(id 1\).*save the "
        "student's tokenizer into the teacher's directory",
    ):
        _setup(str(char), TeacherRouter({"addition": str(other_eos)}))
    # an in-memory teacher with its own tokenizer is checked the same way; self teachers need no check
    from lit_rl.models.loading import load_causal_lm

    mem = Teacher(model=load_causal_lm(str(char)), tokenizer=tok)
    with pytest.raises(ValueError, match="same vocabulary as the student but eos token"):
        _setup(str(char), TeacherRouter({"addition": "self", "compare": mem}))


def test_the_refusal_comes_before_any_rollout(dirs, tmp_path):
    """Through Lightning's fit: the engine never generates (no sanity check, no training batch)."""
    _, char, bpe = dirs
    calls = []

    class Recording(RolloutCallback):
        def on_train_batch_start(self, *a, **k):  # the first rollout would start here
            calls.append("rollout")
            return super().on_train_batch_start(*a, **k)

    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[
            Recording(rewards=[ExactAnswerReward()], group_size=2),
            TeacherRouter({"addition": str(bpe)}),
        ],
    )
    mod = DistillModule(model=str(char), losses={"topk_reverse_kl": 1.0})
    with pytest.raises(ValueError, match=r"teachers\.addition .*'topk_reverse_kl' compares full"):
        trainer.fit(mod, datamodule=PromptDataModule(task="addition", batch_size=2))
    assert calls == []
