"""Strategy presets. `FSDP2Strategy`: Lightning's ModelParallelStrategy as pure data parallelism (FSDP2).
`DeepSpeedZeROStrategy`: Lightning's DeepSpeedStrategy (ZeRO-2/3) on GPUs and on CPU processes."""

from __future__ import annotations

import argparse
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

from lightning.pytorch.accelerators.cuda import CUDAAccelerator
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    ModelParallelStrategy,
    ParallelStrategy,
)

from lit_rl.checkpoint import remove_path, side_path, swap_in


class SideDirectorySave(ParallelStrategy):
    """Checkpoint directories written whole or not at all (mixed into the FSDP2 and DeepSpeed strategies).

    Every rank writes its part into ``.<name>.partial`` next to the target; after a barrier rank 0 swaps it in
    (``checkpoint.swap_in``). A job killed during the writing keeps its previous checkpoint, which resumes
    exactly; before, the directory was overwritten in place and a kill left one that mixed two iterations and
    loaded without error (tests/test_sharded_save_resume.py, kill inside a save)."""

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(filepath):  # remote storage: the strategy's own save
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        final = Path(self.broadcast(str(filepath)))
        partial = side_path(final, "partial")
        if self.is_global_zero:
            remove_path(partial)  # left by a job killed while writing it
        self.barrier("lit_rl_save_begin")
        super().save_checkpoint(checkpoint, partial, storage_options)
        self.barrier("lit_rl_save_written")
        if self.is_global_zero:
            swap_in(partial, final)
        self.barrier("lit_rl_save_swapped")


class FSDP2Strategy(SideDirectorySave, ModelParallelStrategy):
    """Every process is a data-parallel FSDP2 shard (``PolicyModule.configure_model`` applies ``fully_shard``).

    ModelParallelStrategy's ``"auto"`` sizes mean data_parallel = nodes and tensor_parallel = processes per
    node, which would turn the ranks of a node into a tensor-parallel group. RL policies here are sharded
    with FSDP2 only, so the data-parallel size is the whole world and tensor parallelism is 1 (fixed: the
    signature leaves both out so a config cannot set them inconsistently).
    """

    def __init__(
        self,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = timedelta(seconds=1800),
    ):
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


class DeepSpeedZeROStrategy(SideDirectorySave, DeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy for ZeRO stage 2 or 3, on CUDA GPUs *and* on CPU processes (gloo).

    What it changes, and why:

    * Lightning refuses any accelerator but CUDA in ``setup_environment``; DeepSpeed itself has a CPU
      accelerator whose collectives go through torch.distributed (gloo when oneCCL is absent). On a CPU
      trainer this strategy selects that accelerator and skips the refusal.
    * ``managed_gradient_accumulation: false``: PolicyModule accumulates a *variable* number of micro-batches
      into each optimizer step (its losses are already divided by the minibatch's global denominators), so
      ``engine.step()`` is the accumulation boundary and ``engine.backward`` must not divide by a fixed
      ``gradient_accumulation_steps``.
    * The module's ``max_grad_norm`` becomes DeepSpeed's ``gradient_clipping``: under ZeRO the gradients live
      in the engine's partitions (``p.grad`` is None on the ranks), so only the engine can compute the
      global norm, clip, and skip a step whose norm is not finite (PolicyModule reads the result back).
    * ZeRO-3 with unmanaged accumulation needs ``overlap_comm: false`` (a DeepSpeed restriction).
    """

    def __init__(
        self,
        stage: int = 2,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        config: dict[str, Any] | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = timedelta(seconds=1800),
        logging_level: int = logging.WARNING,
    ):
        if stage not in (2, 3):
            raise ValueError(f"DeepSpeedZeROStrategy.stage must be 2 or 3, got {stage!r}")
        super().__init__(
            stage=stage,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            overlap_comm=stage == 2,
            config=config,
            process_group_backend=process_group_backend,
            timeout=timeout,
            logging_level=logging_level,
        )
        assert self.config is not None  # DeepSpeedStrategy builds one from the arguments when none is given
        self.config.setdefault("managed_gradient_accumulation", False)
        if self.config["managed_gradient_accumulation"]:
            raise ValueError(
                "DeepSpeedZeROStrategy: config.managed_gradient_accumulation must be false "
                "(PolicyModule's optimizer step is the accumulation boundary)"
            )

    def setup_environment(self) -> None:
        if not isinstance(self.accelerator, CUDAAccelerator):
            from deepspeed.accelerator import get_accelerator, set_accelerator

            if get_accelerator().device_name() != "cpu":  # a GPU machine asked to train on CPU
                from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

                set_accelerator(CPU_Accelerator())
            DDPStrategy.setup_environment(self)  # what DeepSpeedStrategy does, less its CUDA-only check
            return
        super().setup_environment()

    def setup_distributed(self) -> None:
        if isinstance(self.accelerator, CUDAAccelerator):
            return super().setup_distributed()
        # CPU devices carry no index, so Lightning's "device index = local rank" check cannot apply
        import deepspeed.ops
        from lightning.fabric.utilities.seed import reset_seed

        reset_seed()
        self.set_world_ranks()
        # DeepSpeed would JIT-compile a shared-memory all-reduce (C++, ~1 min, needs a compiler) that only its
        # tensor-parallel *inference* all-reduce uses; training collectives go through torch.distributed (gloo).
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        self._init_deepspeed_distributed()

    def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
        if isinstance(self.accelerator, CUDAAccelerator):
            return super()._setup_model_and_optimizer(model, optimizer, lr_scheduler)
        import deepspeed

        # Lightning passes the root device's index, which a CPU device lacks (None): DeepSpeed would then
        # fall back to a 1-process world. The local rank is what it needs.
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank),
            config=self.config,
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return engine, ds_optimizer

    def _format_batch_size_and_grad_accum_config(self) -> None:
        # Runs once when the DeepSpeed config is finalised (first for ZeRO-3's zero.Init around configure_model,
        # otherwise in setup): the module's clipping threshold becomes the engine's.
        clip = getattr(self.lightning_module, "hparams", {}).get("max_grad_norm")
        if clip is not None:
            assert self.config is not None  # set in __init__
            have = self.config.get("gradient_clipping")
            if have is not None and float(have) != float(clip):
                raise ValueError(
                    f"DeepSpeed config gradient_clipping={have} disagrees with the module's "
                    f"max_grad_norm={clip}: set only max_grad_norm"
                )
            self.config["gradient_clipping"] = float(clip)
        super()._format_batch_size_and_grad_accum_config()


# ---------------------------------------------- DeepSpeed helpers used by PolicyModule's optimizer step
def deepspeed_engine(module):
    """The DeepSpeed engine training ``module``, or None under any other strategy (or before setup)."""
    trainer = module._trainer
    if trainer is None or not isinstance(trainer.strategy, DeepSpeedStrategy):
        return None
    return trainer.strategy.deepspeed_engine


def uncount_optimizer_step(trainer) -> None:
    """Take back the trainer step Lightning counted for an optimizer step DeepSpeed skipped (non-finite norm).

    On the other strategies a skipped step never calls ``opt.step()``, so it is not a ``global_step`` (nor a
    ``max_steps`` unit); under DeepSpeed the skip is only known after ``opt.step()`` ran, and Lightning's manual
    optimization loop has counted it by then. Counting it would shift every later step-based schedule
    (max_steps, weight-sync and checkpoint intervals) against a DDP/FSDP run of the same config.
    """
    progress = trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
    for tracker in (progress.total, progress.current):
        tracker.ready -= 1
        tracker.completed -= 1
