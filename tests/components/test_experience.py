import pytest
import torch

from lit_rl.data.experience import Experience


def make_exp(B=6, P=3, C=4):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (B, P + C), generator=g)
    att = torch.ones(B, P + C, dtype=torch.long)
    lm = torch.ones(B, C, dtype=torch.bool)
    lm[0, 2:] = False
    att[0, P + 2 :] = 0
    return Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=lm,
        prompt_len=P,
        group_ids=torch.arange(B) // 2,
        rewards=torch.arange(B, dtype=torch.float32),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
        rollout_logprobs=torch.randn(B, C, generator=g),
        texts=[f"t{i}" for i in range(B)],
        reward_components={"exact": torch.arange(B, dtype=torch.float32)},
    )


def test_minibatches_visit_every_row_once_per_epoch():
    exp = make_exp(B=12)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):  # three "epochs"
        seen = []
        for mb in exp.minibatches(4, shuffle=True, generator=g):
            assert len(mb) == 4
            seen += mb.rewards.long().tolist()
            # row-aligned fields stay aligned after shuffling
            assert [f"t{int(r)}" for r in mb.rewards] == mb.texts
            assert torch.equal(mb.reward_components["exact"], mb.rewards)
        assert sorted(seen) == list(range(12))


def test_micro_batches_partition_in_order():
    exp = make_exp(B=6)
    parts = [m.rewards.tolist() for m in exp.micro_batches(4)]
    assert parts == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
    assert [len(m) for m in exp.micro_batches(None)] == [6]


def test_shape_validation_names_field():
    exp = make_exp()
    with pytest.raises(ValueError, match="rollout_logprobs"):
        Experience(**{**exp.__dict__, "rollout_logprobs": torch.zeros(6, 9)})
    with pytest.raises(TypeError, match="loss_mask"):
        Experience(**{**exp.__dict__, "loss_mask": exp.loss_mask.long()})


def test_trim_drops_all_padding_columns():
    exp = make_exp(B=2, P=3, C=4)
    exp.attention_mask[:, 3 + 2 :] = 0
    exp.loss_mask[:, 2:] = False
    t = exp.trim()
    assert t.completion_len == 2 and t.input_ids.shape == (2, 5)
    assert torch.equal(t.rollout_logprobs, exp.rollout_logprobs[:, :2])


def test_row_extents_and_trim_of_the_prompt_padding():
    exp = make_exp(B=3, P=4, C=4)
    exp.attention_mask[0, :2] = 0  # row 0: prompt of 2 tokens, completion of 2 (make_exp cuts it)
    exp.attention_mask[1, :1] = 0  # row 1: prompt of 3 tokens, completion of 4
    exp.attention_mask[2, :2] = 0  # row 2: prompt of 2, completion of 3 with a hole (an observation gap)
    exp.attention_mask[2, 4 + 1] = 0
    exp.attention_mask[2, 4 + 3 :] = 0
    exp.loss_mask[2, 3:] = False
    assert exp.row_extents() == ([2, 3, 2], [2, 4, 3])
    sub = exp.select([0, 2]).trim(prompt=True)  # widest prompt 2, longest completion 3
    assert sub.prompt_len == 2 and sub.input_ids.shape == (2, 5) and sub.completion_len == 3
    assert torch.equal(sub.input_ids, exp.input_ids[[0, 2], 2:7])
    assert torch.equal(sub.rollout_logprobs, exp.rollout_logprobs[[0, 2], :3])
    assert exp.trim(prompt=True).prompt_len == 3  # row 1 needs 3 prompt columns
    assert exp.select([1]).trim().prompt_len == 4  # without prompt=True the prompt side stays


def test_render_prompt_chat_and_text(tiny_model_dir):
    from transformers import AutoTokenizer

    from lit_rl.data.prompts import Prompt, render_prompt

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = render_prompt(Prompt(messages=[{"role": "user", "content": "1+1"}]), tok)
    assert tok.decode(ids) == "<|im_start|>user\n1+1<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(render_prompt(Prompt(prompt="2+2="), tok)) == "2+2="
