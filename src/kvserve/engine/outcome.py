"""What a sampled token does to a request, and what ends it: released text and token events,
llama-server's stop rules, the final event and the counters a finished request adds."""

from __future__ import annotations

from typing import Any

from .output import token_prob
from .records import maker
from .request import FinalEvent, GenerationRequest, TokenEvent, TokenProb
from .sequence import Sequence
from .stats import EngineStats, timings

_token_event = maker(TokenEvent)  # every field, in order (records.py)


def push_token(
    seq: Sequence, res: Any, now: float, n_predict: int, tokenizer: Any, eog: Any, cfg: Any
) -> bool:
    """Append the sampled token ``res.token``, release its text (a ``TokenEvent`` when
    streaming) and apply the stop rules. Returns whether the request is done."""
    tok = int(res.token)
    n_decoded = seq.n_decoded + 1
    seq.tokens.append(tok)
    seq.generated.append(tok)
    seq.n_decoded = n_decoded
    seq.t_last_token = now
    p = seq.req.params
    is_eog = tok in eog
    streamer = seq.streamer
    text, hit = streamer.push_token(tok, is_eog)
    probs = []
    if p.n_probs > 0:
        probs = [token_prob(tokenizer, tok, res, p.post_sampling_probs)]
        seq.probs.extend(probs)
    decide_stop(seq, is_eog, hit, text, now, n_predict, cfg)
    done = seq.stop_type != "none"
    if done:
        text += streamer.flush(hit is not None)
    seq.content.append(text)
    if not seq.has_new_line and "\n" in text:
        seq.has_new_line = True
    if p.stream and (text or probs or (n_decoded == 1 and p.return_progress)):
        tim = None
        if p.timings_per_token:
            tim = timings(seq.n_prompt, seq.n_cached, n_decoded, seq.prompt_ms(), seq.predicted_ms())
        seq.emit(_token_event(seq.id, seq.req.index, text, [tok], n_decoded, seq.n_prompt, probs, tim,
                              seq.n_cached))
    return done


def grammar_stop(seq: Sequence) -> bool:
    """The request's grammar allows no further token (it cannot be satisfied, or it is
    complete and end-of-generation is banned): it ends with stop type "grammar", no new token."""
    seq.stop_type = "grammar"
    text = seq.streamer.flush(False)
    seq.content.append(text)
    seq.has_new_line = seq.has_new_line or "\n" in text
    if seq.req.params.stream and text:
        seq.emit(TokenEvent(seq.id, seq.req.index, text, [], seq.n_decoded, seq.n_prompt, [], n_cached=seq.n_cached))
    return True


def decide_stop(
    seq: Sequence, is_eog: bool, hit: Any, text: str, now: float, n_predict: int, cfg: Any
) -> None:
    """Set ``seq.stop_type`` (and ``stopping_word`` / ``truncated``) after its newest token,
    in llama-server's order: EOG, stop word, n_indent, n_predict, full slot context (without
    context shift), t_max_predict_ms at a new line. ``hit``: the text output's stop hit;
    ``text``: what that token released; ``cfg``: the scheduler's config."""
    p = seq.req.params
    if is_eog:
        seq.stop_type = "eos"
    elif hit is not None and hit.kind == "word":
        seq.stop_type, seq.stopping_word = "word", hit.word
    elif hit is not None:  # n_indent: llama-server reports it as a limit
        seq.stop_type = "limit"
    elif n_predict >= 0 and seq.n_decoded >= max(1, n_predict):
        seq.stop_type = "limit"
    elif not cfg.context_shift and len(seq.tokens) >= cfg.n_ctx_slot:
        seq.stop_type, seq.truncated = "limit", True
    elif p.t_max_predict_ms > 0 and "\n" in text and (now - seq.t_prompt_end) * 1000.0 > p.t_max_predict_ms:
        seq.stop_type = "limit"


def record_finish(st: EngineStats, seq: Sequence) -> None:
    st.prompt_tokens_total += seq.n_evaluated_prompt
    st.prompt_tokens_cached_total += seq.n_cached
    st.prompt_seconds_total += seq.prompt_ms() / 1000.0
    st.tokens_predicted_total += seq.n_decoded
    st.tokens_predicted_seconds_total += seq.predicted_ms() / 1000.0
    st.rate_prompt_tokens += seq.n_evaluated_prompt
    st.rate_prompt_s += seq.prompt_ms() / 1000.0
    st.rate_predicted_tokens += max(0, seq.n_decoded - 1)
    st.rate_predicted_s += seq.predicted_ms() / 1000.0
    st.requests_finished += 1


def final_event(seq: Sequence, tokenizer: Any) -> FinalEvent:
    """The request's result so far (at its end, or when it is cancelled: stop type "none")."""
    return FinalEvent(
        request_id=seq.id,
        index=seq.req.index,
        content="".join(seq.content),
        tokens=list(seq.generated),
        id_slot=seq.slot_id,
        stop_type=seq.stop_type,
        stopping_word=seq.stopping_word,
        truncated=seq.truncated,
        n_prompt=seq.n_prompt,
        n_cached=seq.n_cached,
        n_decoded=seq.n_decoded,
        tokens_cached=seq.n_computed,
        prompt_ms=seq.prompt_ms(),
        predicted_ms=seq.predicted_ms(),
        probs=final_probs(seq, tokenizer),
        has_new_line=seq.has_new_line,
    )


def final_probs(seq: Sequence, tokenizer: Any) -> list[TokenProb]:
    """llama-server drops the probabilities of a stop word's tokens from the final list
    (as many entries as the stop word has tokens)."""
    probs = list(seq.probs)
    if seq.stop_type == "word" and probs:
        n = len(tokenizer.encode(seq.stopping_word, add_special=False, parse_special=False))
        probs = probs[: max(0, len(probs) - n)]
    return probs


def cancelled_event(req: GenerationRequest) -> FinalEvent:
    """The final event of a request cancelled before it reached a slot: nothing generated."""
    n = len(req.prompt_tokens)
    return FinalEvent(req.id, req.index, "", [], -1, "none", "", False, n, 0, 0, 0, 0.0, 0.0)
