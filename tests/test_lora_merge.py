"""``models.loading.lora_merged_state``: the merge the sharded (FSDP2 / ZeRO-3) LoRA paths use, from plain tensors,
equals PEFT's own ``merge_and_unload`` in float64, name for name, on a real tiny model with every linear adapted
(lora_B randomised: PEFT initialises it to 0, which would make any merge look right)."""

import copy

import pytest
import torch


@pytest.mark.parametrize("lora", [{"r": 4, "lora_alpha": 8}, {"r": 2, "lora_alpha": 16, "use_rslora": True}])
def test_merge_from_tensors_equals_peft_merge(tiny_model_dir, lora):
    from lit_rl.models.loading import load_causal_lm, lora_merged_state

    torch.manual_seed(0)
    model = load_causal_lm(str(tiny_model_dir), "float32", lora).double()
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_()
    want = copy.deepcopy(model).merge_and_unload().state_dict()  # PEFT's merge, on a copy
    got = lora_merged_state(model, {n: t.detach() for n, t in model.state_dict().items()})
    assert got.keys() == want.keys()
    base = dict(model.get_base_model().state_dict())
    moved = 0
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=0, atol=1e-12, msg=n)
        moved += not torch.equal(got[n], base.get(n.replace(".weight", ".base_layer.weight"), got[n]))
    assert moved > 10  # the adapted linears changed
