"""``BatchRows``: a step's logits as views of its batch tensor, read like the dict it stands for."""

from __future__ import annotations

import torch

from kvserve.plan import BatchRows


def test_batch_rows_reads_like_the_dict_of_views() -> None:
    batch = torch.arange(12.0).view(4, 3)
    rows = {17: 0, 5: 1, 9: 3}
    view = BatchRows(batch, rows)
    want = {s: batch[i : i + 1] for s, i in rows.items()}
    assert len(view) == 3 and list(view) == [17, 5, 9] and 5 in view and 2 not in view
    for s in rows:
        assert torch.equal(view[s], want[s]) and view[s].shape == (1, 3)
    assert view.get(2) is None
    assert [k for k, _ in view.items()] == [17, 5, 9]
    batch[3, 0] = -1.0  # views, not copies
    assert view[9][0, 0].item() == -1.0
