from lit_rl.rollout.engine import Completion, HFEngine, RolloutEngine, SamplingConfig

__all__ = ["RolloutEngine", "HFEngine", "SamplingConfig", "Completion", "VLLMEngine", "AgentLoop",
           "AgentRolloutCallback", "ObservationLoss", "Environment", "RetryRepoEnv"]

_LAZY = {"VLLMEngine": "lit_rl.rollout.vllm", "AgentLoop": "lit_rl.rollout.agent",
         "AgentRolloutCallback": "lit_rl.rollout.agent", "ObservationLoss": "lit_rl.rollout.agent",
         "Environment": "lit_rl.rollout.env", "RetryRepoEnv": "lit_rl.rollout.env"}


def __getattr__(name: str):
    # Lazy: vllm is optional and agent.py imports the callbacks package (which imports this one).
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_rl.rollout' has no attribute {name!r}")
