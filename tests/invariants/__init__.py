"""On-policy invariants over the settings space (issue 36 item 3).

An outside review found lit_rl "exact at the defaults, wrong one setting away" (top-k / top-p made the
reward-form KL read 3.03 per token where policy = reference; the mismatch correction shrank or zeroed the
gradient at the on-policy point). This package checks known values at the **on-policy point** — engine weights
= policy = reference = old policy — for every pair of settings a user can combine, so such a bug has nowhere
to hide.

Known values (``_checks``): PPO ratio 1 and no clipping; every KL 0 (``ReferenceKL`` reward and loss forms,
k1/k2/k3); every importance weight 1 with every token kept (tis / mis, token / sequence); the engine/trainer
mismatch KL 0; finite loss parts and gradients; an engine with its own weights holds exactly the policy's;
and, where the conformance suite has the family's reference, each optimizer step's gradient equals the float64
documented objective (``_reference``, reusing ``tests/conformance/_conformance.py``).

Settings (``_grid.DIMENSIONS``): sampling (temperature, top_p, top_k, min_p, repetition_penalty, stop),
mismatch correction, KL, advantage + loss family, engine (HFEngine shared / copy), padding_free,
micro_batch_tokens, LoRA, gradient checkpointing, ppo_epochs (with minibatch_size). Two pairwise covering
arrays (allpairspy): FULL over all of them, EXACT with truncation off; combinations refused by design are
filtered out and asserted refused.

How one combination runs (``_harness``): the tiny model (2 layers, hidden 64), 2 prompts x group 2, 6 new
tokens, one iteration through a real Lightning Trainer with the real RolloutCallback + HFEngine, float64
(``precision="64-true"``); an optimizer that records gradients and never moves the weights keeps every
optimizer step on-policy.

Files:
- ``test_on_policy.py``  the fast suite (default run): both arrays, float64;
- ``test_float32.py``    8 rows in float32 against measured bounds;
- ``test_bfloat16.py``   2 top-p rows in bfloat16, where the kept set ends inside tied groups (issue 53);
- ``test_refused.py``    refused combinations;
- ``test_slow_strategies.py``  DDP, FSDP2, ZeRO-2/3 (``slow``);
- ``test_slow_vllm.py``  VLLMEngine (``slow``, ``vllm``).

Rows with top_p < 1, top_k > 0, min_p > 0 or repetition_penalty != 1 check the truncated-sampling rule (ratios
compare the sampler's distribution with itself, KL the full softmax on both sides; issue 36). The table of
rows and results: docs/invariants.md.
Run ``pytest tests/invariants -s`` to print the arrays.
"""
