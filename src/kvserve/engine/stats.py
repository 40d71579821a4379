"""Engine counters behind /metrics (llama-server names) and the per-request log line."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class EngineStats:
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_tokens_max: int = 0
    busy_slots_sum: int = 0
    # since the last scrape (llama-server resets these buckets on each /metrics read)
    bucket_prompt_tokens: int = 0
    bucket_prompt_s: float = 0.0
    bucket_predicted_tokens: int = 0
    bucket_predicted_s: float = 0.0
    requests_finished: int = 0
    scheduler_s: float = 0.0  # Python time in schedule() + commit() (sampling included)
    forward_s: float = 0.0  # time in runner.run()
    requests_cancelled: int = 0
    t_start: float = field(default_factory=time.time)

    def snapshot(self, reset_buckets: bool = True) -> dict[str, float]:
        out = {
            "prompt_tokens_total": self.prompt_tokens_total,
            "prompt_tokens_cached_total": self.prompt_tokens_cached_total,
            "prompt_seconds_total": self.prompt_seconds_total,
            "tokens_predicted_total": self.tokens_predicted_total,
            "tokens_predicted_seconds_total": self.tokens_predicted_seconds_total,
            "n_decode_total": self.n_decode_total,
            "n_tokens_max": self.n_tokens_max,
            "prompt_tokens_seconds": self.bucket_prompt_tokens / self.bucket_prompt_s if self.bucket_prompt_s else 0.0,
            "predicted_tokens_seconds": (
                self.bucket_predicted_tokens / self.bucket_predicted_s if self.bucket_predicted_s else 0.0
            ),
            "n_busy_slots_per_decode": self.busy_slots_sum / self.n_decode_total if self.n_decode_total else 0.0,
        }
        if reset_buckets:
            self.bucket_prompt_tokens = self.bucket_predicted_tokens = 0
            self.bucket_prompt_s = self.bucket_predicted_s = 0.0
        return out
