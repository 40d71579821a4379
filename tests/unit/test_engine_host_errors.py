"""An exception in the engine process reaches the client as it would from the engine in the
serving process: ``error_reply`` (engine side) then ``reraise`` (HTTP side) give the same
status, type and message from ``server.errors.from_exception`` as the exception itself."""

from __future__ import annotations

import pickle

import pytest

from kvserve.engine.errors import EngineError
from kvserve.engine.host import error_reply
from kvserve.server.errors import from_exception
from kvserve.server.remote_engine import reraise


class _Coded(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@pytest.mark.parametrize("exc", [
    EngineError("no such slot", 400, "invalid_request_error", {"id_slot": 9}),
    EngineError("This server does not support slots action.", 501, "not_supported_error"),
    ValueError("bad pooling"),  # a 400 in one process
    _Coded("busy", 503),
    RuntimeError("boom"),
    KeyError("k"),
    RuntimeError(),
])
def test_the_same_error_across_the_pipe(exc: BaseException) -> None:
    wire = pickle.loads(pickle.dumps(error_reply(exc)))  # plain data, as the pipe carries it
    with pytest.raises(Exception) as got:
        reraise(wire)
    a, b = from_exception(exc), from_exception(got.value)
    assert (a.code, a.body()) == (b.code, b.body())
