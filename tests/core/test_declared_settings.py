"""core.config: a field declared once is read from TOML, the environment and flags, and every refusal names where."""

from __future__ import annotations

import re
from dataclasses import FrozenInstanceError, dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from core.config import REQUIRED, ConfigError, Settings, declared, setting, table
from core.errors import InputError


@dataclass(frozen=True)
class Example(Settings):
    TABLE: ClassVar[str] = "example"

    state: Path | None = setting("state folder", default=None, flag="--state", relative=True)
    grace_seconds: float = setting(
        "seconds before giving up", default=600.0, key="grace", flag="--grace", above=0, maximum=3600
    )
    batch_size: int = setting("sequences decoded together", default=64, flag="--batch-size", minimum=1)
    port: int | None = setting("port (0: any)", default=None, minimum=0, maximum=65535)
    claim: bool = setting("claim rewards", default=False, flag="--claim")
    device: str = setting("where to run", default="auto", choices=("auto", "cpu", "cuda"))
    checkpoints: tuple[str, ...] = setting("checkpoint sources", default=(), flag="--checkpoints")
    password: str | None = setting("keystore password", default=None, env="EXAMPLE_PASSWORD")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "example.toml"
    path.write_text(text)
    return path


def test_no_file_and_no_flags_is_the_declared_defaults() -> None:
    assert Example.load(None, environ={}) == Example()
    assert Example().grace_seconds == 600.0 and Example().where("grace_seconds") is None


def test_the_file_then_the_environment_then_flags_each_override_and_say_where(tmp_path: Path) -> None:
    path = write(tmp_path, '[example]\ngrace = 5\nbatch_size = 8\nstate = "s"\ncheckpoints = ["http://a"]\n')
    loaded = Example.load(
        path, flags={"batch_size": 16, "claim": None, "checkpoints": ["http://b"]}, environ={"EXAMPLE_PASSWORD": "pw"}
    )
    assert loaded.grace_seconds == 5.0 and isinstance(loaded.grace_seconds, float)  # an int is taken for a float
    assert loaded.batch_size == 16 and loaded.claim is False  # None: the flag was not given
    assert loaded.state == tmp_path / "s"  # relative to the file's folder
    assert loaded.checkpoints == ("http://b",) and loaded.password == "pw"
    assert loaded.where("grace_seconds") == f"{path}: example.grace"
    assert loaded.where("batch_size") == "--batch-size" and loaded.where("password") == "$EXAMPLE_PASSWORD"
    assert loaded.file == {"grace": 5, "batch_size": 8, "state": "s", "checkpoints": ["http://a"]}
    with pytest.raises(FrozenInstanceError):
        loaded.batch_size = 1  # type: ignore[misc]


def test_a_flag_path_is_the_callers_and_an_absolute_path_in_the_file_stays(tmp_path: Path) -> None:
    path = write(tmp_path, '[example]\nstate = "/abs/state"\n')
    assert Example.load(path, environ={}).state == Path("/abs/state")
    assert Example.load(path, flags={"state": Path("rel")}, environ={}).state == Path("rel")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[example]\ngrace_seconds = 5\n", "example.toml: unknown key example.grace_seconds; known: state, grace,"),
        ("[example]\nbatch_size = true\n", "example.batch_size must be an integer >= 1, got True"),  # bool is no int
        ("[example]\nbatch_size = 1.0\n", "example.batch_size must be an integer >= 1, got 1.0"),
        ("[example]\nbatch_size = 0\n", "example.batch_size must be an integer >= 1, got 0"),
        ("[example]\ngrace = 0\n", "example.grace must be a number in (0, 3600], got 0"),
        ("[example]\ngrace = nan\n", "example.grace must be a number in (0, 3600], got nan"),
        ("[example]\nport = 70000\n", "example.port must be an integer in [0, 65535], got 70000"),
        ("[example]\nclaim = 1\n", "example.claim must be true or false, got 1"),
        ('[example]\ndevice = "tpu"\n', "example.device must be one of auto, cpu, cuda, got 'tpu'"),
        ("[example]\ncheckpoints = [1]\n", "example.checkpoints must be a list of strings, got [1]"),
        ("[example]\nstate = 3\n", "example.state must be a path, got 3"),
        ("[worker]\nstate = 's'\n", "unknown table or key 'worker'; expected [example]"),
        ("example = 3\n", "example must be a table"),
        ("[example\n", "not readable TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        Example.load(path, environ={})
    assert message in str(refused.value) and str(path) in str(refused.value)
    assert isinstance(refused.value, InputError)


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nowhere\.toml: not found"):
        Example.load(tmp_path / "nowhere.toml", environ={})


def test_a_bad_flag_is_refused_naming_the_flag_and_a_bad_variable_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"^--grace: must be a number in \(0, 3600\], got 1000000000.0$") as refused:
        Example.load(None, flags={"grace_seconds": 1e9}, environ={})
    assert refused.value.where == "--grace"
    with pytest.raises(ConfigError, match=r"^--port: must be an integer in \[0, 65535\], got -1$"):
        Example.load(None, flags={"port": -1}, environ={})  # a field without a flag of its own: its name as one
    with pytest.raises(TypeError, match="declares no field 'nope'"):
        Example.load(None, flags={"nope": 1}, environ={})


def test_only_declared_immutable_fields_and_string_secrets_are_accepted() -> None:
    with pytest.raises(TypeError, match="mutable default"):
        setting("sources", default=[])

    @dataclass(frozen=True)
    class Undeclared(Settings):
        plain: int = field(default=1)

    with pytest.raises(TypeError, match=r"Undeclared\.plain is not declared"):
        declared(Undeclared)

    @dataclass(frozen=True)
    class SecretInt(Settings):
        pin: int = setting("a pin", default=0, env="PIN")

    with pytest.raises(TypeError, match="only a str"):
        declared(SecretInt)
    assert [d.key for d in declared(Example)][:2] == ["state", "grace"]


