"""trainer.toml: the shipped example loads, flags override it, and bad values are named in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import Settings, declared
from shardcast.delta import DeltaPolicy
from tests.test_settings_declared_once import KEY, TABLE, shown_keys
from trainer.config import GossipConfig, TrainerConfigError, TrainerSettings, load_run_config

EXAMPLE = Path(__file__).parents[2] / "configs" / "trainer.toml"


def test_the_shipped_config_loads_and_flags_override_it() -> None:
    with pytest.raises(TrainerConfigError, match=r"\[local\] workers > 0"):
        load_run_config(EXAMPLE)  # neither local workers nor a pool: there is nobody to train with
    flags = {"local.workers": 3, "run.steps": 7, "run.dir": Path("/tmp/x"), "run.max_minutes": None}
    config = load_run_config(EXAMPLE, flags=flags)
    assert (config.local_workers, config.steps, config.run_dir) == (3, 7, Path("/tmp/x"))
    assert config.model == (EXAMPLE.parent / ".." / "tiny-sft").resolve()  # relative to the TOML file
    assert config.learner.async_level == 1 and config.max_minutes is None
    assert config.manifest_format == 3 and config.delta == DeltaPolicy(64 << 20, 0.9)


def test_the_origin_can_be_kept_on_manifest_format_1(tmp_path: Path) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text("[run]\ndir='r'\nmodel='m'\ntask='t'\n[shardcast]\nmanifest_format=1\n[local]\nworkers=1\n")
    assert load_run_config(path).manifest_format == 1
    path.write_text("[run]\ndir='r'\nmodel='m'\ntask='t'\n[shardcast]\ndelta=false\n[local]\nworkers=1\n")
    assert load_run_config(path).delta is None


NETWORK = "[run]\ndir='r'\nmodel='m'\ntask='t'\n[pool]\nid=1\ndeployment='d.json'\n"


@pytest.mark.parametrize(
    ("extra", "per_node"),
    [
        ("", 6),  # 256 rollouts a step from 8 x 8 = 64 a file: 4 files, plus 2
        ("[coordinator]\nprompts_per_task = 16\n", 3),  # 128 a file: 2, plus 1
        ("[coordinator]\nprompts_per_task = 32\n", 2),  # 256 a file: 1, plus 1
        ("[coordinator]\nfiles_per_node_per_step = 0\n", 0),  # no limit
        ("[coordinator]\nfiles_per_node_per_step = 9\n", 9),
        ("[data]\nrollouts_per_step = 64\n", 2),
    ],
)
def test_each_network_node_gets_a_steps_files_and_half_again_unless_told(
    tmp_path: Path, extra: str, per_node: int
) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(NETWORK + extra)
    api = load_run_config(path).api
    assert (api.files_per_node_per_step, api.pending_files_per_node) == (per_node, 0)


@pytest.mark.parametrize(
    ("workers", "extra", "pending"),
    [
        # 4 files a step; k = 2 by default (protocol.terms), the oldest first: the 3 steps the window holds
        (1, "", 12),
        (2, "", 6),
        (3, "", 4),  # shared out, rounded up
        (1, "[coordinator]\nprompts_per_task = 16\n", 6),
        (1, "[data]\nasync_level = 1\n", 8),  # k = 1: the step being trained and the next one
        (1, "[coordinator]\nprompts_per_task = 16\n[data]\nasync_level = 0\n", 2),  # no overlap to make room for
        # k = 2: the oldest go first (local mode's order), so a worker may hold the files of the 3 steps the window
        # holds; with the freshest first, as with k = 1: a third step's files would wait until they left the window
        (1, "[coordinator]\nprompts_per_task = 16\n[data]\nasync_level = 2\n[shardcast]\nkeep = 4\n", 6),
        (2, "[coordinator]\nprompts_per_task = 16\n[data]\nasync_level = 2\n[shardcast]\nkeep = 4\n", 3),
        (2, "[coordinator]\nprompts_per_task = 16\n[data]\nasync_level=2\norder='freshest'\n[shardcast]\nkeep=4\n", 2),
        (1, "[coordinator]\npending_files_per_node = 0\n", 0),
    ],
)
def test_each_local_worker_may_be_a_step_ahead_of_the_trainer(
    tmp_path: Path, workers: int, extra: str, pending: int
) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(f"[run]\ndir='r'\nmodel='m'\ntask='t'\n[local]\nworkers={workers}\n" + extra)
    api = load_run_config(path).api
    assert (api.files_per_node_per_step, api.pending_files_per_node) == (0, pending)
    flag = tmp_path / "flag.toml"  # --local-workers counts as the file's value does
    flag.write_text(NETWORK + extra)
    api = load_run_config(flag, flags={"local.workers": workers}).api
    assert (api.files_per_node_per_step, api.pending_files_per_node) == (0, pending)


def test_both_modes_take_the_oldest_files_first_under_a_cap_on_what_is_handed_out(tmp_path: Path) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(NETWORK)
    network = load_run_config(path)
    assert network.order == "oldest"
    # the network: the pool's files in flight, at most what the window's k + 1 steps train on (2-file steps here)
    k = network.learner.async_level
    files = -(-network.rollouts_per_step // (network.api.prompts_per_task * network.api.group_size))
    assert network.api.max_files_in_flight == files * (k + 1)
    local = load_run_config(path, flags={"local.workers": 1})
    assert local.order == "oldest" and local.api.max_files_in_flight == 0  # local workers: pending_files_per_node
    path.write_text(NETWORK + "[data]\norder = 'freshest'\n[coordinator]\nmax_files_in_flight = 0\n")
    assert (load_run_config(path).order, load_run_config(path).api.max_files_in_flight) == ("freshest", 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[run]\ndir='r'\nmodel='m'\ntask='t'\n[data]\nasync_level=-1\n[local]\nworkers=1\n", "data.async_level"),
        ("[run]\ndir='r'\nmodel='m'\ntask='t'\n[data]\norder='newest'\n[local]\nworkers=1\n", "data.order"),
        ("[run]\ndir='r'\nmodel='m'\ntask='t'\n[optim]\nlr=true\n[local]\nworkers=1\n", "optim.lr"),
        ("[run]\ndir='r'\nmodel='m'\ntask='t'\n[optim]\nlearning_rate=1\n[local]\nworkers=1\n", "unknown key"),
        ("[run]\ndir='r'\nmodel='m'\ntask='t'\n[shardcast]\nkeep=2\n[local]\nworkers=1\n", "shardcast.keep"),
        ("[run]\ndir='r'\nmodel='m'\ntask='t'\n[shardcast]\nmanifest_format=4\n[local]\nworkers=1", "manifest_format"),
        ("[run]\ndir='r'\nmodel='m'\ntask='t'\n[shardcast]\ndelta_max_ratio=0\n[local]\nworkers=1", "delta_max_ratio"),
        ("[run]\nmodel='m'\ntask='t'\n[local]\nworkers=1\n", "run.dir"),
        ("[run\n", "not readable TOML"),
        ("[run]\ndir='r'\nmodel='m'\ntask='t'\n[p2p]\nport=70000\n[local]\nworkers=1\n", "p2p.port"),
        ("[run]\ndir='r'\nmodel='m'\ntask='t'\n[p2p]\nhost='localhost'\n[local]\nworkers=1\n", "p2p.host"),
    ],
)
def test_bad_values_are_refused_with_the_field_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(text)
    with pytest.raises(TrainerConfigError, match=message) as caught:
        load_run_config(path)
    assert str(path) in str(caught.value)


def test_a_pool_table_selects_network_mode(tmp_path: Path) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(
        "[run]\ndir='r'\nmodel='m'\ntask='t'\n[pool]\nid=3\ndeployment='deployment.json'\nmin_attestations=2\n"
    )
    config = load_run_config(path)
    assert not config.local and config.pool is not None
    assert (config.pool.id, config.pool.min_attestations, config.pool.keystore) == (3, 2, None)
    assert config.pool.deployment == tmp_path / "deployment.json"


def test_gossip_is_off_without_a_p2p_table_and_an_empty_one_takes_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "trainer.toml"
    base = "[run]\ndir='r'\nmodel='m'\ntask='t'\n[local]\nworkers=1\n"
    path.write_text(base)
    assert load_run_config(path).p2p is None
    path.write_text(base + "[p2p]\n")
    assert load_run_config(path).p2p == GossipConfig(host="127.0.0.1", port=0)
    path.write_text(base + "[p2p]\nhost='0.0.0.0'\nport=4001\n")
    assert load_run_config(path).p2p == GossipConfig(host="0.0.0.0", port=4001)


def test_every_key_the_shipped_config_shows_is_read_into_exactly_one_declared_field(tmp_path: Path) -> None:
    """configs/trainer.toml with its commented-out keys and tables uncommented loads, and each key it shows lands on
    one field of TrainerSettings, named by its dotted key: none is dropped, read twice or left undocumented."""
    lines = []
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        shown = line.startswith("#") and (KEY.match(line) or TABLE.match(line))
        lines.append(line.lstrip("#").lstrip() if shown else line)
    path = tmp_path / "trainer.toml"
    path.write_text("\n".join(lines) + "\n")
    keys = [key for key in shown_keys(path) if "." in key]  # `run.dir` ..., not the tables themselves
    assert len(keys) == len(set(keys)) and keys, keys

    def fields_set(settings: Settings, prefix: str) -> list[str]:
        found = []
        for item in declared(type(settings)):
            dotted = f"{prefix}.{item.key}" if prefix else item.key
            value = getattr(settings, item.name)
            if item.is_table:
                found += fields_set(value, dotted)
            else:
                assert settings.where(item.name) == f"{path}: {dotted}", f"{dotted} is not read from its key"
                found.append(dotted)
        return found

    loaded = TrainerSettings.load(path)
    assert loaded.p2p is not None and loaded.pool is not None  # the optional tables, shown commented out
    assert sorted(fields_set(loaded, "")) == sorted(keys)  # every declared key shown, every shown key declared
