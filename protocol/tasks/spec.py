"""Task specs: the TOML file that says which problems a pool trains on and how completions are scored.

A spec is parsed and validated once, at load, into frozen dataclasses; every later step (assignment, prompts,
scoring) reads only those. `spec_hash` binds a rollout file to the exact task it was scored with: it covers every
parsed field, the bytes of a referenced JSONL file and the ids of a problem list, but not where the files lie on disk.

Layout (see configs/tasks/default.toml):

    name = "basic-arithmetic"
    [source]              # type = "reasoning_gym" | "math_jsonl" | "code"; optional problems = "ids.txt"
    [prompt]              # system, answer_format, thinking_budget = false | [32, 64, 128]
    [reward]              # length_mode = "none" | "exact" | "max" | "clip", alpha, delta
    [sampling]            # temperature, top_p, max_tokens, dtype = "float32" | "bfloat16"
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from protocol.tasks.code_spec import CodeSourceSpec, parse_code_source
from protocol.tasks.errors import TaskSpecError
from protocol.tasks.fields import Fields, frozen_config, parse_problem_rows
from protocol.tasks.problem_list import ProblemListSpec, parse_problem_list
from protocol.tasks.reasoning_gym_dataset import ProblemIds, config_error

SPEC_FORMAT = "prime-node/task-spec/v1"
LengthMode = Literal["none", "exact", "max", "clip"]
LENGTH_MODES: tuple[LengthMode, ...] = ("none", "exact", "max", "clip")
ConfigScalar = bool | int | float | str
ConfigValue = ConfigScalar | tuple[ConfigScalar, ...]
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
MAX_TARGET_LENGTH = 1 << 20
SAMPLING_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class ReasoningGymSourceSpec:
    """A procedural reasoning-gym dataset: problem i is `create_dataset(dataset, seed, size, **config)[i]`."""

    dataset: str
    seed: int
    size: int
    config: tuple[tuple[str, ConfigValue], ...] = ()  # sorted (key, value); arrays frozen to tuples
    type: Literal["reasoning_gym"] = "reasoning_gym"

    def config_kwargs(self) -> dict[str, Any]:
        """The config as keyword arguments for reasoning-gym (tuples back to lists, as its configs expect)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.config}


@dataclass(frozen=True)
class MathProblemRow:
    """One line of a math JSONL file."""

    id: str
    question: str
    answer: str


@dataclass(frozen=True)
class MathJsonlSourceSpec:
    """Math problems from a JSONL file, checked with math-verify; the rows are read once, at load."""

    path: Path  # resolved; not part of the hash (a validator keeps the file elsewhere)
    problems: tuple[MathProblemRow, ...]
    content_sha256: bytes  # of the file's bytes, as read
    type: Literal["math_jsonl"] = "math_jsonl"


SourceSpec: TypeAlias = "ReasoningGymSourceSpec | MathJsonlSourceSpec | CodeSourceSpec"


@dataclass(frozen=True)
class PromptSpec:
    """How a problem becomes chat messages. An empty `thinking_budget` turns the budget off."""

    system: str
    answer_format: str  # appended to the question; must show the <answer>...</answer> format
    thinking_budget: tuple[int, ...] = ()  # target lengths in output tokens


@dataclass(frozen=True)
class RewardSpec:
    """The length term of the reward (see `protocol.tasks.rewards.compute_reward` for the formulas)."""

    length_mode: LengthMode = "none"
    alpha: float = 0.0  # >= 0; per-token weight (exact, max)
    delta: float = 0.0  # in [0, 1]; offset of the max mode


@dataclass(frozen=True)
class SamplingSpec:
    """Sampling parameters workers must use; the validator checks a file's claimed ones against these."""

    max_tokens: int  # >= 1
    temperature: float = 1.0  # >= 0; 0 is greedy
    top_p: float = 1.0  # in (0, 1]
    # The precision every worker generates in and every validator recomputes in (SAMPLING_DTYPES). The proof
    # thresholds are calibrated for one precision on both sides: a worker that generated in bfloat16 for a float32
    # pool would fail honest checks, so the pool decides, not each machine (docs/inference.md).
    dtype: str = "float32"


