"""A deterministic in-test engine implementing ``kvserve.server.engine_api.EngineAPI``.

Imported by the other ``test_http_*`` modules (never by src/). Byte-level tokenizer (id =
byte + 10) plus a few special tokens; generation emits the characters of ``OUTPUT`` one token
at a time from a worker thread, honouring n_predict, stop strings, n_probs, return_progress,
context overflow and cancellation.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.testclient import TestClient

from kvserve.engine.errors import EngineError
from kvserve.engine.request import (
    ErrorEvent,
    FinalEvent,
    GenerationRequest,
    ProgressEvent,
    TokenEvent,
    TokenProb,
)
from kvserve.engine.snapshot import IDLE, SlotView
from kvserve.engine.stats import timings
from kvserve.server.app import create_app
from kvserve.server.engine_api import EngineAPI
from kvserve.server.settings import ServerSettings

SPECIALS = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "<|im_end|>", 4: "<|fim_pre|>", 5: "<|fim_suf|>",
            6: "<|fim_mid|>", 7: "<|fim_rep|>", 8: "<|fim_sep|>", 9: "<|im_start|>"}
OUTPUT = "Hello world! This is a fake model speaking.\nLine two."
MODEL = "models/fake-model.gguf"


class FakeTokenizer:
    n_vocab = 266
    bos_id = 1
    eos_id = 2
    eog_ids = frozenset({2, 3})
    add_bos = True
    bos_token = "<s>"
    eos_token = "</s>"

    def __init__(self, fim: bool = True):
        self.fim = fim

    def _fim(self, i: int) -> int | None:
        return i if self.fim else None

    fim_pre = property(lambda self: self._fim(4))
    fim_suf = property(lambda self: self._fim(5))
    fim_mid = property(lambda self: self._fim(6))
    fim_rep = property(lambda self: self._fim(7))
    fim_sep = property(lambda self: self._fim(8))

    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        out = [self.bos_id] if add_special and self.add_bos else []
        i = 0
        while i < len(text):
            if parse_special:
                hit = next((tid for tid, s in SPECIALS.items() if text.startswith(s, i)), None)
                if hit is not None:
                    out.append(hit)
                    i += len(SPECIALS[hit])
                    continue
            out.extend(b + 10 for b in text[i].encode("utf-8"))
            i += 1
        return out

    def token_bytes(self, tid: int, special: bool = True) -> bytes:
        if tid in SPECIALS:
            return SPECIALS[tid].encode() if special else b""
        return bytes([tid - 10])

    def decode(self, ids: list[int], special: bool = False) -> str:
        return b"".join(self.token_bytes(t, special) for t in ids).decode("utf-8", "replace")


class FakeTemplate:
    source = "{% for m in messages %}<|im_start|>{{ m.role }}...{% endfor %}"

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: Any = None, **kwargs: Any) -> str:
        out = ""
        for m in messages:
            if m.get("role") not in ("system", "user", "assistant", "tool"):
                raise ValueError(f"unknown role {m.get('role')!r}")
            out += f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n"
        if kwargs.get("enable_thinking") is False:
            out += "[no-think]"
        return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


@dataclass
class FakeEngine:
    n_ctx_slot: int = 256
    n_slots: int = 4
    ready: bool = True
    delay: float = 0.0  # seconds between tokens
    endless: bool = False  # generate until cancelled
    fim: bool = True
    busy: bool = False
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    chat_template: FakeTemplate | None = field(default_factory=FakeTemplate)
    submitted: list[GenerationRequest] = field(default_factory=list)
    cancelled: set[int] = field(default_factory=set)
    slot_calls: list[tuple[int, str, str, str]] = field(default_factory=list)
    embed_calls: list[tuple[list[list[int]], str]] = field(default_factory=list)
    rank_calls: list[list[list[int]]] = field(default_factory=list)
    rerank_template: str | None = None
    compiled: list[Any] = field(default_factory=list)  # grammar specs passed to compile()
    error_after: int = -1  # emit a server error after this many tokens
    output: str = OUTPUT  # what the model "generates", cyclically, one character per token
    eos_at_end: bool = False  # stop (stop_type "eos") once ``output`` has been generated once
    unhealthy: str | None = None  # what health() reports

    def __post_init__(self) -> None:
        self.tokenizer = FakeTokenizer(self.fim)
        self._ids = 100
        self._lock = threading.Lock()

    @property
    def grammar_compiler(self) -> Any:
        """Records the specs it is asked to compile and hands them back as the "compiled" grammar
        (the fake model never follows a grammar; real compilation is tested with real vocabularies)."""
        return self

    def compile(self, spec: Any) -> Any:
        self.compiled.append(spec)
        return spec

    def new_request_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    def model_info(self) -> dict[str, Any]:
        return {"vocab_type": 2, "n_vocab": 266, "n_ctx_train": 8192, "n_embd": 64, "n_params": 1000,
                "size": 4000, "ftype": "F32", "path": MODEL}

    def submit(self, req: GenerationRequest, emit: Any) -> None:
        self.submitted.append(req)
        threading.Thread(target=self._run, args=(req, emit), daemon=True).start()

    def cancel(self, request_id: int) -> None:
        self.cancelled.add(request_id)

    def _run(self, req: GenerationRequest, emit: Any) -> None:
        n_prompt = len(req.prompt_tokens)
        if n_prompt >= self.n_ctx_slot:
            emit(ErrorEvent(req.id, req.index, 400,
                            f"request ({n_prompt} tokens) exceeds the available context size "
                            f"({self.n_ctx_slot} tokens), try increasing it", "exceed_context_size_error",
                            {"n_prompt_tokens": n_prompt, "n_ctx": self.n_ctx_slot}))
            return
        p = req.params
        if p.return_progress:
            tim = timings(n_prompt, 0, 0, 1.5, 0.0) if p.timings_per_token else None
            emit(ProgressEvent(req.id, req.index, n_prompt, 0, n_prompt, 1.5, tim))
        limit = 10**9 if self.endless else (p.n_predict if p.n_predict > 0 else (1 if p.n_predict == 0 else 8))
        text, tokens, probs, stop_type, word = "", [], [], "limit", ""
        i = 0
        while i < limit:
            if req.id in self.cancelled:
                stop_type = "none"
                break
            if self.eos_at_end and i == len(self.output):
                stop_type = "eos"
                break
            if i == self.error_after:
                emit(ErrorEvent(req.id, req.index, 500, "Context size has been exceeded.", "server_error"))
                return
            ch = self.output[(i + req.index) % len(self.output)]
            tid = ord(ch) + 10
            tokens.append(tid)
            prob = TokenProb(tid, ch, [ord(ch)], -0.25,
                             [TokenProb(tid + k, chr(ord(ch) + k), [ord(ch) + k], -0.25 - k) for k in range(p.n_probs)])
            text += ch
            i += 1
            hit = next((s for s in p.stop if s in text), None)
            if hit:
                text = text[: text.index(hit)]
                stop_type, word = "word", hit
                break
            if p.n_probs:
                probs.append(prob)
            emit(TokenEvent(req.id, req.index, ch, [tid], i, n_prompt, [prob] if p.n_probs else [],
                            {"predicted_n": i} if p.timings_per_token else None))
            if self.delay:
                time.sleep(self.delay)
        emit(FinalEvent(req.id, req.index, text, tokens, req.index % self.n_slots, stop_type, word, False,
                        n_prompt, n_prompt // 2, len(tokens), n_prompt + len(tokens) - 1, 12.5, 30.25,
                        probs, "\n" in text))

    def health(self) -> str | None:
        return self.unhealthy

    def slots_snapshot(self) -> tuple[SlotView, ...]:
        return tuple(SlotView(i, self.n_ctx_slot, self.busy, -1, 0, 0, 0, None, IDLE)
                     for i in range(self.n_slots))

    def metrics_snapshot(self) -> dict[str, float]:
        return {"prompt_tokens_total": 42, "tokens_predicted_total": 7, "t_start": 1234.5,
                "requests_processing": 1, "kvserve:cache_lookups_total": 3,
                'kvserve:cache_tokens_reused_total{source="prefix"}': 10,
                'kvserve:cache_tokens_reused_total{source="shift"}': 2}

    def slot_action(self, id_slot: int, action: str, filename: str, tenant: str = "") -> dict[str, Any]:
        self.slot_calls.append((id_slot, action, filename, tenant))
        if filename == "missing.bin":
            raise EngineError("Unable to restore slot: No available space in KV cache or invalid slot save file",
                              400)
        if action == "erase":
            return {"id_slot": id_slot % self.n_slots, "n_erased": 5}
        return {"id_slot": id_slot % self.n_slots, "filename": filename, "n_saved": 5, "n_written": 100,
                "timings": {"save_ms": 1.0}}

    def embed(self, token_lists: list[list[int]], pooling: str) -> list[list[list[float]]]:
        self.embed_calls.append((token_lists, pooling))
        if pooling == "none":
            return [[[float(t), 1.0] for t in toks] for toks in token_lists]
        return [[[3.0, 4.0]] for _ in token_lists]


    def rank(self, token_lists: list[list[int]]) -> list[float]:
        """Score: the number of prompt tokens (a longer document ranks higher)."""
        self.rank_calls.append(token_lists)
        return [float(len(t)) for t in token_lists]


def settings(**kw: Any) -> ServerSettings:
    base: dict[str, Any] = {"model_name": MODEL, "aliases": (MODEL,), "model_path": MODEL,
                            "endpoint_metrics": True, "n_parallel": 4}
    base.update(kw)
    return ServerSettings(**base)


def client(engine: EngineAPI | None = None, **kw: Any) -> tuple[TestClient, FakeEngine]:
    eng = engine if engine is not None else FakeEngine()
    return TestClient(create_app(eng, settings(**kw)), raise_server_exceptions=False), eng  # type: ignore[return-value]


def sse_events(text: str) -> list[Any]:
    """Parse an SSE body into JSON objects ("[DONE]" kept as the string)."""
    import json

    out: list[Any] = []
    for block in text.split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


# --- the fake itself -----------------------------------------------------------------------


def test_fake_tokenizer_roundtrip() -> None:
    tok = FakeTokenizer()
    ids = tok.encode("hé<s>", True, True)
    assert ids[0] == 1 and ids[-1] == 1
    assert tok.decode(ids, special=True) == "<s>hé<s>"
    assert tok.encode("<s>", False, False) == [ord(c) + 10 for c in "<s>"]


def test_fake_engine_satisfies_protocol() -> None:
    eng: EngineAPI = FakeEngine()
    assert eng.ready and eng.n_slots == 4
