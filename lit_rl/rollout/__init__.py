from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.engine import Completion, HFEngine, SamplingConfig

__all__ = [
    "AgentLoop",
    "CalculatorEnv",
    "Completion",
    "EngineBase",
    "Environment",
    "GuessEnv",
    "HFEngine",
    "OpenAIServer",
    "ProgramLoop",
    "RetryRepoEnv",
    "RolloutPipeline",
    "SamplingConfig",
    "Tool",
    "ToolEnv",
    "VLLMEngine",
    "VLLMServerEngine",
]

_LAZY = {
    "VLLMEngine": "lit_rl.rollout.vllm",
    "VLLMServerEngine": "lit_rl.rollout.server",
    "AgentLoop": "lit_rl.rollout.agent_loop",
    "Environment": "lit_rl.rollout.env",
    "RetryRepoEnv": "lit_rl.rollout.env",
    "Tool": "lit_rl.rollout.tools",
    "ToolEnv": "lit_rl.rollout.tool_env",
    "CalculatorEnv": "lit_rl.rollout.agent_envs",
    "GuessEnv": "lit_rl.rollout.agent_envs",
    "RolloutPipeline": "lit_rl.rollout.pipeline",
    "OpenAIServer": "lit_rl.rollout.openai_server",
    "ProgramLoop": "lit_rl.rollout.agent_program",
}


def __getattr__(name: str):
    # Lazy: vllm is optional, and the agent / environment modules pull in the sandboxed code rewards.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_rl.rollout' has no attribute {name!r}")
