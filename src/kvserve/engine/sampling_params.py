"""Per-request sampling parameters with llama-server names and defaults.

``SamplingParams`` holds every field of llama.cpp's ``common_params_sampling`` that a request can
set. Validation and clamping (spec §2.4) belong to the HTTP schema; this module only normalises
types (lists to tuples, sampler names to canonical names) and renders the sampling part of
``generation_settings``.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

# Canonical sampler names in llama.cpp's order of the enum, with their one-char codes.
SAMPLER_CHARS: dict[str, str] = {
    "d": "dry",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "s": "top_n_sigma",
    "m": "min_p",
    "t": "temperature",
    "x": "xtc",
    "i": "infill",
    "e": "penalties",
    "a": "adaptive_p",
}
CANONICAL_SAMPLERS = frozenset(SAMPLER_CHARS.values())
SAMPLER_ALIASES: dict[str, str] = {
    "top-k": "top_k",
    "top-p": "top_p",
    "top-n-sigma": "top_n_sigma",
    "nucleus": "top_p",
    "typical-p": "typ_p",
    "typical_p": "typ_p",
    "typical": "typ_p",
    "typ-p": "typ_p",
    "typ": "typ_p",
    "min-p": "min_p",
    "temp": "temperature",
    "adaptive-p": "adaptive_p",
}
DEFAULT_SAMPLERS: tuple[str, ...] = (
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
)
DEFAULT_DRY_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")
RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED; -1 in a request means the same

# Key order of llama-server's task_params::to_json. Keys marked in METRICS_ONLY_OMITTED are left
# out of the "metrics only" variant used by /props and /slots.
GENERATION_SETTINGS_ORDER: tuple[str, ...] = (
    "seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
    "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n",
    "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base",
    "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "mirostat",
    "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay", "stop", "max_tokens",
    "n_predict", "n_keep", "n_discard", "ignore_eos", "stream", "logit_bias", "n_probs",
    "min_keep", "grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens", "chat_format",
    "reasoning_format", "reasoning_in_content", "generation_prompt", "samplers",
    "speculative.types", "timings_per_token", "post_sampling_probs", "backend_sampling", "lora",
)
METRICS_ONLY_OMITTED = frozenset(
    {"dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy",
     "grammar_triggers", "preserved_tokens"}
)


def parse_samplers(value: str | Iterable[Any]) -> tuple[str, ...]:
    """llama.cpp's ``samplers`` field: a string of chars (``"edskypmxt"``) or a list of names.

    Names may be canonical (``top_k``) or aliases (``top-k``, ``nucleus``, ``temp`` …). Unknown
    names and chars are dropped, as llama.cpp does (it only logs a warning).
    """
    if isinstance(value, str):
        return tuple(SAMPLER_CHARS[c] for c in value if c in SAMPLER_CHARS)
    out: list[str] = []
    for name in value:
        if not isinstance(name, str):
            continue
        if name in CANONICAL_SAMPLERS:
            out.append(name)
        elif name in SAMPLER_ALIASES:
            out.append(SAMPLER_ALIASES[name])
    return tuple(out)


def f32(x: float) -> float | None:
    """The value as llama-server prints a C ``float`` (rounded to float32); non-finite → None."""
    if not math.isfinite(x):
        return None
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return None


@dataclass(frozen=True)
class SamplingParams:
    """Sampling fields of a request (llama-server names, llama.cpp defaults).

    ``seed``: uint32; -1 and 0xFFFFFFFF draw a random seed per sequence.
    ``repeat_last_n`` / ``dry_penalty_last_n``: window of accepted tokens (prompt + generated);
    0 disables, -1 means the whole context.
    ``logit_bias``: (token_id, bias) pairs applied in order (duplicates add up); -inf bans.
    ``ignore_eos``: every end-of-generation id is banned by the sampler (and listed with a null
    bias by ``to_json`` when ``eog_ids`` are given).
    ``samplers``: canonical names (a char string or aliases are normalised on construction).
    """

    seed: int = -1
    temperature: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    typical_p: float = 1.0
    repeat_last_n: int = 64
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.9
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    n_probs: int = 0
    min_keep: int = 0
    post_sampling_probs: bool = False
    backend_sampling: bool = False

    def __post_init__(self) -> None:
        samplers: Any = self.samplers
        if isinstance(samplers, str) or any(s not in CANONICAL_SAMPLERS for s in samplers):
            samplers = parse_samplers(samplers)
        object.__setattr__(self, "samplers", tuple(samplers))
        object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        object.__setattr__(
            self, "logit_bias", tuple((int(t), float(b)) for t, b in self.logit_bias)
        )

    @property
    def seed_u32(self) -> int:
        return int(self.seed) & 0xFFFFFFFF

    @property
    def is_random_seed(self) -> bool:
        return self.seed_u32 == RANDOM_SEED

    def to_json(
        self,
        metrics_only: bool = False,
        *,
        eog_ids: Iterable[int] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``generation_settings`` in llama-server's key order.

        The sampling keys come from this object; every other key (``stop``, ``n_predict``,
        ``stream``, ``lora`` …) is taken from ``extra`` when present there, in its llama-server
        place. Keys of ``extra`` unknown to that order are appended at the end. With
        ``ignore_eos``, each id of ``eog_ids`` is appended to ``logit_bias`` with bias null, as
        llama-server shows them.
        """
        bias = [{"bias": f32(b), "token": t} for t, b in self.logit_bias]
        if self.ignore_eos:
            bias += [{"bias": None, "token": int(t)} for t in eog_ids]
        own: dict[str, Any] = {
            "seed": self.seed_u32,
            "temperature": f32(self.temperature),
            "dynatemp_range": f32(self.dynatemp_range),
            "dynatemp_exponent": f32(self.dynatemp_exponent),
            "top_k": int(self.top_k),
            "top_p": f32(self.top_p),
            "min_p": f32(self.min_p),
            "top_n_sigma": f32(self.top_n_sigma),
            "xtc_probability": f32(self.xtc_probability),
            "xtc_threshold": f32(self.xtc_threshold),
            "typical_p": f32(self.typical_p),
            "repeat_last_n": int(self.repeat_last_n),
            "repeat_penalty": f32(self.repeat_penalty),
            "presence_penalty": f32(self.presence_penalty),
            "frequency_penalty": f32(self.frequency_penalty),
            "dry_multiplier": f32(self.dry_multiplier),
            "dry_base": f32(self.dry_base),
            "dry_allowed_length": int(self.dry_allowed_length),
            "dry_penalty_last_n": int(self.dry_penalty_last_n),
            "dry_sequence_breakers": list(self.dry_sequence_breakers),
            "mirostat": int(self.mirostat),
            "mirostat_tau": f32(self.mirostat_tau),
            "mirostat_eta": f32(self.mirostat_eta),
            "adaptive_target": f32(self.adaptive_target),
            "adaptive_decay": f32(self.adaptive_decay),
            "ignore_eos": bool(self.ignore_eos),
            "logit_bias": bias,
            "n_probs": int(self.n_probs),
            "min_keep": int(self.min_keep),
            "samplers": list(self.samplers),
            "post_sampling_probs": bool(self.post_sampling_probs),
            "backend_sampling": bool(self.backend_sampling),
        }
        extra = extra or {}
        out: dict[str, Any] = {}
        for key in GENERATION_SETTINGS_ORDER:
            if metrics_only and key in METRICS_ONLY_OMITTED:
                continue
            if key in own:
                out[key] = own[key]
            elif key in extra:
                out[key] = extra[key]
        for key, value in extra.items():
            if key not in out and key not in own and not (metrics_only and key in METRICS_ONLY_OMITTED):
                out[key] = value
        return out
