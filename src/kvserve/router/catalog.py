"""The models a router can serve, by name (llama-server's ``load_from_models_dir``).

``--models-dir DIR``: each ``DIR/NAME.gguf`` is the model ``NAME``; each sub-directory ``DIR/NAME/``
holding GGUF files is the model ``NAME`` (its first shard ``*-00001-of-*`` when split, else its
GGUF file). Multimodal projectors (``mmproj*``) and draft models are companions, never models.
Besides those, the GGUF that ships inside kvserve (SmolLM2-135M-Instruct) is always offered,
under its file name (source ``embedded``); a models-dir model of the same name wins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: str
    source: str  # models_dir | embedded


_DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")


def _is_mmproj(name: str) -> bool:
    return "mmproj" in name


def _is_draft(name: str) -> bool:
    return name.startswith(_DRAFT_PREFIXES)


def _subdir_model(path: str) -> str | None:
    model = shard = None
    for f in sorted(os.listdir(path)):
        if not f.endswith(".gguf") or _is_mmproj(f) or _is_draft(f):
            continue
        if "-00001-of-" in f:
            shard = os.path.join(path, f)
        else:
            model = os.path.join(path, f)
    return shard or model


def scan_models_dir(models_dir: str) -> list[ModelEntry]:
    """Raises ValueError when ``models_dir`` is not a directory (llama-server's start-up error)."""
    if not os.path.isdir(models_dir):
        raise ValueError(f"error: '{models_dir}' does not exist or is not a directory")
    out: list[ModelEntry] = []
    for f in sorted(os.listdir(models_dir)):
        full = os.path.join(models_dir, f)
        if os.path.isdir(full):
            found = _subdir_model(full)
            if found is not None:
                out.append(ModelEntry(f, found, "models_dir"))
        elif f.endswith(".gguf") and not _is_mmproj(f) and not _is_draft(f):
            out.append(ModelEntry(f[: -len(".gguf")], full, "models_dir"))
    return out


def embedded_model() -> ModelEntry | None:
    from kvserve.model.files import default_model_path

    try:
        path = default_model_path()
    except Exception:  # noqa: BLE001 - the package is optional for a router
        return None
    name = os.path.basename(path)
    return ModelEntry(name[: -len(".gguf")] if name.endswith(".gguf") else name, path, "embedded")


def catalog(models_dir: str | None) -> dict[str, ModelEntry]:
    entries: dict[str, ModelEntry] = {}
    emb = embedded_model()
    if emb is not None:
        entries[emb.name] = emb
    if models_dir:
        for e in scan_models_dir(models_dir):
            entries[e.name] = e
    return entries
