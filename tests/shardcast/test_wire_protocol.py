"""shardcast.protocol: the routes both sides name, and the version list the server writes and the client reads."""

from __future__ import annotations

import json

import pytest

from shardcast.protocol import (
    MANIFEST,
    SHARD,
    STEP,
    VERSIONS,
    VersionList,
    manifest_url,
    read_versions,
    shard_url,
    versions_url,
)


def test_the_urls_a_client_asks_for_are_the_routes_a_server_serves() -> None:
    base = "http://127.0.0.1:9000"
    assert versions_url(base) == base + VERSIONS == "http://127.0.0.1:9000/versions"
    assert manifest_url(base, 12) == base + "/v/12/manifest.json" and MANIFEST == "/v/{step}/manifest.json"
    assert shard_url(base, 3, "model.safetensors", 7) == base + "/v/3/shards/model.safetensors/7"
    assert SHARD == "/v/{step}/shards/{file}/{index}"


def test_a_version_list_reads_back_as_the_server_wrote_it() -> None:
    held = VersionList(latest=4, complete=frozenset({3, 4}), incoming=frozenset({5}))
    body = json.dumps(held.to_json()).encode()
    assert read_versions(body) == held and read_versions(body).steps == {3, 4, 5}
    assert read_versions(b'{"latest": null, "versions": []}') == VersionList(None, frozenset(), frozenset())


@pytest.mark.parametrize(
    "body",
    [
        b'{"latest": true, "versions": []}',  # a bool is not a step
        b'{"latest": -1, "versions": []}',
        b'{"latest": 18446744073709551616, "versions": []}',  # 2**64
        b'{"latest": 1, "versions": [{"step": "1", "complete": true}]}',
        b'{"latest": 1, "versions": [{"step": 1}]}',
        b'{"latest": 1}',
        b"[]",
    ],
)
def test_a_hostile_version_list_is_a_value_error_naming_the_problem(body: bytes) -> None:
    with pytest.raises(ValueError, match=r"not a step|not a version list"):
        read_versions(body)


def test_a_step_has_one_spelling() -> None:
    assert [bool(STEP.fullmatch(text)) for text in ("0", "7", "10", "07", "+7", "-1", "1e3")] == [
        True, True, True, False, False, False, False,
    ]  # fmt: skip
