"""``generation_settings`` (``task_params::to_json``) in llama-server's key order.

Floats are shown as the float32 the C++ server stores (0.8 -> 0.800000011920929), so clients
comparing against llama-server see the same numbers. The metrics-only variant (``/props``,
``/slots``) drops ``dry_sequence_breakers, stop, logit_bias, grammar, grammar_lazy,
grammar_triggers, preserved_tokens``.
"""

from __future__ import annotations

import struct
from typing import Any

from kvserve.engine.request import RequestParams
from kvserve.server.settings import SAMPLING_DEFAULTS

_FLOATS = ("temperature", "dynatemp_range", "dynatemp_exponent", "top_p", "min_p", "top_n_sigma",
           "xtc_probability", "xtc_threshold", "typical_p", "repeat_penalty", "presence_penalty",
           "frequency_penalty", "dry_multiplier", "dry_base", "mirostat_tau", "mirostat_eta",
           "adaptive_target", "adaptive_decay")
_METRICS_ONLY_DROP = frozenset(("dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy",
                                "grammar_triggers", "preserved_tokens"))


def f32(x: float) -> float:
    try:
        return float(struct.unpack("<f", struct.pack("<f", float(x)))[0])
    except (OverflowError, struct.error):
        return float(x)


def generation_settings(
    req: RequestParams,
    sv: dict[str, Any],
    metrics_only: bool = False,
    reasoning_format: str = "deepseek",
    chat_format: str = "Content-only",
    generation_prompt: str = "",
) -> dict[str, Any]:
    """``sv``: sampling values keyed by request-field name (``CompletionParams.sampling_values``)."""

    def g(k: str) -> Any:
        v = sv.get(k, SAMPLING_DEFAULTS.get(k))
        return f32(v) if k in _FLOATS and v is not None else v

    out: dict[str, Any] = {"seed": int(g("seed"))}
    for k in ("temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
              "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n",
              "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base",
              "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "mirostat",
              "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay"):
        out[k] = g(k)
    out["stop"] = list(req.stop)
    out["max_tokens"] = req.n_predict
    out["n_predict"] = req.n_predict
    out["n_keep"] = req.n_keep
    out["n_discard"] = req.n_discard
    out["ignore_eos"] = bool(g("ignore_eos"))
    out["stream"] = req.stream
    out["logit_bias"] = [{"bias": f32(b), "token": int(t)} for t, b in (g("logit_bias") or [])]
    out["n_probs"] = req.n_probs
    out["min_keep"] = g("min_keep")
    out["grammar"] = ""
    out["grammar_lazy"] = False
    out["grammar_triggers"] = []
    out["preserved_tokens"] = []
    out["chat_format"] = chat_format
    out["reasoning_format"] = reasoning_format
    out["reasoning_in_content"] = req.stream and reasoning_format == "deepseek-legacy"
    out["generation_prompt"] = generation_prompt
    out["samplers"] = list(g("samplers"))
    out["speculative.types"] = "none"
    out["timings_per_token"] = req.timings_per_token
    out["post_sampling_probs"] = req.post_sampling_probs
    out["backend_sampling"] = bool(g("backend_sampling"))
    out["lora"] = []
    if metrics_only:
        for k in _METRICS_ONLY_DROP:
            out.pop(k, None)
    return out


def default_settings(sampling_defaults: dict[str, Any], n_predict: int, n_keep: int) -> dict[str, Any]:
    """``/props`` ``default_generation_settings.params``: server defaults, metrics-only."""
    req = RequestParams(n_predict=n_predict, n_keep=n_keep)
    sv = {**SAMPLING_DEFAULTS, **sampling_defaults}
    return generation_settings(req, sv, metrics_only=True, reasoning_format="none")
