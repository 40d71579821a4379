"""The models a router can serve, by name (llama-server's ``load_from_models_dir`` and presets).

``--models-dir DIR``: each ``DIR/NAME.gguf`` is the model ``NAME``; each sub-directory ``DIR/NAME/``
holding GGUF files is the model ``NAME`` (its first shard ``*-00001-of-*`` when split, else its
GGUF file). Multimodal projectors (``mmproj*``) and draft models are companions, never models.
Besides those, the GGUF that ships inside kvserve (SmolLM2-135M-Instruct) is always offered,
under its file name (source ``embedded``); a models-dir model of the same name wins.

``--models-preset FILE`` (``router/preset.py``) adds models and options, as ``load_models`` in
llama-server: ``[*]`` applies to every model, a section adds a model (or options to the
models-dir model of its name; its source becomes ``preset``). A preset's ``alias`` and ``tags``
are names the router answers to and lists; a name or alias used twice stops start-up.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from kvserve.args.spec import stoi
from kvserve.router.preset import STOP_TIMEOUT, Options, PresetError, load_presets, to_args

log = logging.getLogger("kvserve.router")
DEFAULT_STOP_TIMEOUT = 10  # seconds an unloading child gets before it is killed


@dataclass(frozen=True, eq=False)
class ModelEntry:
    name: str
    path: str  # the model file ("" when its preset names none)
    source: str  # models_dir | embedded | preset
    options: Options = field(default_factory=dict)  # the child's options (``model``, preset keys)
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    @property
    def stop_timeout(self) -> int:
        """The preset's ``stop-timeout`` (``std::stoi``), else 10 s (also when it is not a number)."""
        try:
            return stoi(self.options[STOP_TIMEOUT]) if STOP_TIMEOUT in self.options else DEFAULT_STOP_TIMEOUT
        except ValueError:
            return DEFAULT_STOP_TIMEOUT


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


def _names(value: str | None) -> tuple[str, ...]:
    return tuple(sorted({v.strip() for v in (value or "").split(",") if v.strip()}))


def _check_names(entries: dict[str, ModelEntry]) -> None:
    """llama-server's ``add_model`` checks, in name order."""
    seen: dict[str, ModelEntry] = {}
    for name in sorted(entries):
        e = entries[name]
        for other in seen.values():
            if name in other.aliases:
                raise PresetError(f"model name '{name}' conflicts with alias of model '{other.name}'")
        for alias in e.aliases:
            if alias in seen:
                raise PresetError(f"alias '{alias}' for model '{name}' conflicts with existing model name")
            for other in seen.values():
                if alias in other.aliases:
                    raise PresetError(f"alias '{alias}' for model '{name}' conflicts with alias of model "
                                      f"'{other.name}'")
        to_args(e.options)  # a flag the child cannot be given stops start-up here
        if STOP_TIMEOUT in e.options and e.stop_timeout == DEFAULT_STOP_TIMEOUT:
            try:
                stoi(e.options[STOP_TIMEOUT])
            except ValueError:
                log.warning("invalid stop-timeout value '%s' for model '%s', using default %d seconds",
                            e.options[STOP_TIMEOUT], name, DEFAULT_STOP_TIMEOUT)
        seen[name] = e


def catalog(models_dir: str | None, models_preset: str | None = None) -> dict[str, ModelEntry]:
    """ValueError for a models dir that is not one, PresetError for a preset file that cannot be used."""
    found: dict[str, ModelEntry] = {}
    emb = embedded_model()
    if emb is not None:
        found[emb.name] = emb
    if models_dir:
        for e in scan_models_dir(models_dir):
            found[e.name] = e
    glob, presets = load_presets(models_preset) if models_preset else ({}, {})
    merged: dict[str, tuple[str, Options]] = {
        name: (e.source, {**glob, "model": e.path}) for name, e in found.items()}
    for name, opts in presets.items():
        base = merged[name][1] if name in merged else {}
        merged[name] = ("preset", {**base, **glob, **opts})
    entries = {name: ModelEntry(name, opts.get("model", ""), source, opts, _names(opts.get("alias")),
                                _names(opts.get("tags")))
               for name, (source, opts) in merged.items()}
    _check_names(entries)
    return entries
