"""Prompt forms (``tokenize_input_prompts``) and the FIM prompt of ``/infill``.

Accepted ``prompt`` forms:
- ``"text"``                                   one prompt
- ``[12, 34, 56]``                             one prompt of token ids
- ``[12, "text", 34]``                         one mixed prompt; only the first piece gets BOS
- ``{"prompt_string": ..., "multimodal_data": [...]}``  one prompt (media refused)
- an array without integers, of the forms above: several prompts (one result each)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvserve.server.engine_api import TokenizerLike
from kvserve.server.errors import ApiError, invalid, unsupported_field


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def tokenize_mixed(tok: TokenizerLike, prompt: Any, add_special: bool, parse_special: bool) -> list[int]:
    """A string or an array of strings and token ids; ``add_special`` applies to the first
    element only, and only when it is a string."""
    if isinstance(prompt, str):
        return list(tok.encode(prompt, add_special, parse_special))
    if not isinstance(prompt, list):
        raise invalid("[json.exception.type_error.302] type must be string, but is " + type(prompt).__name__)
    out: list[int] = []
    first = True
    for p in prompt:
        if isinstance(p, str):
            out.extend(tok.encode(p, add_special and first, parse_special))
        elif _is_int(p):
            out.append(int(p))
        else:
            raise invalid("\"prompt\" elements must be a string, a list of tokens, a JSON object containing "
                          "a prompt string, or a list of mixed strings & tokens.")
        first = False
    return out


def _subprompt(tok: TokenizerLike, p: Any, add_special: bool, parse_special: bool) -> list[int]:
    if isinstance(p, str):
        return tokenize_mixed(tok, p, add_special, parse_special)
    if isinstance(p, list) and all(_is_int(e) or isinstance(e, str) for e in p):
        if any(isinstance(e, str) for e in p):
            return tokenize_mixed(tok, p, add_special, parse_special)
        return [int(e) for e in p]
    if isinstance(p, dict) and "prompt_string" in p:
        if p.get("multimodal_data"):
            raise unsupported_field("multimodal_data", "multimodal input is not implemented")
        return tokenize_mixed(tok, p["prompt_string"], add_special, parse_special)
    raise invalid("\"prompt\" elements must be a string, a list of tokens, a JSON object containing a "
                  "prompt string, or a list of mixed strings & tokens.")


def tokenize_prompts(tok: TokenizerLike, prompt: Any, add_special: bool = True,
                     parse_special: bool = True) -> list[list[int]]:
    if isinstance(prompt, list) and not any(_is_int(e) for e in prompt):
        result = [_subprompt(tok, p, add_special, parse_special) for p in prompt]
    else:
        result = [_subprompt(tok, prompt, add_special, parse_special)]
    if not result:
        raise invalid("\"prompt\" must not be empty")
    return result


def validate_tokens(tokens: Sequence[int], n_vocab: int) -> None:
    if tokens and (min(tokens) < 0 or max(tokens) >= n_vocab):
        raise invalid("Prompt contains invalid tokens")


# ---------------------------------------------------------------------------------------
# /infill
# ---------------------------------------------------------------------------------------

FIM_NAMES = ("pre", "suf", "mid", "rep", "sep")


def fim_id(tok: Any, name: str) -> int | None:
    """The tokenizer's FIM id (``fim_pre_id`` or ``fim_pre``), None when the model lacks it."""
    for attr in (f"fim_{name}_id", f"fim_{name}", f"fim_{name}_token_id"):
        v = getattr(tok, attr, None)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return int(v)
    return None


def check_infill_support(tok: Any) -> None:
    for name, what in (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle")):
        if fim_id(tok, name) is None:
            raise ApiError(f"Infill is not supported by this model: {what} token is missing. ", "not_supported_error")


def validate_input_extra(extra: Any) -> list[dict[str, str]]:
    msg = "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}"
    if extra is None:
        return []
    if not isinstance(extra, list):
        raise invalid(msg)
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise invalid(msg)
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise invalid(msg)
    return extra


def build_infill(tok: Any, input_prefix: Any, input_suffix: Any, input_extra: list[dict[str, str]],
                 prompt_tokens: list[int], n_batch: int, n_predict: int, n_ctx: int, spm: bool) -> list[int]:
    """Repo-level FIM layout (extra context is trimmed from the front to fit)::

        [FIM_REP]myproject\\n ([FIM_SEP]<filename>\\n<text>)* [FIM_SEP]filename\\n
        [BOS] FIM_PRE prefix prompt FIM_SUF suffix FIM_MID        (SPM: SUF.. before PRE..)

    prefix keeps its last 3/4·n_batch tokens; suffix its first n_batch/4 - (2 + len(prompt)).
    """
    pre, suf, mid = fim_id(tok, "pre"), fim_id(tok, "suf"), fim_id(tok, "mid")
    rep, sep = fim_id(tok, "rep"), fim_id(tok, "sep")
    assert pre is not None and suf is not None and mid is not None
    t_prefix = tokenize_mixed(tok, input_prefix, False, False)
    t_suffix = tokenize_mixed(tok, input_suffix, False, False)

    extra: list[int] = []
    if rep is not None:
        extra += [rep] + list(tok.encode("myproject\n", False, False))
    for chunk in input_extra:
        text = chunk.get("text", "")
        filename = chunk.get("filename", "tmp")
        if sep is not None:
            extra += [sep] + list(tok.encode(filename + "\n", False, False))
        else:
            extra += list(tok.encode("\n\n--- snippet ---\n\n", False, False))
        extra += list(tok.encode(text, False, False))
    if sep is not None:
        extra += [sep] + list(tok.encode("filename\n", False, False))

    n_prefix_take = min(len(t_prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(t_suffix), max(0, n_batch // 4 - (2 + len(prompt_tokens))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))

    prefix = [pre] + t_prefix[len(t_prefix) - n_prefix_take:] + list(prompt_tokens)
    suffix = [suf] + t_suffix[:n_suffix_take]
    first, second = (suffix, prefix) if spm else (prefix, suffix)
    out: list[int] = []
    if n_extra_take:
        out += extra[len(extra) - n_extra_take:]
    bos = getattr(tok, "bos_id", None)
    if getattr(tok, "add_bos", False) and bos is not None:
        out.append(int(bos))
    return out + first + second + [mid]
