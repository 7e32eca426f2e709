"""core.serving's logs under a flood: a failure repeated for every connection is one line per interval, with its count,
and a failed `accept()` is a line, not a traceback."""

from __future__ import annotations

import asyncio
import errno
import logging
import time

import pytest
from aiohttp import web

from core.serving import ConnectionLimits, FoldRepeats, serve


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


def test_accept_failing_for_want_of_a_descriptor_is_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A burst can hold a backlog of accepted sockets before the guard closes them, and `accept()` then fails with
    EMFILE (the hostile-clients test in CI): asyncio reports it through the loop's exception handler, as here."""

    async def scene() -> None:
        served = await serve(web.Application(), "127.0.0.1", 0, ConnectionLimits(log_interval=60), name="test")
        loop = asyncio.get_running_loop()
        try:
            for _ in range(100):
                try:
                    raise OSError(errno.EMFILE, "Too many open files")
                except OSError as error:
                    loop.call_exception_handler(
                        {"message": "socket.accept() out of system resource", "exception": error}
                    )
            loop.call_exception_handler({"message": "something else broke", "exception": ValueError("kept")})
        finally:
            await served.stop()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scene())
    records = [r for r in caplog.records if r.name in ("core.serving", "asyncio")]
    assert len(records) == 2, [r.getMessage() for r in records]
    accept, other = records
    assert accept.levelno == logging.WARNING and accept.exc_info is None
    assert "no descriptor for (Too many open files; accepting again in 1 s)" in accept.getMessage()
    assert other.levelno == logging.ERROR and other.getMessage() == "something else broke"  # still asyncio's, as before
