"""The smallest complete rollout engine: a plain transformers forward per token (no KV cache), the example of
docs/architecture.md ("Adding an engine"). It samples from ``process_logits`` with one torch generator per
prompt, seeded by the shared per-request seed cursor, so it passes the whole engine conformance suite."""

from __future__ import annotations

import copy

import torch

from lit_rl.rollout.base import EngineBase, RequestSeeds
from lit_rl.rollout.engine import Completion
from lit_rl.rollout.sampling import end_of_completion, process_logits


class FakeEngine(RequestSeeds, EngineBase):
    def __init__(self, max_model_len: int = 128):
        self.max_model_len, self.model, self.policy_version = max_model_len, None, 0

    def bind(self, module, rollout=None) -> None:
        self.tokenizer, self.model = module.tokenizer, copy.deepcopy(module.model).eval()

    def limits(self):
        return {"max_model_len": self.max_model_len}

    def update_weights(self, named_tensors) -> None:
        params = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, t in named_tensors:
                params[name].copy_(t)  # KeyError for a name the model does not have
        self.policy_version += 1

    @torch.no_grad()
    def generate(self, prompt_ids, n, sampling):
        out = []
        for p in prompt_ids:
            if len(p) + sampling.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt of {len(p)} tokens + max_new_tokens over max_model_len={self.max_model_len}"
                )
            g = torch.Generator().manual_seed(self._next_seed(sampling, n))
            group = []
            for _ in range(n):
                toks, lps = [], []
                for _ in range(sampling.max_new_tokens):
                    ids = torch.tensor([p + toks])
                    seen = torch.zeros(1, self.model.config.vocab_size, dtype=torch.bool)
                    seen[0, ids[0]] = True
                    x = process_logits(self.model(input_ids=ids).logits[:, -1].float(), seen, sampling)
                    lp = torch.log_softmax(x, -1)[0]
                    t = (
                        int(lp.argmax())
                        if sampling.greedy
                        else int(torch.multinomial(lp.exp(), 1, generator=g))
                    )
                    toks.append(t)
                    lps.append(float(lp[t]))
                    if t == self.tokenizer.eos_token_id:
                        break

                def decode(t):
                    return self.tokenizer.decode(t, skip_special_tokens=True)

                end, why = end_of_completion(toks, self.tokenizer.eos_token_id, decode, sampling.stops)
                group.append(Completion(toks[:end], lps[:end], why))
            out.append(group)
        return self._count(out)
