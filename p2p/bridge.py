"""A trio event loop in its own thread, driven from asyncio: py-libp2p runs only under trio.

`TrioThread.start(main)` runs `main` with `trio.run` in a daemon thread. `main` opens what it needs (the
libp2p host, its services) and then awaits `serve(value)`, which hands `value` to the asyncio caller of
`start` and keeps a nursery for calls until `stop()`. A graceful stop makes `serve` return, so `main`
leaves its `async with` blocks in order and libp2p closes its streams and sockets; only if that takes
longer than the timeout is `main` cancelled outright.

Crossing threads:
- asyncio -> trio: `await bridge.run(fn)` starts `fn()` as a task in the serve nursery and awaits its
  result in asyncio. Cancelling the asyncio caller cancels the trio task; stopping the host fails it.
- trio -> asyncio: `await bridge.call_asyncio(coro)` runs `coro` on the asyncio loop and waits for it in
  trio; `bridge.to_loop(fn, *args)` schedules a plain callback there (dropped once that loop is closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import trio

from p2p.errors import NotRunningError, P2PError

T = TypeVar("T")
log = logging.getLogger("p2p")


def _settle(future: asyncio.Future[Any], value: object, error: BaseException | None) -> None:
    if future.done():  # the asyncio caller was cancelled, or a failure was reported first
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _innermost(error: BaseException | None) -> BaseException | None:
    """The one exception inside nested single-member groups (each trio nursery on the way out adds one)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


