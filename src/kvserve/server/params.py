"""Completion request fields (llama-server §2.4) -> ``RequestParams`` + sampling parameters.

One function, ``parse_completion_params``, evaluates every field of the completion schema in
llama-server's order with its aliases, limits and hard limits (see ``fields.py``). Fields we
do not implement are refused first (``unsupported.py``); unknown fields are ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kvserve.engine.request import RequestParams
from kvserve.engine.sampling_params import SamplingParams, parse_samplers
from kvserve.grammar.spec import GrammarSpec
from kvserve.server import fields as F
from kvserve.server.budget_fields import reasoning_budget
from kvserve.server.chat_parsing import ChatSyntax
from kvserve.server.engine_api import TokenizerLike
from kvserve.server.errors import invalid
from kvserve.server.settings import SAMPLING_DEFAULTS, ServerSettings
from kvserve.server.grammar_fields import grammar_spec
from kvserve.server.unsupported import check_completion

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
BANNED = float("-inf")


@dataclass
class CompletionParams:
    """Everything one completion request asked for, resolved against the server defaults."""

    req: RequestParams
    eog_ids: tuple[int, ...] = ()  # listed with a null bias in generation_settings (ignore_eos)
    n_cmpl: int = 1
    verbose: bool = False
    include_usage: bool = False
    sse_ping_interval: int = 30
    response_fields: list[str] = field(default_factory=list)
    reasoning_format: str = "deepseek"
    chat_format: str = "Content-only"
    generation_prompt: str = ""
    chat_syntax: ChatSyntax | None = None  # chat requests: how the output is parsed
    grammar: GrammarSpec | None = None  # compiled into req.grammar before submission
    # (prompt, its ``token_bytes`` or None) per prompt, as validated (``completions.prepare``):
    # handed to the engine with the requests of that very prompt list (``build_requests``)
    prompt_keys: list[tuple[list[int], bytes | None]] = field(default_factory=list, repr=False)

    def child(self, j: int) -> RequestParams:
        """Parameters of the j-th of n_cmpl parallel samples: seed + j (unless random), any slot."""
        if j == 0:
            return self.req
        sampling: SamplingParams = self.req.sampling
        if not sampling.is_random_seed:
            sampling = dataclasses.replace(sampling, seed=(sampling.seed_u32 + j) & 0xFFFFFFFF)
        return dataclasses.replace(self.req, id_slot=-1, sampling=sampling)


def make_sampling(values: dict[str, Any]) -> SamplingParams:
    """``SamplingParams`` from request-named values (the names are the same)."""
    names = {f.name for f in dataclasses.fields(SamplingParams)}
    return SamplingParams(**{k: v for k, v in values.items() if k in names})


def _logit_bias(data: dict[str, Any], tok: TokenizerLike) -> list[tuple[int, float]]:
    raw = data["logit_bias"]
    n_vocab = tok.n_vocab
    out: list[tuple[int, float]] = []

    def bias_of(v: Any) -> float | None:
        if isinstance(v, bool):
            return BANNED if v is False else None
        if isinstance(v, (int, float)):
            return float(v)
        return None

    def add(key: Any, b: float) -> None:
        if isinstance(key, int) and not isinstance(key, bool):
            if 0 <= key < n_vocab:
                out.append((key, b))
        elif isinstance(key, str):
            out.extend((t, b) for t in tok.encode(key, False, False))

    if isinstance(raw, list):
        for el in raw:
            if isinstance(el, list) and len(el) == 2 and (b := bias_of(el[1])) is not None:
                add(el[0], b)
    elif isinstance(raw, dict):
        for k, v in raw.items():
            if (b := bias_of(v)) is None:
                continue
            try:
                add(int(k, 10), b)
            except ValueError:
                add(k, b)
    return out


def _samplers(v: Any, current: list[str]) -> list[str]:
    return list(parse_samplers(v)) if isinstance(v, (list, str)) else current


def parse_completion_params(data: dict[str, Any], s: ServerSettings, tok: TokenizerLike) -> CompletionParams:
    check_completion(data, s.unsupported_features)
    grammar = grammar_spec(data, s.grammar, tok)
    budget = reasoning_budget(data, s, tok)
    d = s.sampling_defaults
    sv: dict[str, Any] = {k: d.get(k, v) for k, v in SAMPLING_DEFAULTS.items()}
    sv["samplers"] = list(sv["samplers"])
    sv["dry_sequence_breakers"] = list(sv["dry_sequence_breakers"])
    sv["logit_bias"] = list(sv["logit_bias"])

    verbose = F.get_bool(data, "verbose", s.verbosity > 9)
    timings_per_token = F.get_bool(data, "timings_per_token", False)
    stream = F.get_bool(data, "stream", False)
    include_usage = False
    if isinstance(data.get("stream_options"), dict):
        include_usage = F.get_bool(data["stream_options"], "include_usage", False)
    cache_prompt = F.get_bool(data, "cache_prompt", s.cache_prompt)
    return_tokens = F.get_bool(data, "return_tokens", False)
    return_progress = F.get_bool(data, "return_progress", False)
    ping = F.get_int(data, "sse_ping_interval", s.sse_ping_interval, hard=(-1, F.INT32_MAX))
    n_predict = F.get_int(data, ("n_predict", "max_completion_tokens", "max_tokens"), s.n_predict,
                          hard=(-1, F.INT32_MAX))
    n_indent = F.get_int(data, "n_indent", 0, hard=(0, F.INT32_MAX))
    n_keep = F.get_int(data, "n_keep", s.n_keep, hard=(-1, F.INT32_MAX))
    n_discard = F.get_int(data, "n_discard", 0, hard=(0, F.INT32_MAX))
    n_cmpl = F.get_int(data, ("n_cmpl", "n"), 1, hard=(1, max(1, s.n_parallel)))
    n_cache_reuse = F.get_int(data, "n_cache_reuse", s.cache_reuse, hard=(0, F.INT32_MAX))
    t_max_predict_ms = F.get_int(data, "t_max_predict_ms", -1, hard=(-1, F.INT64_MAX))
    rf = data.get("response_fields")
    response_fields = [x for x in rf if isinstance(x, str)] if isinstance(rf, list) else []

    sv["top_k"] = F.get_int(data, "top_k", sv["top_k"], clamp=(0, F.INT32_MAX))
    sv["top_p"] = F.get_float(data, "top_p", sv["top_p"], clamp=(0.0, 1.0))
    sv["min_p"] = F.get_float(data, "min_p", sv["min_p"], clamp=(0.0, 1.0))
    sv["top_n_sigma"] = F.get_float(data, "top_n_sigma", sv["top_n_sigma"])
    sv["xtc_probability"] = F.get_float(data, "xtc_probability", sv["xtc_probability"], clamp=(0.0, 1.0))
    sv["xtc_threshold"] = F.get_float(data, "xtc_threshold", sv["xtc_threshold"], clamp=(0.0, 1.0))
    sv["typical_p"] = F.get_float(data, "typical_p", sv["typical_p"])
    sv["temperature"] = F.get_float(data, "temperature", sv["temperature"], clamp=(0.0, float("inf")))
    sv["dynatemp_range"] = F.get_float(data, "dynatemp_range", sv["dynatemp_range"])
    sv["dynatemp_exponent"] = F.get_float(data, "dynatemp_exponent", sv["dynatemp_exponent"])
    sv["repeat_last_n"] = F.get_int(data, "repeat_last_n", sv["repeat_last_n"], hard=(0, F.INT32_MAX))
    for k in ("repeat_penalty", "frequency_penalty", "presence_penalty", "dry_multiplier"):
        sv[k] = F.get_float(data, k, sv[k])
    dry_base = F.get_float(data, "dry_base", sv["dry_base"])
    sv["dry_base"] = dry_base if dry_base >= 1.0 else d.get("dry_base", SAMPLING_DEFAULTS["dry_base"])
    sv["dry_allowed_length"] = F.get_int(data, "dry_allowed_length", sv["dry_allowed_length"], hard=(0, F.INT32_MAX))
    sv["dry_penalty_last_n"] = F.get_int(data, "dry_penalty_last_n", sv["dry_penalty_last_n"], hard=(0, F.INT32_MAX))
    sv["mirostat"] = F.get_int(data, "mirostat", sv["mirostat"], clamp=(0, 2))
    sv["mirostat_tau"] = F.get_float(data, "mirostat_tau", sv["mirostat_tau"])
    sv["mirostat_eta"] = F.get_float(data, "mirostat_eta", sv["mirostat_eta"])
    sv["adaptive_target"] = F.get_float(data, "adaptive_target", sv["adaptive_target"], clamp=(-3.4e38, 1.0))
    sv["adaptive_decay"] = F.get_float(data, "adaptive_decay", sv["adaptive_decay"], hard=(0.0, 0.99))
    if F.present(data, "seed"):
        sv["seed"] = F.get_int(data, "seed", 0) & 0xFFFFFFFF
    n_probs = max(0, F.get_int(data, ("n_probs", "logprobs"), sv["n_probs"]))
    sv["n_probs"] = n_probs
    sv["min_keep"] = F.get_int(data, "min_keep", sv["min_keep"], hard=(0, F.INT32_MAX))
    sv["backend_sampling"] = F.get_bool(data, "backend_sampling", sv["backend_sampling"])
    post_sampling_probs = F.get_bool(data, "post_sampling_probs", False)
    sv["post_sampling_probs"] = post_sampling_probs

    if data.get("dry_sequence_breakers") is not None:
        br = data["dry_sequence_breakers"]
        if not isinstance(br, list) or not br or not all(isinstance(b, str) for b in br):
            raise F.FieldError("dry_sequence_breakers",
                               "Error: dry_sequence_breakers must be a non-empty array of strings")
        sv["dry_sequence_breakers"] = list(br)

    reasoning_format = F.get_str(data, "reasoning_format", s.reasoning_format)
    if reasoning_format not in REASONING_FORMATS:
        raise F.FieldError("reasoning_format", f"Unknown reasoning format: {reasoning_format}")
    generation_prompt = F.get_str(data, "generation_prompt", "")

    if data.get("logit_bias") is not None:
        sv["logit_bias"] = _logit_bias(data, tok)
    # With ignore_eos the sampler bans every end-of-generation id itself.
    sv["ignore_eos"] = F.get_bool(data, "ignore_eos", sv["ignore_eos"])

    stop = list(s.reverse_prompt)
    if data.get("stop") is not None:
        raw = data["stop"]
        words: list[str] = []
        if isinstance(raw, list):
            for w in raw:
                if not isinstance(w, str):
                    raise F.type_error("stop", "string", w)
                if w:
                    words.append(w)
        elif isinstance(raw, str):
            words.append(raw)
        stop = words or list(s.reverse_prompt)

    if data.get("samplers") is not None:
        sv["samplers"] = _samplers(data["samplers"], sv["samplers"])

    id_slot = data.get("id_slot", -1)
    if id_slot is None:
        id_slot = -1
    if isinstance(id_slot, bool) or not isinstance(id_slot, (int, float)):
        raise invalid(f"[json.exception.type_error.302] type must be number, but is {type(id_slot).__name__}")
    if not -1 <= int(id_slot) < s.n_parallel:  # llama-server wraps it modulo n_slots instead
        raise invalid(f"Invalid id_slot: {int(id_slot)} (this server has {s.n_parallel} slots: 0..{s.n_parallel - 1}, "
                      "or -1 for any)")

    sampling = make_sampling(sv)
    req = RequestParams(
        n_predict=n_predict, n_keep=n_keep, n_discard=n_discard, n_indent=n_indent,
        t_max_predict_ms=t_max_predict_ms, stop=stop, stream=stream, cache_prompt=cache_prompt,
        n_cache_reuse=n_cache_reuse, id_slot=int(id_slot), n_probs=n_probs,
        post_sampling_probs=post_sampling_probs, return_tokens=return_tokens,
        timings_per_token=timings_per_token, return_progress=return_progress, sampling=sampling,
        reasoning_budget=budget,
    )
    return CompletionParams(
        req=req, eog_ids=tuple(sorted(int(t) for t in tok.eog_ids)), n_cmpl=n_cmpl, verbose=verbose, include_usage=include_usage,
        sse_ping_interval=ping, response_fields=response_fields, reasoning_format=reasoning_format,
        generation_prompt=generation_prompt, grammar=grammar,
    )
