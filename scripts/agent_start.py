"""Where an agent environment starts: an untrained checkpoint's held-out success, greedy and sampled.

Runs ``n`` held-out episodes of a task through ``AgentLoop`` with in-process vLLM (the agent recipes' engine)
at each temperature and prints success, tool calls per episode, the valid-call rate and a few episodes, e.g.:

    python scripts/agent_start.py --model runs/smollm2 --env lit_rl.rollout.lookup_env.LookupEnv \
        --task agent_lookup --env-args '{"demonstrations": 1}' --max-turns 4 --max-new-tokens 40
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from types import SimpleNamespace


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--env", required=True, help="class path of the environment (a ToolEnv)")
    ap.add_argument("--env-args", default="{}", help="its keyword arguments as JSON")
    ap.add_argument("--task", required=True)
    ap.add_argument("--task-args", default="{}")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--show", type=int, default=3, help="episodes printed per temperature")
    ap.add_argument("--hf", action="store_true", help="HFEngine instead of vLLM")
    a = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rl.data.tasks import get_task
    from lit_rl.rollout.agent_loop import AgentLoop, episode_metrics
    from lit_rl.rollout.engine import HFEngine, SamplingConfig

    mod, _, cls = a.env.rpartition(".")
    env_cls = getattr(importlib.import_module(mod), cls)
    kwargs = json.loads(a.env_args)
    _, held = get_task(a.task, **json.loads(a.task_args))
    held = held[: a.n]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    module = SimpleNamespace(
        model=model, tokenizer=AutoTokenizer.from_pretrained(a.model), model_path=a.model
    )
    if a.hf:
        engine = HFEngine()
    else:
        from lit_rl.rollout.vllm import VLLMEngine

        engine = VLLMEngine(
            kv_cache_memory_bytes=268435456, max_model_len=1024, llm_kwargs={"enable_chunked_prefill": False}
        )
    engine.bind(module)
    loop = AgentLoop(lambda: env_cls(**kwargs), engine, max_turns=a.max_turns, max_context_tokens=1024)
    out = {}
    for t in a.temperatures:
        t0 = time.perf_counter()
        eps = [
            g[0] for g in loop.run(held, 1, SamplingConfig(temperature=t, max_new_tokens=a.max_new_tokens))
        ]
        m = episode_metrics(eps)
        row = {
            "success": sum(e.total_reward >= 1.0 for e in eps) / len(eps),
            "calls_per_episode": m.get("tools/calls_per_episode", 0.0),
            "valid_call_rate": m.get("tools/valid_call_rate", float("nan")),
            "turns_mean": sum(len(e.turns) for e in eps) / len(eps),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        out[t] = row
        print(f"temperature {t}: {json.dumps(row)}")
        for e in eps[: a.show]:
            for k, turn in enumerate(e.turns):
                print(f"  [{k}] action: {turn.action_text!r}\n      obs: {turn.obs_text[:120]!r}")
            print(f"  reward {e.total_reward}")
    engine.close()
    return out


if __name__ == "__main__":
    main()
