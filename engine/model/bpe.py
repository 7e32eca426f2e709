"""A byte-level BPE tokenizer trained here, on the tasks' own text, for the real-shaped model (`engine.model.shapes`).

Real pools run Qwen, whose tokenizer is byte-level BPE: a few hundred thousand merges over the 256 bytes, Qwen's
pre-tokenizer (a regex split, then bytes as printable symbols), Qwen's special tokens and chat template, and fewer
ids than the embedding has rows. Nothing can be downloaded here, so this trains the same kind of tokenizer with
`tokenizers`, on the text the pool's prompts and answers are made of: every problem of the given task specs as the
chat prompt a worker builds (`protocol.tasks.prompts.build_messages`) and its reference answer. The result is a
`Qwen2Tokenizer` (the class `AutoTokenizer` loads every qwen2 directory with), built from its vocabulary and merges
alone, so it reloads exactly as trained. The same texts and size train the same tokenizer, id for id.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterable, Iterator, Sequence

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from engine.model.tokenizer import MARKUP_TOKENS, SPECIAL_TOKENS, build_tokenizer
from protocol.tasks.prompts import build_messages
from protocol.tasks.sources import open_source
from protocol.tasks.spec import TaskSpec


class BpeTrainingError(ValueError):
    """The texts cannot train a tokenizer of the size asked for (none given, or a size below the byte alphabet)."""


def task_texts(specs: Sequence[TaskSpec], *, per_task: int | None = None) -> Iterator[str]:
    """The chat prompt and reference answer of every problem of each spec (its first `per_task` when given)."""
    for spec in specs:
        source = open_source(spec)
        targets = spec.prompt.thinking_budget
        for problem_id in list(source.problem_ids())[:per_task]:
            problem = source.problem(problem_id)
            for message in build_messages(spec, problem, targets[0] if targets else None):
                yield message["content"]
            yield problem.answer


# reasoning-gym's generators left out: too slow to sample here (seconds to tens of seconds for 50 problems), or,
# `composite`, a mixture of the others that needs them named
LEFT_OUT = frozenset(
    {"composite", "futoshiki", "intermediate_integration", "knight_swap", "puzzle24", "sokoban", "zebra_puzzles"}
)


def reasoning_texts(*, per_dataset: int = 50, seed: int = 0) -> Iterator[str]:
    """The questions and answers of `per_dataset` problems of every reasoning-gym dataset (the procedural tasks
    pools train on), in name order: English, arithmetic, puzzles and code-like text enough for thousands of merges,
    where one narrow task alone (the default's two-term sums) supports a few hundred."""
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    for name in sorted(set(DATASETS) - LEFT_OUT):
        with contextlib.redirect_stdout(io.StringIO()):  # some generators print progress dots
            entries = [
                (str(e["question"]), str(e["answer"]))
                for e in reasoning_gym.create_dataset(name, size=per_dataset, seed=seed)
            ]
        for question, answer in entries:
            yield question
            yield answer


def train_bpe(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of at most `vocab_size` ids (Qwen's special and markup tokens among them, after
    the merges) trained on `texts`, with Qwen's normaliser, pre-tokenizer and chat template."""
    reserved = len(SPECIAL_TOKENS) + len(MARKUP_TOKENS)
    if vocab_size < 256 + reserved:
        raise BpeTrainingError(f"a BPE vocabulary needs the 256 bytes and {reserved} special tokens: {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - reserved,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    seen = 0

    def counted() -> Iterator[str]:
        nonlocal seen
        for text in texts:
            seen += 1
            yield text

    tokenizer.train_from_iterator(counted(), trainer)
    if not seen:
        raise BpeTrainingError("no texts to train a tokenizer on")
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(pair) if isinstance(pair, list) else tuple(pair.split(" ")) for pair in model["merges"]]
    vocab = {token: int(index) for token, index in model["vocab"].items()}
    return build_tokenizer(vocab, merges)