@dataclass(frozen=True)
class TaskSpec:
    name: str
    source: SourceSpec
    prompt: PromptSpec
    reward: RewardSpec
    sampling: SamplingSpec
    path: Path = field(compare=False)  # the TOML file it was loaded from; not part of the hash
    problem_list: ProblemListSpec | None = None  # `[source] problems`: the only problems the task uses, in order


def load_task_spec(path: str | Path) -> TaskSpec:
    """Read and validate a task spec; any problem raises `TaskSpecError` naming the file and the field."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskSpecError(path, "file", "not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TaskSpecError(path, "file", f"not readable TOML ({exc})") from None
    top = Fields(path, "", raw)
    name = top.text("name", nonempty=True)
    source, problem_list = _parse_source(path, top.table("source"))
    prompt = _parse_prompt(Fields(path, "prompt", top.table("prompt")))
    reward = _parse_reward(Fields(path, "reward", top.table("reward", required=False)))
    sampling = _parse_sampling(Fields(path, "sampling", top.table("sampling")))
    top.done()
    _check_consistency(path, prompt, reward, sampling)
    return TaskSpec(
        name=name,
        source=source,
        prompt=prompt,
        reward=reward,
        sampling=sampling,
        path=path.resolve(),
        problem_list=problem_list,
    )


def _parse_source(path: Path, table: dict[str, Any]) -> tuple[SourceSpec, ProblemListSpec | None]:
    fields = Fields(path, "source", table)
    kind = fields.text("type")
    listed = fields.text("problems", nonempty=True) if "problems" in table else None
    source: SourceSpec
    if kind == "reasoning_gym":
        source = ReasoningGymSourceSpec(
            dataset=fields.text("dataset", nonempty=True),
            seed=fields.integer("seed", minimum=0),
            size=fields.integer("size", minimum=1, maximum=1 << 40),
            config=frozen_config(path, fields.table("config", required=False)),
        )
        refused = config_error(source.dataset, source.seed, source.size, source.config_kwargs())
        if refused is not None:
            raise TaskSpecError(path, *refused)
    elif kind == "math_jsonl":
        jsonl = (path.parent / fields.text("path", nonempty=True)).resolve()
        try:
            data = jsonl.read_bytes()
        except OSError as exc:
            raise TaskSpecError(path, "source.path", f"cannot read {jsonl} ({exc.strerror})") from None
        problems = _parse_math_jsonl(jsonl, data)
        source = MathJsonlSourceSpec(path=jsonl, problems=problems, content_sha256=hashlib.sha256(data).digest())
    elif kind == "code":
        source = parse_code_source(path, fields)
    else:
        raise TaskSpecError(path, "source.type", f"must be 'reasoning_gym', 'math_jsonl' or 'code', got {kind!r}")
    fields.done()
    if listed is None:
        return source, None
    return source, parse_problem_list(path, listed, _id_check(source))


def _parse_math_jsonl(path: Path, data: bytes) -> tuple[MathProblemRow, ...]:
    """Rows of `{"id": str, "question": str, "answer": str}`; blank lines are skipped, ids must be unique."""

    def parse_row(row: Fields, where: str) -> MathProblemRow:
        problem = MathProblemRow(
            id=row.text("id", nonempty=True),
            question=row.text("question", nonempty=True),
            answer=row.text("answer", nonempty=True),
        )
        row.done()
        return problem

    return parse_problem_rows(path, data, parse_row)


def _parse_prompt(fields: Fields) -> PromptSpec:
    system = fields.text("system", default="")
    answer_format = fields.text("answer_format", default="")
    budget = fields.raw("thinking_budget", default=False)
    if budget is False:
        targets: tuple[int, ...] = ()
    elif isinstance(budget, list) and budget and all(_is_int(t) and 1 <= t <= MAX_TARGET_LENGTH for t in budget):
        targets = tuple(budget)
    else:
        fields.fail("thinking_budget", f"must be false or a non-empty list of lengths in [1, {MAX_TARGET_LENGTH}]")
    fields.done()
    if ANSWER_OPEN not in system + answer_format or ANSWER_CLOSE not in system + answer_format:
        fields.fail("answer_format", f"system or answer_format must show the {ANSWER_OPEN}...{ANSWER_CLOSE} format")
    return PromptSpec(system=system, answer_format=answer_format, thinking_budget=targets)


def _parse_reward(fields: Fields) -> RewardSpec:
    mode = fields.text("length_mode", default="none")
    if mode not in LENGTH_MODES:
        fields.fail("length_mode", f"must be one of {', '.join(LENGTH_MODES)}, got {mode!r}")
    reward = RewardSpec(
        length_mode=mode,  # narrowed by the LENGTH_MODES check above
        alpha=fields.number("alpha", default=0.0, minimum=0.0),
        delta=fields.number("delta", default=0.0, minimum=0.0, maximum=1.0),
    )
    fields.done()
    if reward.length_mode in ("exact", "max") and reward.alpha == 0.0:
        fields.fail("alpha", f"must be > 0 with length_mode {reward.length_mode!r}")
    return reward


def _parse_sampling(fields: Fields) -> SamplingSpec:
    sampling = SamplingSpec(
        max_tokens=fields.integer("max_tokens", minimum=1, maximum=MAX_TARGET_LENGTH),
        temperature=fields.number("temperature", default=1.0, minimum=0.0, maximum=100.0),
        top_p=fields.number("top_p", default=1.0, minimum=0.0, maximum=1.0),
        dtype=fields.text("dtype", default="float32"),
    )
    fields.done()
    if sampling.dtype not in SAMPLING_DTYPES:
        fields.fail("dtype", f"must be one of {', '.join(SAMPLING_DTYPES)}, got {sampling.dtype!r}")
    if sampling.top_p == 0.0:
        fields.fail("top_p", "must be > 0")
    return sampling


def _check_consistency(path: Path, prompt: PromptSpec, reward: RewardSpec, sampling: SamplingSpec) -> None:
    """Cross-table rules: a length reward needs targets, and no target may exceed the token limit."""
    if reward.length_mode != "none" and not prompt.thinking_budget:
        raise TaskSpecError(path, "reward.length_mode", f"{reward.length_mode!r} needs prompt.thinking_budget targets")
    if prompt.thinking_budget and max(prompt.thinking_budget) > sampling.max_tokens:
        raise TaskSpecError(
            path,
            "prompt.thinking_budget",
            f"target {max(prompt.thinking_budget)} exceeds sampling.max_tokens {sampling.max_tokens}",
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def canonical_spec(spec: TaskSpec) -> dict[str, Any]:
    """The hashed form: every parsed field; a JSONL file by its content hash, never by its path.

    A problem list adds `source.problems_sha256` (of its ids in order); a spec without one hashes as it always did.
    """
    source: dict[str, Any]
    if isinstance(spec.source, ReasoningGymSourceSpec):
        source = {
            "type": spec.source.type,
            "dataset": spec.source.dataset,
            "seed": spec.source.seed,
            "size": spec.source.size,
            "config": {k: list(v) if isinstance(v, tuple) else v for k, v in spec.source.config},
        }
    else:
        source = {"type": spec.source.type, "content_sha256": spec.source.content_sha256.hex()}
    if spec.problem_list is not None:
        source["problems_sha256"] = spec.problem_list.sha256.hex()
    return {
        "format": SPEC_FORMAT,
        "name": spec.name,
        "source": source,
        "prompt": {
            "system": spec.prompt.system,
            "answer_format": spec.prompt.answer_format,
            "thinking_budget": list(spec.prompt.thinking_budget),
        },
        "reward": {"length_mode": spec.reward.length_mode, "alpha": spec.reward.alpha, "delta": spec.reward.delta},
        "sampling": {
            "temperature": spec.sampling.temperature,
            "top_p": spec.sampling.top_p,
            "max_tokens": spec.sampling.max_tokens,
            # float32, the only precision before there was a choice, is left out: those specs keep their hash
            **({"dtype": spec.sampling.dtype} if spec.sampling.dtype != "float32" else {}),
        },
    }


def spec_hash(spec: TaskSpec) -> bytes:
    """sha256 of the canonical JSON of the spec (sorted keys, no spaces, UTF-8): equal iff the task is equal."""
    text = json.dumps(canonical_spec(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).digest()


def _id_check(source: SourceSpec) -> Callable[[str], bool]:
    """Whether the source has a problem id, decided from the spec alone (no dataset is built)."""
    if isinstance(source, ReasoningGymSourceSpec):
        ids = ProblemIds(source.dataset, source.size)
        return lambda problem_id: ids.index_of(problem_id) is not None
    rows = {row.id for row in source.problems}
    return rows.__contains__
