"""Loading a model directory in Hugging Face layout, its hash, and the one-line errors of a bad directory."""

from __future__ import annotations

import hashlib
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from core.errors import NodeError
from engine.model.forward import forward_hidden
from engine.model.loading import ModelLoadError, load_model, model_hash_of, parameter_count
from engine.model.shapes import ModelShape
from engine.model.tiny import init_model


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("loading") / "tiny", seed=3)


@pytest.fixture
def model_dir(pristine: Path, tmp_path: Path) -> Path:
    """A copy the test may damage."""
    return Path(shutil.copytree(pristine, tmp_path / "tiny"))


def test_load_gives_an_eval_model_with_its_eos_ids_and_hash(pristine: Path) -> None:
    loaded = load_model(pristine)
    assert not loaded.model.training
    assert loaded.path == pristine
    assert loaded.eos_token_ids == (loaded.tokenizer.convert_tokens_to_ids("<|im_end|>"), 256)
    assert loaded.model_hash == model_hash_of(pristine)
    assert len(loaded.model_hash) == 32
    assert loaded.hidden_size == ModelShape().hidden_size
    assert loaded.vocab_size == len(loaded.tokenizer)
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert loaded.device == torch.device("cpu")


def test_load_casts_to_the_requested_dtype(pristine: Path) -> None:
    loaded = load_model(pristine, dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def test_model_hash_is_sha256_over_named_config_then_weights(pristine: Path) -> None:
    """Pins the format: the pool's on-chain modelHash is computed this way by anyone, in any language."""
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        data = (pristine / name).read_bytes()
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    assert model_hash_of(pristine) == digest.digest()


def test_model_hash_follows_weights_and_config_but_not_tokenizer_files(model_dir: Path) -> None:
    before = model_hash_of(model_dir)
    (model_dir / "tokenizer_config.json").write_text((model_dir / "tokenizer_config.json").read_text() + "\n")
    assert model_hash_of(model_dir) == before
    weights = bytearray((model_dir / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (model_dir / "model.safetensors").write_bytes(bytes(weights))
    changed = model_hash_of(model_dir)
    assert changed != before
    (model_dir / "config.json").write_text((model_dir / "config.json").read_text() + " ")
    assert model_hash_of(model_dir) != changed


def test_missing_directory_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ModelLoadError, match="no such directory") as info:
        load_model(missing)
    assert str(missing) in str(info.value)
    assert isinstance(info.value, NodeError)
    with pytest.raises(ModelLoadError):
        model_hash_of(missing)


def test_missing_config_is_reported(model_dir: Path) -> None:
    (model_dir / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"config\.json is missing"):
        load_model(model_dir)


def test_missing_weights_are_reported(model_dir: Path) -> None:
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        load_model(model_dir)


def test_a_checkpoint_missing_a_tensor_is_refused_not_filled_with_random_values(model_dir: Path) -> None:
    weights = model_dir / "model.safetensors"
    tensors = load_file(weights)
    dropped = next(name for name in tensors if name.endswith("mlp.up_proj.weight"))
    save_file({name: t for name, t in tensors.items() if name != dropped}, weights, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"1 tensors are missing from the checkpoint"):
        load_model(model_dir)


def test_loads_in_two_threads_at_once_both_get_the_checkpoints_weights(pristine: Path) -> None:
    # transformers' loading changes process-wide state: two at once gave one model random weights
    want = load_model(pristine).model.state_dict()
    with ThreadPoolExecutor(4) as pool:
        loaded = list(pool.map(lambda _: load_model(pristine), range(8)))
    for model in loaded:
        got = model.model.state_dict()
        assert all(torch.equal(got[name], want[name]) for name in want)


def test_truncated_weights_are_a_one_line_error(model_dir: Path) -> None:
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelLoadError) as info:
        load_model(model_dir)
    message = str(info.value)
    assert str(model_dir) in message
    assert "\n" not in message
    with pytest.raises(ModelLoadError):
        parameter_count(model_dir)


def test_malformed_config_is_a_load_error(model_dir: Path) -> None:
    (model_dir / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=str(model_dir)):
        load_model(model_dir)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loads_on_cuda_in_bfloat16_and_matches_cpu_logits(pristine: Path) -> None:
    cpu = load_model(pristine)
    gpu = load_model(pristine, device="cuda", dtype=torch.bfloat16)
    assert gpu.device.type == "cuda"
    input_ids = torch.tensor([cpu.tokenizer.encode("What is 17*3? <answer>51</answer>")])
    expected = forward_hidden(cpu.model, input_ids)
    got = forward_hidden(gpu.model, input_ids.cuda())
    assert got.hidden.shape == expected.hidden.shape
    torch.testing.assert_close(got.logits.cpu(), expected.logits, rtol=0.05, atol=0.05)
