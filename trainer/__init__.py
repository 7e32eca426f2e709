"""The trainer role: the pool's coordinator, GRPO training on accepted rollouts, and the `prime-train` CLI.

It also makes the embedded default model (`prime-train init-model`). It imports from `node` and `ledger`,
never the other way round.
"""
