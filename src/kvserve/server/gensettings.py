"""``generation_settings`` (``task_params::to_json``): the sampler's part comes from
``SamplingParams.to_json``, the task part (stop, n_predict, stream, chat fields…) from here.

The metrics-only variant (``/props``, ``/slots``) drops ``dry_sequence_breakers, stop,
logit_bias, grammar, grammar_lazy, grammar_triggers, preserved_tokens``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from kvserve.engine.request import RequestParams
from kvserve.engine.sampling_params import SamplingParams
from kvserve.server.grammar_fields import trigger_json


def task_settings(req: RequestParams, reasoning_format: str = "deepseek", chat_format: str = "Content-only",
                  generation_prompt: str = "") -> dict[str, Any]:
    spec = req.grammar.spec if req.grammar is not None else None
    return {
        "stop": list(req.stop),
        "max_tokens": req.n_predict,
        "n_predict": req.n_predict,
        "n_keep": req.n_keep,
        "n_discard": req.n_discard,
        "stream": req.stream,
        "grammar": spec.describe() if spec is not None else "",
        "grammar_lazy": spec.lazy if spec is not None else False,
        "grammar_triggers": [trigger_json(t) for t in spec.triggers] if spec is not None else [],
        "preserved_tokens": [],
        "chat_format": chat_format,
        "reasoning_format": reasoning_format,
        "reasoning_in_content": req.stream and reasoning_format == "deepseek-legacy",
        "generation_prompt": generation_prompt,
        "speculative.types": "none",
        "timings_per_token": req.timings_per_token,
        "post_sampling_probs": req.post_sampling_probs,
        "lora": [],
    }


def generation_settings(req: RequestParams, eog_ids: Iterable[int] = (), metrics_only: bool = False,
                        **task: Any) -> dict[str, Any]:
    sampling: SamplingParams = req.sampling if req.sampling is not None else SamplingParams()
    out = sampling.to_json(metrics_only, eog_ids=eog_ids, extra=task_settings(req, **task))
    # n_probs / post_sampling_probs are request-level in kvserve; keep the request's values.
    if "n_probs" in out:
        out["n_probs"] = req.n_probs
    return out


def default_settings(sampling_defaults: dict[str, Any], n_predict: int, n_keep: int) -> dict[str, Any]:
    """``/props`` ``default_generation_settings.params``: server defaults, metrics-only."""
    names = {f.name for f in dataclasses.fields(SamplingParams)}
    sampling = SamplingParams(**{k: v for k, v in sampling_defaults.items() if k in names})
    req = RequestParams(n_predict=n_predict, n_keep=n_keep, n_probs=sampling.n_probs, sampling=sampling)
    return generation_settings(req, metrics_only=True, reasoning_format="none")
