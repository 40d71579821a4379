"""Fuzz every POST route of /openapi.json with generated JSON bodies: no unexpected 5xx, and
the server keeps serving afterwards (>= 1,000 requests)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .test_http_fake_engine import client

pytestmark = pytest.mark.slow

FIELDS = [
    "prompt", "messages", "content", "tokens", "input", "stream", "n_predict", "max_tokens", "temperature",
    "top_k", "top_p", "min_p", "stop", "seed", "n_probs", "logprobs", "top_logprobs", "id_slot", "cache_prompt",
    "n_keep", "n_cmpl", "n", "logit_bias", "samplers", "response_fields", "stream_options", "input_prefix",
    "input_suffix", "with_pieces", "add_special", "parse_special", "dry_sequence_breakers", "repeat_last_n",
    "t_max_predict_ms", "return_tokens", "post_sampling_probs", "filename", "chat_template_kwargs",
    "encoding_format", "mirostat", "typical_p", "n_indent", "timings_per_token", "return_progress",
]
ALLOWED_5XX = {501, 503}

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]), "content": values}),
    max_size=3,
)
bodies = st.dictionaries(st.sampled_from(FIELDS), values, max_size=6)


@pytest.fixture(scope="module")
def app_client():
    c, engine = client()
    with c:  # one event loop for every request, as a server has (not a thread and loop per request)
        yield c


@pytest.fixture(scope="module")
def post_paths(app_client) -> list[str]:
    """Every POST route of the app's /openapi.json (read once: the schema is fixed)."""
    spec = app_client.get("/openapi.json").json()
    return sorted(p for p, ops in spec["paths"].items() if "post" in ops and "{" not in p)


@settings(max_examples=1100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_generated_requests_never_5xx(app_client, post_paths, data):
    path = data.draw(st.sampled_from(post_paths))
    body = data.draw(bodies)
    if data.draw(st.booleans()):
        body["messages"] = data.draw(messages)
    body["n_predict"] = data.draw(st.integers(-2, 8)) if "n_predict" in body else 4
    r = app_client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code < 500 or r.status_code in ALLOWED_5XX, (path, body, r.status_code, r.text[:300])
    if r.headers.get("content-type", "").startswith("application/json"):
        if r.status_code >= 400:
            err = r.json()["error"]
            assert {"code", "message", "type"} <= set(err)


def test_still_healthy_after_fuzzing(app_client):
    assert app_client.get("/health").status_code == 200
    assert app_client.get("/openapi.json").status_code == 200
