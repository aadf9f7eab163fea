"""The state ``PolicyModule``'s parts share, declared once for the type checker.

``PolicyModule`` is assembled from parts that are mixins (``PolicyAssembly``, ``OldLogprobs``, ``PolicyForward``,
``MicroLoss``, ``HeldoutValidation``): each reads the module's settings and model, Lightning's ``trainer`` /
``device`` / ``log`` and the other parts' methods. Each part subclasses ``PolicyHost``, which declares that
state: for mypy it is a ``LightningModule`` with the attributes and methods below, so every use in a part is
checked, and so is every definition of them in ``PolicyModule`` and its parts (an override must match the
declaration); at run time it is plain ``object``, so the parts' bases and the module's method resolution order
are what they would be without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning.pytorch as L
    from torch import Tensor

    from lit_rl.core.processed import LogitProcessing
    from lit_rl.data.experience import Experience
    from lit_rl.learners.config import PolicyConfig
    from lit_rl.learners.protocols import LossTerm

    class PolicyHost(L.LightningModule):
        """What the parts read from one another (defined by ``PolicyModule`` or by one of the parts)."""

        config: PolicyConfig  # the frozen settings (DistillModule: a DistillConfig)
        model: Any  # the causal LM (transformers, or a PEFT wrapper); None until configure_model builds it
        tokenizer: Any  # its transformers tokenizer, None until then
        iteration: int  # RL iterations done
        _last_metrics: dict[str, float]  # the last micro-batch's loss metrics

        @property
        def temperature(self) -> float:
            """The rollout sampler's temperature (log-probs are of softmax(z / T))."""
            ...

        @property
        def processing(self) -> LogitProcessing:
            """The rollout sampler's logit processing (``core.processed``)."""
            ...

        @property
        def own_loss_terms(self) -> list[LossTerm]: ...

        def active_loss_terms(self) -> list[LossTerm]: ...

        def skips_zero_advantage_rows(self) -> bool: ...

        @staticmethod
        def _zero_weight_micro(mb: Experience) -> Experience: ...

        def _all_reduce_sum(self, t: Tensor, op: str = "sum") -> Tensor: ...

        def forward_outputs(
            self,
            micro: Experience,
            model: Any = None,
            hidden: bool = False,
            cache: bool = False,
            materialize: bool = False,
        ) -> dict[str, Any]: ...

        def logprobs_of(
            self, micro: Experience, out: dict[str, Any], entropy: bool = False, sampler: bool = True
        ) -> tuple[Tensor, Tensor | None, Tensor | None]: ...

        def old_logprobs_pair(self, micro: Experience) -> tuple[Tensor, Tensor | None]: ...

        def kl_policy_logprobs(self, exp: Experience) -> Tensor: ...

else:
    PolicyHost = object
