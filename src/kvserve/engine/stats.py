"""Engine counters behind /metrics (llama-server names) and the per-request log line."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import ttft_trace


def timings(n_prompt: int, n_cached: int, n_decoded: int, prompt_ms: float, predicted_ms: float) -> dict[str, float]:
    """llama-server's ``timings``: ``cache_n`` reused, ``prompt_n`` evaluated, rates over
    ``predicted_n - 1`` decode steps (the first token comes from the prompt's logits); 0
    wherever a divisor is 0."""
    prompt_n = max(0, n_prompt - n_cached)
    pred_steps = max(0, n_decoded - 1)
    return {
        "cache_n": n_cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_n and prompt_ms > 0 else 0.0,
        "predicted_n": n_decoded,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / pred_steps if pred_steps else 0.0,
        "predicted_per_second": 1e3 * pred_steps / predicted_ms if pred_steps and predicted_ms > 0 else 0.0,
    }


STAGES = ("intake", "queue", "prefill")


@dataclass
class EngineStats:
    """Cumulative counters, changed on the engine thread only (snapshots copy them)."""

    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_tokens_max: int = 0
    busy_slots_sum: int = 0
    # Behind llama-server's throughput gauges, which cover the time since the previous
    # /metrics scrape: the scraper takes the growth of these between its reads.
    rate_prompt_tokens: int = 0
    rate_prompt_s: float = 0.0
    rate_predicted_tokens: int = 0  # decode steps: n_decoded - 1 per request
    rate_predicted_s: float = 0.0
    requests_finished: int = 0
    scheduler_s: float = 0.0  # Python time in schedule() + commit() (sampling included)
    forward_s: float = 0.0  # time in runner.run()
    device_wait_s: float = 0.0  # of scheduler_s: waiting for the device's sampled tokens (fast path)
    requests_cancelled: int = 0
    preemptions: int = 0  # sequences whose KV pages were taken back (recomputed later)
    # A request's time to its first token, by stage, summed over the requests that got one:
    # intake (the server's validation and tokenization, up to the engine's queue), queue (until
    # admitted to a slot), prefill (admission to the first token sampled: waiting for a shared
    # prefix, the prompt's steps)
    first_tokens: int = 0
    stage_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    t_start: float = field(default_factory=time.time)

    def counters(self) -> dict[str, float]:
        """llama-server's cumulative metrics (the throughput gauges come from the scraper)."""
        return {
            "prompt_tokens_total": self.prompt_tokens_total,
            "prompt_tokens_cached_total": self.prompt_tokens_cached_total,
            "prompt_seconds_total": self.prompt_seconds_total,
            "tokens_predicted_total": self.tokens_predicted_total,
            "tokens_predicted_seconds_total": self.tokens_predicted_seconds_total,
            "n_decode_total": self.n_decode_total,
            "n_tokens_max": self.n_tokens_max,
            "n_busy_slots_per_decode": (
                self.busy_slots_sum / self.n_decode_total if self.n_decode_total else 0.0
            ),
        }

    def first_token(self, t_received: float, t_submitted: float, t_admitted: float, now: float) -> None:
        """A request's first token: its stages (a time of 0 is unknown: that stage counts 0)."""
        t_submitted = t_submitted or t_admitted
        t_received = t_received or t_submitted
        ttft_trace.record(t_received, t_submitted, t_admitted, now)
        st = self.stage_s
        st["intake"] += max(0.0, t_submitted - t_received)
        st["queue"] += max(0.0, t_admitted - t_submitted)
        st["prefill"] += max(0.0, now - t_admitted)
        self.first_tokens += 1

    def rates(self) -> tuple[int, float, int, float]:
        return self.rate_prompt_tokens, self.rate_prompt_s, self.rate_predicted_tokens, self.rate_predicted_s


def throughput(now: tuple[int, float, int, float], prev: tuple[int, float, int, float]) -> dict[str, float]:
    """llama-server's ``prompt_tokens_seconds`` / ``predicted_tokens_seconds``: tokens per
    second of the requests finished between two scrapes (0 when none)."""
    pt, ps, gt, gs = (a - b for a, b in zip(now, prev))
    return {
        "prompt_tokens_seconds": pt / ps if ps else 0.0,
        "predicted_tokens_seconds": gt / gs if gs else 0.0,
    }
