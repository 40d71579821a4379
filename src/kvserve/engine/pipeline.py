"""The engine's step loop: schedule → run → commit, with the commit of one step overlapping the
device work of the next when the runner is asynchronous (CUDA).

Without overlap every step is ``plan = schedule()``, ``out = runner.run(plan)``,
``commit(plan, out)``. With overlap a step whose sampling stayed on the device (the sampler's
fast path) is kept *in flight* after its sampling is queued; the next call then

    1. plans the following decode step from it (``lookahead.plan_ahead``: fed tokens, no host
       round trip) and queues it on the device,
    2. commits the step in flight — waits for its tokens (the device is busy with step 1's
       work meanwhile), detokenizes, applies stop strings and limits, emits events,
    3. keeps the new step in flight.

When no step can be planned ahead (a request waits, a sequence needs its token on the host,
pages are short, ...) it commits the step in flight first and then schedules as usual, so every
decision the scheduler makes sees the same state as without overlap; only the moment a step
is launched moves. Seeded sampling draws the same numbers in the same order either way.

    time →        host                                   device
    step N        launch N (queue forward + sampling)    ·
    step N+1      plan N+1 from N's device tokens,       runs N, then N+1
                  launch N+1; commit N (wait, emit)
    step N+2      plan N+2, launch; commit N+1 ...       runs N+2

``KVSERVE_OVERLAP=0`` turns it off; without CUDA it is off unless asked for (the CPU runner's
``run`` returns only when the step is done, so there is nothing to overlap).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from ..plan import Plan
from .lookahead import plan_ahead
from .scheduler import Launched, Scheduler

log = logging.getLogger("kvserve.engine")


def overlap_wanted(runner: Any, asked: bool | None) -> bool:
    """Overlap when asked for (``asked``), else when the runner is asynchronous; never when
    ``KVSERVE_OVERLAP=0``."""
    if os.environ.get("KVSERVE_OVERLAP", "1") == "0":
        return False
    return bool(getattr(runner, "asynchronous", False)) if asked is None else asked


class StepLoop:
    def __init__(self, scheduler: Scheduler, runner: Any, overlap: bool) -> None:
        self.sch = scheduler
        self.runner = runner
        self.overlap = overlap
        self.in_flight: Launched | None = None
        self.n_ahead = 0  # steps planned ahead of their predecessor's commit

    def step(self, on_plan: Callable[[Plan], None] | None = None) -> bool:
        """One step (see the module docstring). ``on_plan(plan)`` runs before a freshly
        scheduled plan is launched (the engine publishes its snapshot there). Returns whether
        anything ran or was committed."""
        st = self.sch.stats
        prev, self.in_flight = self.in_flight, None
        if prev is not None:
            t0 = time.perf_counter()
            ahead = plan_ahead(self.sch, prev)
            st.scheduler_s += time.perf_counter() - t0
            if ahead is not None:
                self.n_ahead += 1
                nxt = self._launch(ahead, prev)
                self._complete(prev)
                self._keep(nxt)
                return True
            self._complete(prev)
        t0 = time.perf_counter()
        plan = self.sch.schedule()
        if plan is None:  # an idle look is not scheduler time (metrics stay still while idle)
            return prev is not None
        st.scheduler_s += time.perf_counter() - t0
        if on_plan is not None:
            on_plan(plan)
        self._keep(self._launch(plan, None))
        return True

    def drain(self) -> None:
        """Commit the step in flight, if any."""
        prev, self.in_flight = self.in_flight, None
        if prev is not None:
            self._complete(prev)

    def drop(self) -> None:
        """Forget the step in flight without committing it (its requests have been failed)."""
        self.in_flight = None

    # -- halves -------------------------------------------------------------------------------
    def _launch(self, plan: Plan, prev: Launched | None) -> Launched | None:
        st = self.sch.stats
        t0 = time.perf_counter()
        try:
            if prev is None:
                out = self.runner.run(plan)
            else:
                out = self.runner.run(plan, prev_tokens=prev.job.tokens)
        except Exception:  # a failed forward fails its requests, not the server
            log.exception("forward pass failed")
            self.sch.fail_plan(plan, "Compute error.")
            st.forward_s += time.perf_counter() - t0
            return None
        t1 = time.perf_counter()
        st.forward_s += t1 - t0
        launched = self.sch.launch(plan, out)
        st.scheduler_s += time.perf_counter() - t1
        return launched

    def _complete(self, launched: Launched) -> None:
        t0 = time.perf_counter()
        self.sch.complete(launched)
        self.sch.stats.scheduler_s += time.perf_counter() - t0

    def _keep(self, launched: Launched | None) -> None:
        if launched is None:
            return
        if self.overlap and getattr(launched.job, "tokens", None) is not None:
            self.in_flight = launched
        else:
            self._complete(launched)
