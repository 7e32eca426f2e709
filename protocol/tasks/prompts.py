"""Prompt building, target lengths for the thinking budget, and answer extraction.

Chat messages are built here and turned into tokens by the model's chat template, so the same spec works for the
tiny char-level model and a real Qwen. The user message is the question, then the answer format, then (with a
thinking budget) "Think for N tokens before answering.", one per line.

Answers are read from the LAST opening `<answer>` tag up to the first `</answer>` after it. A completion whose
last `<answer>` is never closed (cut at max_tokens, or EOS before the tag) has no answer: a half-written answer
must not earn partial credit ("<answer>4" for 42), and the model learns to close its tag.
"""

from __future__ import annotations

import hashlib

from protocol.tasks.errors import PromptError
from protocol.tasks.sources import Problem
from protocol.tasks.spec import ANSWER_CLOSE, ANSWER_OPEN, TaskSpec

TARGET_DOMAIN = b"prime-node/target-length/v1"
_I64 = 1 << 63


def budget_instruction(target_length: int) -> str:
    return f"Think for {target_length} tokens before answering."


def build_messages(spec: TaskSpec, problem: Problem, target_length: int | None) -> list[dict[str, str]]:
    """[system (when the spec has one), user]. `target_length` must be None iff the spec has no thinking budget,
    and otherwise one of its targets."""
    targets = spec.prompt.thinking_budget
    if (target_length is None) != (not targets) or (target_length is not None and target_length not in targets):
        allowed = "None (thinking budget off)" if not targets else f"one of {list(targets)}"
        raise PromptError(f"task {spec.name!r}: target_length must be {allowed}, got {target_length}")
    lines = [problem.question]
    if spec.prompt.answer_format:
        lines.append(spec.prompt.answer_format)
    if target_length is not None:
        lines.append(budget_instruction(target_length))
    messages = [{"role": "system", "content": spec.prompt.system}] if spec.prompt.system else []
    messages.append({"role": "user", "content": "\n".join(lines)})
    return messages


def target_length_for(spec: TaskSpec, problem_id: str, seed: int) -> int | None:
    """The target length for a prompt: a hash of (problem id, seed) picks one of the spec's targets.

    Every completion of a group shares one prompt, so callers pass a seed that is the same for the group and that
    a validator can recompute from the file (the rollout's policy step is the natural choice). None when the
    spec has no thinking budget.
    """
    targets = spec.prompt.thinking_budget
    if not targets:
        return None
    if not -_I64 <= seed < _I64:
        raise PromptError(f"seed must fit in int64, got {seed}")
    name = problem_id.encode("utf-8")
    digest = hashlib.sha256(
        TARGET_DOMAIN + len(name).to_bytes(4, "big") + name + seed.to_bytes(8, "big", signed=True)
    ).digest()
    return targets[int.from_bytes(digest, "big") % len(targets)]


def extract_answer(completion_text: str) -> str | None:
    """The stripped text inside the last `<answer>...</answer>`, or None when there is none or it is unclosed.

    Nested tags resolve to the innermost: "<answer>a<answer>b</answer></answer>" gives "b".
    """
    start = completion_text.rfind(ANSWER_OPEN)
    if start == -1:
        return None
    start += len(ANSWER_OPEN)
    end = completion_text.find(ANSWER_CLOSE, start)
    if end == -1:
        return None
    return completion_text[start:end].strip()
