"""The proxy's side of one exchange with a backend: a fresh HTTP/1.1 connection per request.

Connections to backends are never reused, so "not connected" and "not sent" are the same thing:
a request is retried only when ``Upstream.open`` raised ``Unreachable`` (no byte of it reached a
backend). ``get_once`` is the small bounded GET of probes and ``/v1/models``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import NamedTuple
from urllib.parse import urlsplit

import h11

READ_CHUNK = 65_536


class Unreachable(Exception):
    """No connection to the backend could be opened: no byte of the request reached it."""


class UpstreamBroken(Exception):
    """The backend's connection failed after the request was (partly) sent."""


class Slow(UpstreamBroken):
    """The backend accepted the connection but did not answer in time."""


class Outbound(NamedTuple):
    """One request as the front sends it on to a backend (``url``), body buffered or streamed."""

    method: str
    url: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes | AsyncIterator[bytes]
    length: int


class Upstream:
    """One HTTP/1.1 exchange with a backend on a fresh connection (never reused: a request is
    then known to have reached no backend exactly when its connection could not be opened)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, url: str, gate: asyncio.Semaphore, timeout: float) -> Upstream:
        parts = urlsplit(url)
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(parts.hostname, parts.port), timeout
                )
            except (OSError, TimeoutError) as exc:
                raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
        return cls(reader, writer)

    async def _write(self, event: h11.Event) -> None:
        data = self.h.send(event)
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def send(self, request: Outbound) -> None:
        method, url, path, headers, body, length = request
        host = urlsplit(url).netloc
        out = [("host", host), *headers, ("connection", "close")]
        if method == "POST":
            out.append(("content-length", str(length)))
        try:
            await self._write(h11.Request(method=method, target=path, headers=out))
            if isinstance(body, bytes):
                if body:
                    await self._write(h11.Data(data=body))
            else:
                async for chunk in body:
                    await self._write(h11.Data(data=chunk))
            await self._write(h11.EndOfMessage())
        except (OSError, h11.ProtocolError) as exc:
            raise UpstreamBroken(f"{type(exc).__name__}: {exc}") from exc

    async def _event(self) -> h11.Event:
        while True:
            try:
                event = self.h.next_event()
            except h11.ProtocolError as exc:
                raise UpstreamBroken(f"the backend's answer is not valid HTTP: {exc}") from exc
            if event is h11.NEED_DATA:
                try:
                    data = await self.reader.read(READ_CHUNK)
                except OSError as exc:
                    raise UpstreamBroken(f"{type(exc).__name__}: {exc}") from exc
                try:
                    self.h.receive_data(data)
                except h11.ProtocolError as exc:
                    raise UpstreamBroken(str(exc)) from exc
                continue
            return event  # type: ignore[return-value]

    async def response(self) -> h11.Response:
        while True:
            event = await self._event()
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise UpstreamBroken("the backend closed the connection without an answer")
            if not isinstance(event, h11.InformationalResponse):
                raise UpstreamBroken(f"unexpected {type(event).__name__} from the backend")

    async def body(self) -> AsyncIterator[bytes]:
        """The answer's body as it comes; raises UpstreamBroken if it stops short of its
        declared length. A body delimited by the close ends cleanly: the caller checks it."""
        while True:
            event = await self._event()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.transport.abort()


async def get_once(
    url: str, path: str, gate: asyncio.Semaphore, timeout: float
) -> tuple[int, bytes]:
    """A small GET to a backend (probes, /v1/models), bounded in time."""

    async def run() -> tuple[int, bytes]:
        up = await Upstream.open(url, gate, timeout)
        try:
            await up.send(Outbound("GET", url, path, [("accept", "application/json")], b"", 0))
            response = await up.response()
            body = b"".join([c async for c in up.body()])
            return response.status_code, body[:1_000_000]
        finally:
            up.close()

    try:
        return await asyncio.wait_for(run(), timeout)
    except TimeoutError as exc:
        raise Slow(f"no answer within {timeout:.0f} s") from exc
