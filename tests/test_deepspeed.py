"""DeepSpeedZeROStrategy's own checks and the ZeRO-3 weight gather, with real DeepSpeed objects (CPU, gloo).

The 2-process training parity of ZeRO-2/3 with one process is in tests/test_distributed.py. Skipped when the
optional ``deepspeed`` extra is not installed.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip(
    "deepspeed", reason="deepspeed is not installed (optional extra: pip install -e .[deepspeed])"
)

from lit_rl.strategies import DeepSpeedZeROStrategy


def test_stage_must_be_2_or_3():
    with pytest.raises(ValueError, match=r"DeepSpeedZeROStrategy.stage must be 2 or 3, got 1"):
        DeepSpeedZeROStrategy(stage=1)


def test_managed_gradient_accumulation_is_refused():
    with pytest.raises(ValueError, match="managed_gradient_accumulation must be false"):
        DeepSpeedZeROStrategy(
            config={"zero_optimization": {"stage": 2}, "managed_gradient_accumulation": True}
        )


def test_stage_3_turns_overlap_comm_off_and_accumulation_unmanaged():
    # DeepSpeed refuses unmanaged accumulation with overlap_comm under ZeRO-3; ZeRO-2 keeps the overlap
    z3, z2 = DeepSpeedZeROStrategy(stage=3).config, DeepSpeedZeROStrategy(stage=2).config
    assert (z3["zero_optimization"]["overlap_comm"], z2["zero_optimization"]["overlap_comm"]) == (False, True)
    assert z3["managed_gradient_accumulation"] is False and z2["managed_gradient_accumulation"] is False


class _Module:  # what the strategy reads of a LightningModule when it finalises the config
    def __init__(self, max_grad_norm):
        self.hparams = {"max_grad_norm": max_grad_norm}
        self.trainer = type("T", (), {"accumulate_grad_batches": 1, "gradient_clip_val": None})()


def test_max_grad_norm_becomes_gradient_clipping():
    s = DeepSpeedZeROStrategy(
        stage=2, config={"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}
    )
    s._lightning_module = _Module(0.25)
    s._format_batch_size_and_grad_accum_config()
    assert s.config["gradient_clipping"] == 0.25


def test_conflicting_gradient_clipping_is_an_error():
    s = DeepSpeedZeROStrategy(stage=2, config={"zero_optimization": {"stage": 2}, "gradient_clipping": 0.5})
    s._lightning_module = _Module(1.0)
    with pytest.raises(
        ValueError, match=r"gradient_clipping=0.5 disagrees with the module's max_grad_norm=1.0"
    ):
        s._format_batch_size_and_grad_accum_config()


def test_hf_engine_keeps_a_private_copy_only_under_zero3():
    from lit_rl.rollout.engine import _is_model_parallel

    assert _is_model_parallel(DeepSpeedZeROStrategy(stage=3))
    assert not _is_model_parallel(DeepSpeedZeROStrategy(stage=2))


_CHILD = textwrap.dedent("""
    import sys
    import torch
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from lit_rl.models.loading import load_causal_lm, merged_state_items

    def zero3(model):
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
            optimizer=torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3),
            config={"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
                    "zero_optimization": {"stage": 3}})
        return engine

    deepspeed.init_distributed("gloo")
    model = load_causal_lm(sys.argv[1])
    want = {k: v.detach().clone() for k, v in model.state_dict().items()}
    zero3(model)
    params = list(model.parameters())
    # partitioned: outside a gather no parameter holds its full data
    assert all(p.numel() == 0 for p in params), [p.shape for p in params]
    got, peak = {}, 0
    for name, t in merged_state_items(model):
        # each parameter is released before the next is gathered: none is resident while one is consumed
        peak = max(peak, sum(p.ds_status == ZeroParamStatus.AVAILABLE for p in params))
        got[name] = t
    assert peak == 0, peak
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    bad = [k for k in want if not torch.equal(got[k], want[k])]
    assert not bad, bad
    assert all(p.numel() == 0 for p in params)

    import copy
    lora = load_causal_lm(sys.argv[1], lora={"r": 2, "lora_alpha": 4})
    for n, p in lora.named_parameters():
        if "lora_B" in n:  # PEFT starts B at 0, where any merge looks right
            p.data.normal_()
    want = copy.deepcopy(lora).merge_and_unload().state_dict()  # PEFT's own merge, before partitioning
    zero3(lora)
    got = dict(merged_state_items(lora))  # LoRA under ZeRO-3: gathered, then merged from the tensors
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6, msg=k)
    print("CHILD OK", len(got))
""")


def test_zero3_weight_sync_gathers_each_parameter_exactly(tmp_path, tiny_model_dir):
    """A real ZeRO-3 engine (1 process, gloo): the partitioned model's ``merged_state_items`` equals the weights
    before partitioning, bit for bit, gathering one parameter at a time; a LoRA policy under ZeRO-3 merges to
    PEFT's own merge of it before partitioning (within 1e-6)."""
    from lit_rl.rollout._server_launch import free_port

    port = str(free_port())
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    p = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0 and "CHILD OK" in p.stdout, (p.stdout + p.stderr)[-4000:]
