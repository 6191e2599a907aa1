"""``nightshift batch serve``: the OpenAI Batch API and Anthropic Message Batches API on
the user's own GPUs.

One process: uvicorn answers requests in the main thread while one worker thread runs
the queued batches, each a nightshift job and a Prefect flow run (``batch.queue``). All
state lives in the store (``batch.store``), so a server killed at any moment carries
every unfinished batch on at its next start. It refuses to listen beyond loopback
without an API key, and logs neither keys nor request bodies.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator
from functools import partial

from fastapi import FastAPI

from nightshift.batch.api_anthropic import anthropic_router
from nightshift.batch.api_openai import openai_router
from nightshift.batch.execute import ServeSettings, input_problems, run_record
from nightshift.batch.http import BodyLimit, install_error_handlers
from nightshift.batch.lifecycle import finish
from nightshift.batch.queue import BatchQueue
from nightshift.batch.state import ServerState
from nightshift.batch.store import BatchStore
from nightshift.errors import UserError

log = logging.getLogger("nightshift.batch.server")
SHUTDOWN_S = 120.0  # how long a shutdown waits for the running job's graceful stop
_MULTIPART_SLACK = 1 << 20  # multipart framing around an upload of the largest size


def check_exposure(host: str, api_key: str | None) -> None:
    """Listening beyond this machine needs a key: anyone who reaches the port could
    otherwise run jobs on the GPU and read every result."""
    if api_key:
        return
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise UserError(
            f"--host {host} is reachable from other machines: give an API key "
            "(--api-key or NIGHTSHIFT_API_KEY), or listen on 127.0.0.1"
        )


def create_app(settings: ServeSettings, run=None, batches: BatchStore | None = None) -> FastAPI:
    """The app; ``run(record) -> counts`` runs one batch's job (``run_record`` unless
    given), on ``batches`` (the settings' store unless given). The worker starts and
    stops with the app's lifespan, after the store's index is made whole."""
    batches = batches or BatchStore(settings.store)
    queue = BatchQueue(
        batches,
        run or partial(run_record, batches, settings=settings),
        partial(finish, batches),
        validate=partial(input_problems, batches),
    )
    state = ServerState(settings, batches, queue)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batches.ensure_index()  # a store from before the index: once, before any request
        queue.start()
        yield
        queue.shutdown(SHUTDOWN_S)

    app = FastAPI(
        title="nightshift batch",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_bytes + _MULTIPART_SLACK)
    app.state.nightshift = state  # where every handler finds it (``state.server_state``)
    app.include_router(openai_router())
    app.include_router(anthropic_router())
    return app


def serve(settings: ServeSettings) -> None:
    """Serve until SIGTERM or Ctrl-C; the running job stops gracefully and carries on
    at the next start."""
    import uvicorn

    check_exposure(settings.host, settings.api_key)
    sock = bind(settings.host, settings.port)  # before the queue starts: a taken port
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=10,
    )
    uvicorn.Server(config).run(sockets=[sock])


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the app starts: a port another server holds
    is one message and exit 2, and never a second queue driving the same store."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(
            f"--port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
            "is another server running there? Stop it or pick another --port"
        ) from None
    sock.set_inheritable(True)
    return sock