@dataclass(frozen=True)
class Optim(Settings):
    lr: float = setting("learning rate", default=3e-4, above=0, maximum=0.5)
    warmup: int = setting("warm-up steps", default=3, minimum=0)


@dataclass(frozen=True)
class Gossip(Settings):
    host: str = setting("address", default="127.0.0.1")
    port: int = setting("port (0: any)", default=0, minimum=0, maximum=65535)


@dataclass(frozen=True)
class Run(Settings):
    dir: Path = setting("the run folder", default=REQUIRED, relative=True)
    steps: int = setting("policy steps", default=20, minimum=1)
    device: str = setting("where to train", default="auto", choices=("auto", "cpu", "cuda"))


@dataclass(frozen=True)
class Trainer(Settings):
    """A whole-file settings class: each table of the file is a nested one."""

    seed: int = setting("seed", default=0, minimum=0)
    run: Run = table("[run]", Run)
    optim: Optim = table("[optim]", Optim)
    p2p: Gossip | None = table("[p2p]: gossip, off unless the table is there", Gossip, optional=True)


def test_a_whole_file_reads_each_table_into_its_own_settings_and_names_the_dotted_key(tmp_path: Path) -> None:
    path = write(tmp_path, 'seed = 3\n[run]\ndir = "runs/a"\n[optim]\nlr = 0.01\n')
    loaded = Trainer.load(path, flags={"run.device": "cpu", "run.steps": None}, environ={})
    assert loaded.seed == 3 and loaded.run.dir == tmp_path / "runs" / "a" and loaded.run.device == "cpu"
    assert loaded.run.steps == 20 and loaded.optim == Optim(lr=0.01) and loaded.p2p is None  # no [p2p]: off
    assert loaded.run.where("dir") == f"{path}: run.dir" and loaded.optim.where("lr") == f"{path}: optim.lr"
    assert Trainer.load(write(tmp_path, '[run]\ndir = "r"\n[p2p]\n'), environ={}).p2p == Gossip()  # empty: on
    for text, message in [
        ('[run]\ndir = "r"\n[optim]\nlr = 1.0\n', "example.toml: optim.lr must be a number in (0, 0.5], got 1.0"),
        ('[run]\ndir = "r"\n[optim]\nbeta = 1\n', "unknown key optim.beta; known: lr, warmup"),
        ('optim = 3\n[run]\ndir = "r"\n', "example.toml: optim must be a table ([optim])"),
        ("[optim]\nlr = 0.1\n", "example.toml: run.dir is required (the run folder)"),
        ('[run]\ndir = "r"\n[p2p]\nport = -1\n', "p2p.port must be an integer in [0, 65535], got -1"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            Trainer.load(write(tmp_path, text), environ={})
    with pytest.raises(ConfigError, match=re.escape("--device: must be one of auto, cpu, cuda, got 'tpu'")):
        Trainer.load(path, flags={"run.device": "tpu"}, environ={})
    with pytest.raises(TypeError, match=re.escape("Run declares no field 'nope'")):
        Trainer.load(path, flags={"run.nope": 1}, environ={})


def test_an_instance_made_in_code_is_held_to_the_same_declarations() -> None:
    for make, message in [
        (lambda: Optim(lr=0.0), "Optim.lr must be a number in (0, 0.5], got 0.0"),
        (lambda: Optim(warmup=True), "Optim.warmup must be an integer >= 0, got True"),
        (lambda: Run(), "Run.dir is required (the run folder)"),
        (lambda: Run(dir="r"), "Run.dir must be a path, got 'r'"),
        (lambda: Run(dir=Path("r"), device="tpu"), "Run.device must be one of auto, cpu, cuda, got 'tpu'"),
        (lambda: Example(checkpoints=["a"]), "Example.checkpoints must be a list of strings, got ['a']"),
        (lambda: Trainer(run=Run(dir=Path("r")), optim=None), "Trainer.optim must be a table, got None"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            make()
    assert Example(grace_seconds=5) == Example(grace_seconds=5.0)  # an int is a number, as in a file


def test_to_toml_writes_what_loads_back_to_equal_settings(tmp_path: Path) -> None:
    made = Trainer(seed=2, run=Run(dir=tmp_path / "run dir", device="cpu"), optim=Optim(lr=1e-06), p2p=Gossip())
    text = made.to_toml()
    assert text.splitlines()[0] == "seed = 2" and "[optim]\nlr = 1e-06\n" in text and text.endswith("[p2p]\n")
    assert Trainer.load(write(tmp_path, text), environ={}) == made
    example = Example(grace_seconds=5.5, checkpoints=("http://a", 'q"uote'), claim=True, port=0)
    assert example.to_toml().startswith("[example]\n")
    assert Example.load(write(tmp_path, example.to_toml()), environ={}) == example
    assert Example().to_toml() == "[example]\n"


def test_an_open_upper_bound_refuses_the_bound_itself() -> None:
    @dataclass(frozen=True)
    class Band(Settings):
        low: float = setting("clip below at 1 - low", default=0.2, minimum=0, below=1)
        under: int = setting("under ten", default=0, below=10)

    assert Band(low=0.999, under=9) == Band(low=0.999, under=9)
    with pytest.raises(ConfigError, match=re.escape("Band.low must be a number in [0, 1), got 1.0")):
        Band(low=1.0)
    with pytest.raises(ConfigError, match=re.escape("Band.under must be an integer < 10, got 10")):
        Band(under=10)
