"""What the engine and scheduler harnesses share: a request's event sink and greedy sampling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvserve.engine.request import ErrorEvent, FinalEvent, TokenEvent
from kvserve.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, top_k=1)


@dataclass
class Collector:
    """A request's ``emit``: every event in order."""

    events: list[Any] = field(default_factory=list)

    def __call__(self, ev: Any) -> None:
        self.events.append(ev)

    @property
    def terminal(self) -> list[Any]:
        return [e for e in self.events if isinstance(e, (FinalEvent, ErrorEvent))]

    @property
    def final(self) -> FinalEvent | None:
        return next((e for e in self.events if isinstance(e, FinalEvent)), None)

    @property
    def error(self) -> ErrorEvent | None:
        return next((e for e in self.events if isinstance(e, ErrorEvent)), None)

    @property
    def done(self) -> bool:
        return self.final is not None or self.error is not None

    @property
    def streamed(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TokenEvent))