class TrioThread:
    """One trio loop in one daemon thread; start it once, stop it once."""

    def __init__(self, name: str, on_finished: Callable[[], None] | None = None) -> None:
        self.name = name
        self._on_finished_hook = on_finished  # called in asyncio once the thread has ended, for any reason
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop_event: trio.Event | None = None
        self._hard_stop = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._ready: asyncio.Future[Any] | None = None
        self._finished: asyncio.Future[None] | None = None

    @property
    def running(self) -> bool:
        return self._nursery is not None

    async def start(self, main: Callable[[], Awaitable[None]], timeout: float) -> Any:
        """Runs `main` in a new thread; returns the value it passes to `serve`. P2PError if it fails first."""
        if self._thread is not None:
            raise P2PError("a p2p host starts once; build a new one", name=self.name)
        self._loop = asyncio.get_running_loop()
        self._ready, self._finished = self._loop.create_future(), self._loop.create_future()
        self._thread = threading.Thread(target=self._thread_main, args=(main,), name=self.name, daemon=True)
        self._thread.start()
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            await self.stop(timeout)
            raise P2PError("p2p host did not start in time", name=self.name, timeout_s=timeout) from None

    async def serve(self, value: object) -> None:
        """In trio, from `main`: reports `value` to `start`, then serves calls until `stop`."""
        assert self._stop_event is not None and self._ready is not None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.to_loop(_settle, self._ready, value, None)
            await self._stop_event.wait()
            self._nursery = None
            nursery.cancel_scope.cancel()

    async def stop(self, timeout: float) -> None:
        """Stops gracefully, then by cancellation; returns once the thread has ended. Idempotent."""
        if self._thread is None or self._finished is None:
            return
        if not self._finished.done():
            with contextlib.suppress(NotRunningError):  # not entered trio yet, or ended on its own just now
                self._to_trio(self._request_stop)
            try:
                await asyncio.wait_for(asyncio.shield(self._finished), timeout)
            except TimeoutError:
                log.warning("p2p host %s did not stop within %.1f s; cancelling it", self.name, timeout)
                with contextlib.suppress(NotRunningError):
                    self._to_trio(self._hard_stop.cancel)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._finished), timeout)
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():
            raise P2PError("p2p thread did not end", name=self.name, timeout_s=timeout)

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Runs `fn()` in the trio loop and returns its result; NotRunningError if the host is not serving."""
        nursery, loop = self._nursery, asyncio.get_running_loop()
        if nursery is None:
            raise NotRunningError("p2p host is not running", name=self.name)
        future: asyncio.Future[T] = loop.create_future()
        scope = trio.CancelScope()

        async def task() -> None:
            value: object = None
            error: BaseException | None = NotRunningError("p2p host stopped during the call", name=self.name)
            try:
                with scope:
                    value, error = await fn(), None
            except P2PError as exc:
                error = exc
            except Exception as exc:  # a libp2p failure the caller did not map: keep it as the cause
                error = P2PError("p2p call failed", error=repr(exc))
                error.__cause__ = exc
            finally:
                self.to_loop(_settle, future, value, error)

        def spawn() -> None:
            try:
                nursery.start_soon(task)
            except RuntimeError:  # the nursery closed in between: the host is stopping
                self.to_loop(_settle, future, None, NotRunningError("p2p host is stopping", name=self.name))

        def cancel_in_trio(done: asyncio.Future[T]) -> None:
            if done.cancelled():
                with contextlib.suppress(NotRunningError):
                    self._to_trio(scope.cancel)

        self._to_trio(spawn)
        future.add_done_callback(cancel_in_trio)
        return await future

    async def call_asyncio(self, coro: Coroutine[Any, Any, T]) -> T:
        """In trio: runs `coro` on the asyncio loop and returns its result (cancelled with the trio caller)."""
        assert self._loop is not None and self._token is not None
        token = self._token
        try:
            done_in_asyncio = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:
            coro.close()
            raise NotRunningError("the asyncio loop is closed", name=self.name) from None
        finished = trio.Event()

        def wake(_: object) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(finished.set)

        done_in_asyncio.add_done_callback(wake)
        try:
            await finished.wait()
        finally:
            done_in_asyncio.cancel()  # no-op once it is done
        return done_in_asyncio.result()

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """In trio: runs `fn(*args)` as a background task until it returns or the host stops."""
        if self._nursery is None:
            raise NotRunningError("p2p host is not running", name=self.name)
        self._nursery.start_soon(fn, *args)

    def to_loop(self, fn: Callable[..., object], *args: object) -> None:
        """Schedules `fn(*args)` on the asyncio loop; dropped if that loop is closed."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            log.debug("asyncio loop closed; dropped a callback from p2p host %s", self.name)

    def _to_trio(self, fn: Callable[[], object]) -> None:
        if self._token is None:
            raise NotRunningError("p2p host is not running", name=self.name)
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            raise NotRunningError("p2p host has stopped", name=self.name) from None

    def _request_stop(self) -> None:
        if self._stop_event is not None:
            self._stop_event.set()

    def _thread_main(self, main: Callable[[], Awaitable[None]]) -> None:
        error: BaseException | None = None
        try:
            trio.run(self._entry, main)
        except BaseException as exc:  # the thread's top: report it to asyncio rather than lose it
            error = exc
        finally:
            self._nursery = None
            self.to_loop(self._on_finished, error)

    async def _entry(self, main: Callable[[], Awaitable[None]]) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop_event = trio.Event()
        with self._hard_stop:
            await main()

    def _on_finished(self, error: BaseException | None) -> None:
        assert self._ready is not None and self._finished is not None
        error = _innermost(error)
        if isinstance(error, P2PError) and not self._ready.done():
            self._ready.set_exception(error)
        elif error is not None and not self._ready.done():
            failure = P2PError("p2p host failed to start", name=self.name, error=repr(error))
            failure.__cause__ = error
            self._ready.set_exception(failure)
        elif error is not None:
            log.error("p2p host %s crashed: %r", self.name, error, exc_info=error)
        elif not self._ready.done():
            self._ready.set_exception(P2PError("p2p host ended before it was ready", name=self.name))
        if not self._finished.done():
            self._finished.set_result(None)
        if self._on_finished_hook is not None:
            self._on_finished_hook()
