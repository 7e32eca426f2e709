"""The memory estimate (engine.memory) on the tiny model and on a 1-layer model of the real shape, each term checked
against the arithmetic done here from config.json; the prompt budget against every prompt of the task; the refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.hostmemory import MIB, format_size
from engine.inference.select import Choice
from engine.memory import (
    SAMPLER_BYTES,
    TORCH_ENGINE_BYTES,
    Gate,
    MemoryShortfall,
    ModelFacts,
    Plan,
    prompt_budget,
    read_model_facts,
    validator_plan,
    worker_plan,
)
from engine.model.loading import load_tokenizer, parameter_count
from engine.model.shapes import QWEN25_05B
from engine.model.tiny import init_model
from protocol.plan import prompt_tokens
from protocol.tasks.prompts import build_messages
from protocol.tasks.sources import open_source
from protocol.tasks.spec import TaskSpec, load_task_spec

TASK = Path(__file__).resolve().parents[2] / "configs" / "tasks" / "default.toml"
SMALL_TASK = TASK.read_text().replace("size = 10_000", "size = 500")  # the same prompts, fewer of them
TORCH_CPU_F32 = Choice("torch", "cpu", "float32", "test")
TORCH_CPU_BF16 = Choice("torch", "cpu", "bfloat16", "test")


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> TaskSpec:
    path = tmp_path_factory.mktemp("task") / "small.toml"
    path.write_text(SMALL_TASK)
    return load_task_spec(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


@pytest.fixture(scope="module")
def real_1l(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2.5-0.5B's shape, 1 layer deep, in bfloat16 (about 10 s to build)."""
    shape = QWEN25_05B.with_layers(1)
    return init_model(tmp_path_factory.mktemp("real") / "q1", seed=0, shape=shape, specs=[load_task_spec(TASK)])


def terms(plan: Plan, memory: int = 0) -> dict[str, int]:
    return {term.name: term.bytes for term in plan.needs[memory].terms}


def test_the_facts_come_from_config_json_and_the_safetensors_headers(tiny: Path, real_1l: Path) -> None:
    for path in (tiny, real_1l):
        config = json.loads((path / "config.json").read_text())
        facts = read_model_facts(path)
        assert facts.parameters == parameter_count(path)
        assert (facts.layers, facts.kv_heads, facts.max_positions) == (
            config["num_hidden_layers"],
            config["num_key_value_heads"],
            config["max_position_embeddings"],
        )
        assert facts.head_dim == config["hidden_size"] // config["num_attention_heads"]
        assert facts.lm_head_rows == config["vocab_size"]  # tied: the embedding's rows
    real = read_model_facts(real_1l)
    # Qwen2.5-0.5B's embedding (151,936 x 896, tied to the head), one layer, the final norm
    embedding = 151_936 * 896
    attention = (896 * 896 + 896) + 2 * (128 * 896 + 128) + 896 * 896  # q, k, v (with biases), o
    layer = attention + 3 * 896 * 4864 + 2 * 896  # SwiGLU's three matrices, two norms
    assert real.parameters == embedding + layer + 896 == 151_047_936
    assert (real.layers, real.kv_heads, real.head_dim, real.lm_head_rows) == (1, 2, 64, 151_936)


def test_the_prompt_budget_bounds_every_prompt_of_the_task(tiny: Path, real_1l: Path, task: TaskSpec) -> None:
    source = open_source(task)
    for path in (tiny, real_1l):
        tokenizer = load_tokenizer(path)
        lengths = [
            len(prompt_tokens(tokenizer, build_messages(task, source.problem(i), None))) for i in source.problem_ids()
        ]
        budget = prompt_budget(task, source, tokenizer)
        assert budget >= max(lengths)
        if path == tiny:  # the byte tokenizer: one token per byte, so the bound is the longest prompt itself
            assert budget == max(lengths)
        else:  # the BPE merges bytes: the bound is loose, by the longest question's merges at most
            assert budget - max(lengths) <= max(len(source.problem(i).question.encode()) for i in source.problem_ids())


def test_a_workers_terms_on_the_tiny_model_are_the_arithmetic_of_its_config(tiny: Path) -> None:
    facts = read_model_facts(tiny)  # 6 layers, 2 key-value heads of 32, 263 rows, 1,216,512 parameters
    plan = worker_plan(facts, TORCH_CPU_F32, batch_size=64, file_rows=16, sequence_tokens=100, totals={"cpu": 1 << 34})
    sequences = 16  # batch_size 64, but a file of 16 rows decodes 16 at once
    assert terms(plan) == {
        "weights": 1_216_512 * 4,
        "KV cache": (2 * 6 * 2 * 32 * 4) * 100 * sequences,  # 3,072 bytes a token
        "logits": sequences * 263 * 4,
        "sampler": sequences * 263 * SAMPLER_BYTES,
        "engine": TORCH_ENGINE_BYTES,
    }
    assert plan.needs[0].memory == "cpu" and plan.knobs == ("batch_size (now 64)",)


