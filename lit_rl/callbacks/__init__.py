from lit_rl.callbacks.eval import HeldoutEval, RewardCurvePlot, SaveHFModel
from lit_rl.callbacks.rollout import RolloutCallback

__all__ = ["RolloutCallback", "HeldoutEval", "RewardCurvePlot", "SaveHFModel"]
