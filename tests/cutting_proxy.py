"""A TCP proxy to a PostgreSQL server's socket that can lose one answer on purpose.

A statement whose answer is lost in transit committed on the server, but its client
only sees the connection die: it cannot tell this from a statement that never ran. No
server crash makes that moment happen on cue; this proxy does. Armed with
:meth:`CuttingProxy.cut_next_answer`, it lets the client's next request through, drops
the server's answer to it and closes that client connection. Everything else is passed
through as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path


class CuttingProxy:
    """Listens on 127.0.0.1 (``port`` once started) and forwards to a unix socket."""

    def __init__(self, socket_dir: str, port: int = 5432) -> None:
        self.target = str(Path(socket_dir) / f".s.PGSQL.{port}")
        self._armed = False
        self.cuts = 0
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def dsn(self, base: str) -> str:
        """``base`` (a DSN of the server) pointed at the proxy."""
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(base)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo(**params)

    def cut_next_answer(self) -> None:
        """Drop the server's answer to the next request any client sends, and close that
        client's connection (the server has run the request)."""
        self._armed = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.target)
        except OSError:
            writer.close()
            return
        cutting = asyncio.Event()  # set when this connection's next answer is to be lost

        async def upstream() -> None:
            while data := await reader.read(65536):
                if self._armed:
                    self._armed = False
                    cutting.set()
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                if cutting.is_set():
                    self.cuts += 1
                    await asyncio.sleep(0.2)  # let the server finish the request (commit)
                    return  # the answer is dropped, the client's connection closed
                writer.write(data)
                await writer.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for w in (writer, up_writer):
            w.close()
