"""The served model's description for /models and /props."""

from __future__ import annotations

from typing import Any

from ..model.loader import LoadedModel

FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
          11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
          17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


def model_info(loaded: LoadedModel, tokenizer: Any) -> dict[str, Any]:
    cfg = loaded.cfg
    return {
        "vocab_type": tokenizer.vocab_type,
        "n_vocab": cfg.n_vocab,
        "n_ctx_train": cfg.n_ctx_train,
        "n_embd": cfg.n_embd,
        "n_params": loaded.n_params,
        "size": loaded.file_size,
        "ftype": FTYPES.get(cfg.file_type, str(cfg.file_type)),
        "path": loaded.path,
    }
