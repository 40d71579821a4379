"""A ``GenerationRequest`` crosses to the engine process with its prompt as bytes alone when it has
them (``prompt_key``): the same request on the other side, without the list's pickling."""

from __future__ import annotations

import pickle
import random

from kvserve.engine.request import CacheIdentity, GenerationRequest, RequestParams
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.slots import prompt_key, token_bytes


def _request(tokens: list[int], key: bytes | None) -> GenerationRequest:
    params = RequestParams(n_predict=7, stop=["\n"], sampling=SamplingParams(temperature=0.0, seed=5))
    return GenerationRequest(id=3, prompt_tokens=tokens, params=params, identity=CacheIdentity(tenant="k"),
                             index=1, t_received=1.5, prompt_key=key)


def test_a_request_with_its_bytes_pickles_without_the_token_list() -> None:
    rng = random.Random(0)
    tokens = [rng.randrange(49152) for _ in range(2000)] + [0, 2**31 - 1]
    ok, key = prompt_key(tokens, 2**31)
    assert ok and key == token_bytes(tokens)
    req = _request(tokens, key)
    data = pickle.dumps(req, protocol=pickle.HIGHEST_PROTOCOL)
    # the key's bytes and the parameters, not a second copy of the prompt as a list of ints
    assert len(data) < len(key) + 2048
    back = pickle.loads(data)
    assert back == req and back.prompt_key == key
    assert type(back.prompt_tokens) is list and all(type(t) is int for t in back.prompt_tokens)
    assert back.prompt_tokens == tokens and back.params == req.params and back.identity == req.identity
    assert req.prompt_tokens is tokens  # pickling leaves the sender's request as it was


def test_a_request_without_bytes_pickles_its_list() -> None:
    for tokens in ([5, 6, 7], []):
        req = _request(tokens, None)
        back = pickle.loads(pickle.dumps(req))
        assert back == req and back.prompt_tokens == tokens and back.prompt_key is None
    empty = _request([], b"")  # an empty prompt's bytes
    assert pickle.loads(pickle.dumps(empty)).prompt_tokens == []
