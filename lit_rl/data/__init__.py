from lit_rl.data.datamodule import PromptDataModule
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import Prompt, PromptBatch, load_jsonl
from lit_rl.data.tasks import TASKS, get_task

__all__ = ["TASKS", "Experience", "Prompt", "PromptBatch", "PromptDataModule", "get_task", "load_jsonl"]
