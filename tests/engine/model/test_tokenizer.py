"""The embedded model's tokenizer: byte-level ids, Qwen's special tokens and chat template, exact reload."""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

from engine.model.tokenizer import CHAT_TEMPLATE, build_tokenizer, byte_symbols

SPECIAL_IDS = {
    "<|endoftext|>": 256,
    "<|im_start|>": 257,
    "<|im_end|>": 258,
    "<think>": 259,
    "</think>": 260,
    "<answer>": 261,
    "</answer>": 262,
}


def test_every_printable_ascii_character_is_one_token_with_its_byte_value() -> None:
    tokenizer = build_tokenizer()
    for char in string.printable:
        assert tokenizer.encode(char) == [ord(char)], repr(char)


def test_ascii_text_round_trips_exactly() -> None:
    tokenizer = build_tokenizer()
    text = "Compute 12*(3+4) - 7/2 = ?\n  Answer:\t40.5 ; a , b . c 'quoted' \"double\" \r\nend  "
    ids = tokenizer.encode(text)
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_special_and_markup_tokens_are_single_pinned_ids() -> None:
    tokenizer = build_tokenizer()
    assert len(tokenizer) == 263
    for token, token_id in SPECIAL_IDS.items():
        assert tokenizer.encode(token) == [token_id], token
    assert tokenizer.eos_token_id == SPECIAL_IDS["<|im_end|>"]
    assert tokenizer.pad_token_id == SPECIAL_IDS["<|endoftext|>"]
    assert tokenizer.bos_token is None


def test_skipping_special_tokens_drops_chat_markup_but_keeps_think_and_answer() -> None:
    tokenizer = build_tokenizer()
    ids = tokenizer.encode("<|im_start|>assistant\n<think>2+2</think><answer>4</answer><|im_end|><|endoftext|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<think>2+2</think><answer>4</answer>"


def test_non_ascii_text_becomes_bytes_and_round_trips() -> None:
    tokenizer = build_tokenizer()
    text = "π ≈ 3.14, naïve 日本語 🙂"
    ids = tokenizer.encode(text)
    assert max(ids) < 256  # no unknown token: every character is its UTF-8 bytes
    assert len(ids) == len(text.encode())
    assert tokenizer.decode(ids) == text


def test_cut_utf8_sequence_decodes_to_replacement_character() -> None:
    tokenizer = build_tokenizer()
    first_byte = "日".encode()[0]
    assert tokenizer.decode([ord("a"), first_byte]) == "a\ufffd"


def test_vocabulary_is_identical_on_every_build() -> None:
    assert build_tokenizer().get_vocab() == build_tokenizer().get_vocab()


def test_byte_symbols_are_the_byte_level_alphabet() -> None:
    symbols = byte_symbols()
    assert sorted(symbols) == list(range(256))
    assert set(symbols.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert symbols[ord(" ")] == "Ġ"
    assert symbols[ord("\n")] == "Ċ"


def test_chat_template_writes_qwen_turns_and_generation_prompt() -> None:
    tokenizer = build_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert list(encoded["input_ids"]) == tokenizer.encode(text)
    no_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert isinstance(no_prompt, str)
    assert no_prompt.endswith("<|im_end|>\n")


def test_saved_tokenizer_reloads_identically_in_a_qwen2_model_directory(tmp_path: Path) -> None:
    """AutoTokenizer picks Qwen2Tokenizer for any qwen2 config; the reload must keep ids, template and tokens."""
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    reloaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "<|im_start|>user\nx = 3 * 4 ?<|im_end|>\n<think>é</think><answer>12</answer>\t<|endoftext|>"
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert reloaded.encode(text) == tokenizer.encode(text)
    assert reloaded.decode(reloaded.encode(text)) == text
    assert reloaded.chat_template == CHAT_TEMPLATE
    assert (reloaded.eos_token, reloaded.pad_token, reloaded.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
