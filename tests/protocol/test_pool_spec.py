"""The pool spec: read from a path, a file:// URL or an http(s) URL, validated field by field."""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from ledger.types import PoolConfig, PoolInfo
from protocol.pool_spec import PoolSpecError, load_pool_spec, resolve_pool
from protocol.terms import TermsMismatch

TASK = Path(__file__).resolve().parents[2] / "configs" / "tasks" / "default.toml"
SPEC = 'coordinator = "http://127.0.0.1:8000/"\ncheckpoints = ["http://127.0.0.1:9000"]\ntask = "task.toml"\n'


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "task.toml").write_text(TASK.read_text())
    (tmp_path / "pool.toml").write_text(SPEC)
    return tmp_path


def test_a_local_spec_resolves_its_task_next_to_it(folder: Path) -> None:
    for uri in (str(folder / "pool.toml"), (folder / "pool.toml").as_uri()):
        spec = load_pool_spec(uri)
        assert spec.coordinator == "http://127.0.0.1:8000"  # the trailing slash is dropped
        assert spec.checkpoints == ("http://127.0.0.1:9000",)
        assert spec.task_path == folder / "task.toml" and spec.task().name == "basic-arithmetic"
        assert (spec.async_level, spec.bootstrap) == (2, ())


@pytest.fixture
def served(folder: Path) -> Iterator[str]:
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_remote_spec_and_its_task_are_fetched_into_the_cache(served: str, tmp_path: Path) -> None:
    spec = load_pool_spec(f"{served}/pool.toml", cache=tmp_path / "cache")
    assert spec.task_path.parent == tmp_path / "cache" and spec.task_path.read_text() == TASK.read_text()
    assert spec.task().name == "basic-arithmetic"


def test_an_unreachable_spec_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PoolSpecError, match=re.escape("cannot fetch http://127.0.0.1:9/pool.toml")):
        load_pool_spec("http://127.0.0.1:9/pool.toml", cache=tmp_path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('checkpoints = ["http://a"]\ntask = "task.toml"\n', "coordinator: is required"),
        ('coordinator = "ftp://x"\ncheckpoints = ["http://a"]\ntask = "task.toml"\n', "must be an http(s) URL"),
        ('coordinator = "http://c"\ncheckpoints = []\ntask = "task.toml"\n', "non-empty list"),
        ('coordinator = "http://c"\ncheckpoints = ["http://a"]\ntask = "task.toml"\nrelays = 1\n', "unknown key"),
        ('coordinator = "http://c"\ncheckpoints = ["http://a"]\ntask = "missing.toml"\n', "not found"),
        ('coordinator = "http://c"\ncheckpoints = ["http://a"]\ntask = "task.toml"\nasync_level = -1\n', ">= 0"),
        ('coordinator = "http://c"\ncheckpoints = ["http://a"]\ntask = "task.toml"\nreplication = 0\n', ">= 1"),
        (SPEC + "clock_slack = 3601\n", "clock_slack: must be <= 3600"),
        (SPEC + "assignment_lifetime = 600\n", "assignment_lifetime: assignment_lifetime must be in (600, "),
        (SPEC + "clock_slack = 100\nassignment_lifetime = 200\n", "more than twice the clock slack, 100 s"),
        ("coordinator = \n", "not readable TOML"),
    ],
)
def test_a_bad_spec_names_the_field(folder: Path, text: str, problem: str) -> None:
    (folder / "pool.toml").write_text(text)
    with pytest.raises(PoolSpecError, match=re.escape(problem)):
        load_pool_spec(str(folder / "pool.toml"))


def test_a_pool_without_a_spec_says_which_flags_replace_it() -> None:
    with pytest.raises(PoolSpecError, match="--coordinator, --checkpoints and --task"):
        load_pool_spec("")


def pool_at(spec_uri: str) -> PoolInfo:
    trainer = "0x" + "11" * 20
    return PoolInfo(7, trainer, PoolConfig("p", b"\0" * 32, spec_uri, trainer, 1, 3600, 1, 1))


def test_the_spec_is_read_even_when_flags_name_every_part(folder: Path) -> None:
    peer = "/ip4/127.0.0.1/tcp/4001/p2p/16Uiu2HAmExample"
    (folder / "pool.toml").write_text(
        SPEC + f'bootstrap = ["{peer}"]\nasync_level = 5\nmax_file_bytes = 4096\nreplication = 2\n'
    )
    info, flags = pool_at(str(folder / "pool.toml")), {"coordinator": "http://c:1", "checkpoints": ["http://o:2"]}
    for given in ({}, {**flags, "task": TASK}):
        pool = resolve_pool(info, **given)
        assert pool.endpoints.bootstrap == (peer,) and pool.endpoints.coordinator == given.get("coordinator",
               "http://127.0.0.1:8000")  # fmt: skip
        assert (pool.terms.async_level, pool.terms.max_file_bytes, pool.terms.challenge_window) == (5, 4096, 3600)
        assert pool.terms.replication == 2
    no_spec = resolve_pool(pool_at(""), **flags, task=TASK).terms  # a pool without a spec: the defaults
    assert (no_spec.async_level, no_spec.replication) == (2, 1)
    with pytest.raises(PoolSpecError, match="--coordinator, --checkpoints and --task"):
        resolve_pool(pool_at(""), **flags)
    (folder / "pool.toml").unlink()  # flags naming every part do not stand in for terms nobody can read
    with pytest.raises(PoolSpecError, match="not found"):
        resolve_pool(info, **flags, task=TASK)


def test_a_task_flag_that_is_not_the_pools_task_is_refused(folder: Path) -> None:
    other = folder / "other.toml"
    other.write_text(TASK.read_text().replace("basic-arithmetic", "another-task", 1))
    with pytest.raises(TermsMismatch, match=r"--task is .*other.toml .*pool 7's spec"):
        resolve_pool(pool_at(str(folder / "pool.toml")), task=other)
    assert resolve_pool(pool_at(str(folder / "pool.toml")), task=TASK).endpoints.task_path == TASK  # the same task
