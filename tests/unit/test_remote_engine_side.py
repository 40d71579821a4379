"""``RemoteEngine`` on a pipe it did not start (an HTTP process of several, ``server/http_workers``):
its request ids, its readiness, and the heap frozen once it is ready."""

from __future__ import annotations

import gc
import multiprocessing
import time

from kvserve.server.remote_engine import RemoteEngine


def _wait(cond, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_ids_readiness_and_the_frozen_heap() -> None:
    here, there = multiprocessing.Pipe(duplex=True)
    gc.unfreeze()
    try:
        remote = RemoteEngine(4, None, (), lambda: ("tokenizer", "template"), conn=here, workers=3, worker=2,
                              on_exit=lambda code: None)
        assert [remote.new_request_id() for _ in range(3)] == [3, 6, 9]  # ≡ its index mod 3, unique
        assert not remote.ready
        time.sleep(0.2)
        assert gc.get_freeze_count() == 0  # not before the engine has answered
        there.send(("ready", {"n_slots": 4, "n_ctx_slot": 128, "n_vocab": 10, "rerank_template": None,
                              "model_info": {}}))
        assert _wait(lambda: remote.ready)
        assert remote.tokenizer == "tokenizer" and remote.n_ctx_slot == 128
        assert remote.process is None
        assert _wait(lambda: gc.get_freeze_count() > 0)  # start-up's objects out of full collections
        remote.others_ready = lambda: False  # the first of several: ready once the others listen
        assert not remote.ready
        remote.close()
    finally:
        gc.unfreeze()
        there.close()
