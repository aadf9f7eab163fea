from lit_rl.callbacks.agent_plot import AgentCurvePlot
from lit_rl.callbacks.agent_program import AgentProgramRolloutCallback
from lit_rl.callbacks.agent_rollout import AgentEval, AgentRolloutCallback, ObservationLoss
from lit_rl.callbacks.curriculum import Curriculum
from lit_rl.callbacks.entropy import EntropyRegularization
from lit_rl.callbacks.eval import HeldoutEval, RewardCurvePlot
from lit_rl.callbacks.inspector import RolloutInspector
from lit_rl.callbacks.monitoring import RLHealthMonitor
from lit_rl.callbacks.progress import IterationProgressBar, ProgressLog, RichIterationProgressBar
from lit_rl.callbacks.reference_kl import ReferenceKL
from lit_rl.callbacks.rollout import RolloutCallback
from lit_rl.callbacks.save_hf import SaveHFModel
from lit_rl.callbacks.teachers import Teacher, TeacherRouter

__all__ = [
    "AgentCurvePlot",
    "AgentEval",
    "AgentProgramRolloutCallback",
    "AgentRolloutCallback",
    "Curriculum",
    "EntropyRegularization",
    "HeldoutEval",
    "IterationProgressBar",
    "ObservationLoss",
    "ProgressLog",
    "RLHealthMonitor",
    "ReferenceKL",
    "RewardCurvePlot",
    "RichIterationProgressBar",
    "RolloutCallback",
    "RolloutInspector",
    "SaveHFModel",
    "Teacher",
    "TeacherRouter",
]
