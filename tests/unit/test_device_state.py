"""Device step state on the CPU: the page table's updates and rows (also for a step that repeats
the one before), and the packed step buffer."""

from __future__ import annotations

import random

import torch

from kvserve.model.backends.device_state import PageTable, StepBuffer


def _table(pt: PageTable) -> list[list[int]]:
    return pt.table.tolist()


def test_page_table_rows_and_updates_over_steps() -> None:
    rnd = random.Random(3)
    pt = PageTable(4, 8, scratch_page=0, device=torch.device("cpu"))
    ref = PageTable(4, 8, scratch_page=0, device=torch.device("cpu"))
    tables = {s: tuple(rnd.sample(range(1, 200), rnd.randint(1, 4))) for s in range(6)}
    steps = []
    for _ in range(60):
        ids = rnd.sample(range(6), rnd.randint(1, 4))
        for s in ids:
            if rnd.random() < 0.2 and len(tables[s]) < 8:  # a page added
                tables[s] = tables[s] + (rnd.randint(1, 200),)
        steps.append((ids, [tables[s] for s in ids]))
        if rnd.random() < 0.5:
            steps.append((list(ids), [tables[s] for s in ids]))  # the same step again
    for ids, tabs in steps:
        rows, idx, val = pt.assign(ids, tabs)
        want = ref._assign(ids, tabs)  # always the full walk
        assert (rows, idx, val) == want
        for p in (pt, ref):
            p.apply(torch.tensor(idx, dtype=torch.int64), torch.tensor(val, dtype=torch.int32))
        assert _table(pt) == _table(ref)
        for t, r in zip(tabs, rows):
            assert _table(pt)[r][: len(t)] == list(t)
        assert len(set(rows)) == len(rows)


def test_repeated_step_sends_nothing() -> None:
    pt = PageTable(4, 8, scratch_page=0, device=torch.device("cpu"))
    rows, idx, val = pt.assign([7, 9], [(3, 4), (5,)])
    assert idx and val
    again = pt.assign([7, 9], [(3, 4), (5,)])
    assert again == (rows, [], [])
    again[0].append(99)  # the caller's list, not the cached one
    assert pt.assign([7, 9], [(3, 4), (5,)])[0] == rows
    assert pt.assign([7, 9], [(3, 4, 6), (5,)])[1] == [rows[0] * 8 + 2]


def test_step_buffer_pack_aligns_parts() -> None:
    buf = StepBuffer(8, torch.device("cpu"))
    parts = [[1, 2, 3], [], [-1, 2**31 - 1], list(range(9))]
    host, spans = buf.pack(parts)
    assert spans == [(0, 3), (4, 0), (4, 2), (8, 9)]
    got = host.tolist()
    for (o, n), p in zip(spans, parts):
        assert got[o : o + n] == p
    assert got[3] == 0 and got[6:8] == [0, 0]
    assert host.dtype == torch.int32
