"""core.trace: one JSON line a stage when PRIME_TRACE names a folder, nothing at all when it does not."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from core import trace
from core.trace import TRACE_ENV_VAR, Tracer, configure_tracing, read_trace


@pytest.fixture(autouse=True)
def _reset() -> None:
    yield
    trace._tracer.close()
    trace._tracer = Tracer("", None)


def test_unset_variable_writes_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(TRACE_ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    tracer = configure_tracing("worker")
    with trace.span("generate", step=1):
        pass
    trace.record("upload", 0.5, key="ab")
    assert not tracer.enabled
    assert list(tmp_path.iterdir()) == []


def test_spans_and_records_are_lines_of_the_roles_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TRACE_ENV_VAR, str(tmp_path / "trace"))
    tracer = configure_tracing("validator")
    with trace.span("verify", key="00ff"):
        pass
    trace.record("attest", 0.25, key="00ff", accepted=True)
    assert tracer.path is not None and tracer.path.parent == tmp_path / "trace"
    assert tracer.path.name.startswith("validator-")
    lines = read_trace(tmp_path / "trace")
    assert [(x["role"], x["stage"]) for x in lines] == [("validator", "verify"), ("validator", "attest")]
    assert lines[1]["seconds"] == 0.25 and lines[1]["accepted"] is True and lines[1]["key"] == "00ff"
    assert all(x["at"] > 1.7e9 for x in lines)


def test_a_failed_stage_is_not_recorded(tmp_path: Path) -> None:
    tracer = Tracer("trainer", tmp_path / "t.jsonl")
    with pytest.raises(RuntimeError), tracer.span("publish", step=3):
        raise RuntimeError("origin down")
    tracer.record("train", 1.0, step=3)
    assert [x["stage"] for x in read_trace(tmp_path)] == ["train"]


def test_threads_never_interleave_a_line(tmp_path: Path) -> None:
    tracer = Tracer("worker", tmp_path / "w.jsonl")

    def write(n: int) -> None:
        for i in range(500):
            tracer.record("generate", 0.001, step=n, payload="x" * 200, i=i)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tracer.close()
    lines = (tmp_path / "w.jsonl").read_text().splitlines()
    assert len(lines) == 2000
    assert all(json.loads(line)["payload"] == "x" * 200 for line in lines)


def test_read_trace_skips_a_torn_last_line(tmp_path: Path) -> None:
    (tmp_path / "worker-1.jsonl").write_text('{"role": "worker", "stage": "fetch", "seconds": 1}\n{"role": "wor')
    assert read_trace(tmp_path) == [{"role": "worker", "stage": "fetch", "seconds": 1}]
