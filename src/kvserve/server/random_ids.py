"""Random alphanumeric ids (completion ids, tool-call ids), as llama-server's ``random_string``
makes them: uniform over [0-9A-Za-z], from a generator seeded by the OS. They name responses;
they guard nothing, so one generator per process seeded once serves (a read of the OS's random
source per id was a visible cost of every request on some machines)."""

from __future__ import annotations

import os
import random
import string

ALNUM = string.digits + string.ascii_uppercase + string.ascii_lowercase
_rng = random.Random(os.urandom(32))


def random_alnum(n: int) -> str:
    return "".join(_rng.choices(ALNUM, k=n))
