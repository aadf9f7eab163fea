from lit_rl.rollout.engine import Completion, HFEngine, RolloutEngine, SamplingConfig

__all__ = ["RolloutEngine", "HFEngine", "SamplingConfig", "Completion"]
