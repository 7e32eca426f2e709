"""Tasks: specs, problem sources, deterministic assignment, prompts, answer extraction and rewards.

Typical use, identical in a worker and a validator:

    spec = load_task_spec("configs/tasks/default.toml")
    source = open_source(spec)
    ids = assign_problem_ids(source.problem_ids(), pool_id, node, step, counter, n)
    problem = source.problem(ids[0])
    target = target_length_for(spec, problem.id, step)
    messages = build_messages(spec, problem, target)
    ... generate ...
    breakdown = score_completion(source, spec, problem, completion_text, len(output_tokens), target)
"""

from protocol.tasks.assignment import assign, assign_problem_ids
from protocol.tasks.errors import AssignmentError, PromptError, RewardError, TaskError, TaskSpecError, UnknownProblem
from protocol.tasks.prompts import build_messages, extract_answer, target_length_for
from protocol.tasks.rewards import RewardBreakdown, compute_reward, score_completion
from protocol.tasks.sources import Problem, TaskSource, open_source
from protocol.tasks.spec import TaskSpec, load_task_spec, spec_hash

__all__ = [
    "AssignmentError",
    "Problem",
    "PromptError",
    "RewardBreakdown",
    "RewardError",
    "TaskError",
    "TaskSource",
    "TaskSpec",
    "TaskSpecError",
    "UnknownProblem",
    "assign",
    "assign_problem_ids",
    "build_messages",
    "compute_reward",
    "extract_answer",
    "load_task_spec",
    "open_source",
    "score_completion",
    "spec_hash",
    "target_length_for",
]
