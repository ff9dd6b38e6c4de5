"""Helpers of the server tests: a server on 127.0.0.1 in a thread of the test process.

tests/conftest.py registers this module as a plugin (``pytest_plugins``), which
makes :func:`serve_slides` (a fixture) available to the test modules; not a
``conftest.py``, so that the module ``conftest`` keeps meaning tests/conftest.py.
The web stack is optional: the fixture skips without it.
"""

from __future__ import annotations

import contextlib
import threading

import pytest


@contextlib.contextmanager
def running_server(sources, timeout: float = 20.0, **options):
    """Serve ``sources`` on 127.0.0.1 (a free port) in a daemon thread; yield ``(base_url, state)``.

    The server runs with the settings ``wsitool serve`` gives uvicorn (``uvicorn_config``: the
    Host check, the connection bounds); it stops when the block ends (uvicorn's graceful exit,
    bounded by ``timeout``).
    """
    import uvicorn

    from wsitool.serve.app import create_app
    from wsitool.serve.config import ServeConfig
    from wsitool.serve.guard import uvicorn_config
    from wsitool.serve.runner import build_state

    state = build_state(sources, ServeConfig(**options))
    server = uvicorn.Server(uvicorn_config(create_app(state), state.config, host="127.0.0.1", port=0))
    thread = threading.Thread(target=server.run, daemon=True, name="test-server")
    thread.start()
    for _ in range(int(timeout * 50)):
        if server.started or not thread.is_alive():
            break
        threading.Event().wait(0.02)
    assert server.started, "the test server did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        thread.join(timeout)
        state.close()
        assert not thread.is_alive(), "the test server did not stop"


@pytest.fixture
def serve_slides():
    """``serve_slides(sources, **ServeConfig options)``: the :func:`running_server` context manager."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    return running_server
