"""Plain, immutable views of the engine's state for the HTTP side (``/slots``; no JSON here).

The engine thread builds them; the server renders them in llama-server's shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .sampling_params import SamplingParams


@dataclass(frozen=True)
class NextToken:
    """A slot's generation state after its last sampled token (``/slots`` ``next_token``)."""

    has_next_token: bool = False
    has_new_line: bool = False
    n_remain: int = -1  # tokens left before n_predict; -1 without a limit
    n_decoded: int = 0


IDLE = NextToken()


@dataclass(frozen=True)
class SlotView:
    """One slot. ``id_task`` is -1 until the slot ran a request; the counters below describe
    the running request, or the last one once it ended."""

    id: int
    n_ctx: int
    is_processing: bool
    id_task: int
    n_prompt_tokens: int  # tokens with KV: the running request's n_computed, else the last list
    n_prompt_tokens_processed: int  # prompt tokens run through the model
    n_prompt_tokens_cache: int  # prompt tokens reused from the cache at admission
    sampling: SamplingParams | None  # the request's sampler parameters (None: defaults)
    next_token: NextToken


def slot_views(slots: Any, running: Any) -> tuple[SlotView, ...]:
    """``slots``: the scheduler's ``Slot`` list; ``running``: request id -> ``Sequence``."""
    out = []
    for s in slots:
        seq = running.get(s.seq_id) if s.seq_id is not None else None
        out.append(SlotView(
            id=s.id,
            n_ctx=s.n_ctx,
            is_processing=s.busy,
            id_task=s.id_task,
            n_prompt_tokens=seq.n_computed if seq is not None else len(s.prompt_tokens),
            n_prompt_tokens_processed=seq.n_evaluated_prompt if seq is not None else s.n_prompt_processed,
            n_prompt_tokens_cache=s.n_prompt_cache,
            sampling=s.sampling,
            next_token=s.next_token,
        ))
    return tuple(out)
