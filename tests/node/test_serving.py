"""node.serving's log folding: a failure repeated for every connection is one line per interval, with its count."""

from __future__ import annotations

import logging
import time

import pytest

from node.serving import FoldRepeats


def test_a_traceback_repeated_for_every_connection_is_logged_once_per_interval_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("tests.serving.storm")
    logger.addFilter(FoldRepeats(interval=0.5))
    with caplog.at_level(logging.ERROR, logger="tests.serving.storm"):
        for _ in range(1000):  # as asyncio logs `accept()` failing for want of a descriptor
            try:
                raise OSError(24, "Too many open files")
            except OSError:
                logger.exception("socket.accept() out of system resource")
        logger.error("another failure")  # another message is not folded into the first
        time.sleep(0.6)
        logger.error("socket.accept() out of system resource")
    messages = [record.getMessage() for record in caplog.records]
    assert messages[:2] == ["socket.accept() out of system resource", "another failure"]
    assert len(messages) == 3 and messages[2].startswith("socket.accept() out of system resource [and 999 more")
