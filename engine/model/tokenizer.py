"""The embedded model's tokenizer: one token per byte, built locally so nothing is fetched from a hub.

It is Qwen's own tokenizer class (`Qwen2Tokenizer`: byte-level BPE, Qwen's special tokens and chat markup) with
a vocabulary of the 256 bytes and no merges. So every printable ASCII character (digit, operator, letter,
punctuation, space, newline) is one token whose id is its byte value ('A' is 65), any other character becomes its
UTF-8 bytes and decodes back exactly (nothing is ever unknown), and the vocabulary stays tiny (263 ids).

Why Qwen's class and not a hand-built one: `AutoTokenizer` loads every `qwen2` model directory with
`Qwen2Tokenizer`, which rebuilds its pipeline from the vocabulary and merges alone. A tokenizer of another kind
would be silently replaced by a byte-level one on load; this one reloads exactly as it was built, and prompt
building, EOS handling and answer extraction are one code path for this model and a real Qwen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # EOS of a chat turn, as in Qwen's instruct models
THINK_TOKENS = ("<think>", "</think>")
ANSWER_TOKENS = ("<answer>", "</answer>")

# Control tokens: dropped by `decode(..., skip_special_tokens=True)`.
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
# Markup the model writes as part of its text: single ids, but kept when special tokens are skipped,
# so answer extraction sees them (Qwen3 treats <think> the same way).
MARKUP_TOKENS = THINK_TOKENS + ANSWER_TOKENS

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def byte_symbols() -> dict[int, str]:
    """Byte -> the printable character byte-level BPE writes for it (GPT-2's table: ' ' -> 'Ġ', '\\n' -> 'Ċ').

    Printable ASCII and most of Latin-1 stand for themselves; the other 68 bytes take the code points from 256 up.
    """
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {byte: chr(byte) for byte in kept}
    shifted = (byte for byte in range(256) if byte not in symbols)
    for offset, byte in enumerate(shifted):
        symbols[byte] = chr(256 + offset)
    return symbols


def vocabulary(base: Mapping[str, int] | None = None) -> dict[str, int]:
    """Token -> id: `base` (default: the 256 bytes at their own values), then the special and markup tokens after
    it (from 256 on for the bytes).

    Fixed by construction: changing it changes what every saved model's ids mean.
    """
    vocab = dict(base) if base is not None else {symbol: byte for byte, symbol in byte_symbols().items()}
    for token in SPECIAL_TOKENS + MARKUP_TOKENS:
        vocab[token] = len(vocab)
    return vocab


def build_tokenizer(
    base: Mapping[str, int] | None = None, merges: Sequence[tuple[str, str]] = ()
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with Qwen's special tokens and chat template: by default the byte tokenizer (no
    merges; the same ids on every call), else `base`'s ids with `merges` (a trained one, `engine.model.bpe`)."""
    tokenizer = Qwen2Tokenizer(
        vocab=vocabulary(base),
        merges=list(merges),  # type: ignore[arg-type]  # pairs, as tokenizers' BPE takes them
        unk_token=None,  # type: ignore[arg-type]  # every byte is in the vocabulary; typed str, accepts None
        bos_token=None,  # as Qwen: nothing is prepended
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,  # it would turn "a ." into "a." on decode
    )
    # The tokens are in the vocabulary already, so adding them keeps their ids; it makes the tokenizer match
    # them as whole strings before splitting the rest into bytes.
    tokenizer.add_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS], special_tokens=True
    )
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in MARKUP_TOKENS])
    return tokenizer