def test_the_real_shapes_terms_in_bfloat16_for_a_worker_and_a_validator(real_1l: Path) -> None:
    facts = read_model_facts(real_1l)
    worker = worker_plan(
        facts, TORCH_CPU_BF16, batch_size=64, file_rows=64, sequence_tokens=100, totals={"cpu": 1 << 34}
    )
    assert terms(worker) == {
        "weights": 151_047_936 * 2,
        "KV cache": (2 * 1 * 2 * 64 * 2) * 100 * 64,  # 512 bytes a token in one layer
        "logits": 64 * 151_936 * (2 + 4),  # the head writes bfloat16, then the float32 copy
        "sampler": 64 * 151_936 * SAMPLER_BYTES,
        "engine": TORCH_ENGINE_BYTES,
    }
    validator = validator_plan(
        facts,
        dtype="bfloat16",
        device="cpu",
        prefill_batch_size=8,
        checkpoints_kept=3,
        sequence_tokens=100,
        max_tokens=64,
    )
    assert terms(validator) == {
        "weights of 3 steps": 3 * 151_047_936 * 2,
        "KV cache": 512 * 100 * 8,
        "logits": 8 * 64 * 151_936 * 6,  # every completion token of the prefill batch: 466 MB here
        "sampler": 64 * 151_936 * SAMPLER_BYTES,  # one row's completion at a time
        "recheck": 151_047_936 * 8,  # the float64 copy that rechecks a failing row before a slash
        "engine": TORCH_ENGINE_BYTES,
    }
    assert validator.knobs == ("prefill_batch_size (now 8) or checkpoints_kept (now 3)",)


def test_vllm_takes_its_share_and_refuses_when_the_share_cannot_hold_the_model(real_1l: Path) -> None:
    facts = read_model_facts(real_1l)
    gpu = 80 << 30
    plan = worker_plan(
        facts,
        Choice("vllm", "cuda", "bfloat16", "test"),
        batch_size=64,
        file_rows=64,
        sequence_tokens=100,
        totals={"cpu": 64 << 30, "cuda": gpu},
    )
    on_gpu, on_cpu = plan.needs
    assert (on_gpu.memory, on_cpu.memory) == ("cuda", "cpu")
    assert on_gpu.total == gpu // 2  # gpu_memory_utilization 0.5: vLLM takes half the GPU whatever the model needs
    kv = terms(plan)["KV cache"]
    # the batch of the pool's longest sequences: the worker starts vLLM with max_model_len 100 (the task's), not the
    # config's 32,768 positions, whose one sequence (512 x 32,768) it would otherwise have to hold
    assert kv == 512 * 6_400
    assert terms(plan, 1)["torch copy"] == 151_047_936 * 4  # the float32 copy that stays on the CPU
    small = worker_plan(
        facts,
        Choice("vllm", "cpu", "float32", "test"),
        batch_size=64,
        file_rows=64,
        sequence_tokens=100,
        totals={"cpu": 8 << 30},  # 0.1 of 8 GiB cannot hold two float32 copies of 604 MB, the KV cache and the rest
    )
    reserved = small.needs[0].reservation
    assert reserved is not None and reserved.bytes == int(0.1 * (8 << 30)) and not reserved.enough


def test_a_model_that_does_not_fit_is_refused_with_one_line_naming_both_numbers_and_the_fixes(
    tiny: Path, task: TaskSpec
) -> None:
    def plan(facts: ModelFacts, tokens: int) -> Plan:
        return worker_plan(facts, TORCH_CPU_F32, batch_size=64, file_rows=64, sequence_tokens=tokens, totals={})

    source = open_source(task)
    gate = Gate(task, source, plan, budget=64 * MIB)
    with pytest.raises(MemoryShortfall) as refused:
        gate.check(tiny)
    line = str(refused.value)
    tokens = prompt_budget(task, source, load_tokenizer(tiny)) + task.sampling.max_tokens
    kv = 3_072 * tokens * 64  # 2 x 6 layers x 2 heads x 32 x 4 bytes a token, 64 sequences
    need = 1_216_512 * 4 + kv + 64 * 263 * 4 + 64 * 263 * SAMPLER_BYTES + TORCH_ENGINE_BYTES
    assert line == (
        f"the model in {tiny} (1M parameters) needs {format_size(need)} of RAM to generate in float32 here (weights "
        f"5 MiB + KV cache {format_size(kv)} + logits 66 KiB + sampler 1 MiB + engine 256 MiB) and 64 MiB is free "
        "(--memory-budget): lower batch_size (now 64), use another device (--device), or work for a bfloat16 pool "
        "(half the weights)"
    )
    assert Gate(task, source, plan, budget=1 << 30).check(tiny)[0].ok  # 1 GiB holds it


def test_a_later_policy_of_the_shape_that_fitted_passes_and_another_shape_is_checked_again(
    tiny: Path, real_1l: Path, task: TaskSpec, tmp_path: Path
) -> None:
    def plan(facts: ModelFacts, tokens: int) -> Plan:
        return worker_plan(facts, TORCH_CPU_F32, batch_size=64, file_rows=64, sequence_tokens=tokens, totals={})

    gate = Gate(task, open_source(task), plan, budget=1 << 30)
    first = gate.check(tiny)
    next_step = init_model(tmp_path / "step_1", seed=1)  # the next policy: other weights, the same shape
    gate.budget = 1 * MIB  # what is free while the policy in use is still held says nothing about the swap
    assert gate.check(next_step) is first
    with pytest.raises(MemoryShortfall, match=r"\(151M parameters\) needs 1.4 GiB of RAM to generate in float32"):
        gate.check(real_1l)  # another shape: checked again
