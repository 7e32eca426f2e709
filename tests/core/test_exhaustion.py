"""core.exhaustion: which resource ran out, from an exception's type and errno and what it was raised from."""

from __future__ import annotations

import errno

import pyarrow as pa
import pytest
import torch

from core.exhaustion import Resource, exhausted


@pytest.mark.parametrize(
    ("exc", "resource"),
    [
        (MemoryError(), Resource.MEMORY),
        (pa.ArrowMemoryError("malloc of size 26944 failed"), Resource.MEMORY),
        (torch.OutOfMemoryError("CUDA out of memory"), Resource.MEMORY),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), Resource.MEMORY),
        (OSError(errno.ENOSPC, "No space left on device"), Resource.DISK),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), Resource.DISK),
        (OSError(errno.EMFILE, "Too many open files"), Resource.DESCRIPTORS),
        (OSError(errno.ENFILE, "Too many open files in system"), Resource.DESCRIPTORS),
    ],
    ids=lambda value: value.name.lower() if isinstance(value, Resource) else type(value).__name__,
)
def test_each_exhausted_resource_is_named_by_type_and_errno(exc: BaseException, resource: Resource) -> None:
    assert exhausted(exc) == resource


@pytest.mark.parametrize(
    "exc",
    [
        OSError("Couldn't deserialize thrift: invalid TType"),  # pyarrow on garbage: an OSError without errno
        pa.ArrowInvalid("Parquet magic bytes not found"),
        OSError(errno.ENOENT, "No such file or directory"),
        RuntimeError("out of memory"),  # a message is not a cause
        ValueError("MemoryError"),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_other_errors_name_no_resource_whatever_their_message(exc: BaseException) -> None:
    assert exhausted(exc) is None


def test_a_cause_is_followed_through_wrapping_and_a_context_is_not() -> None:
    try:
        try:
            raise pa.ArrowMemoryError("malloc of size 26944 failed")
        except pa.ArrowException as inner:
            raise ValueError("undecodable Parquet data") from inner
    except ValueError as outer:
        assert exhausted(outer) == Resource.MEMORY
    try:
        try:
            raise MemoryError()
        except MemoryError:
            raise ValueError("a fault of its own while handling it")  # noqa: B904 - the context is the point
    except ValueError as unrelated:
        assert exhausted(unrelated) is None
