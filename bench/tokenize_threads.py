"""Tokenization of a burst's long prompts on this host: threads at once, and one batch call.

    python bench/tokenize_threads.py [--model GGUF] [--prompts 64] [--threads 1,4,8,16,32]

The prompts are those of the 64-request burst of ``bench/throughput.py --workloads shared
--prefix-words 600 --prompt-words 10 --burst`` (a ~2,000-token shared prefix, distinct
suffixes). Without ``--model`` the tokenizer is that of the random-weight files of
``bench/engine.py --synth`` (a byte-level BPE of 49,152 tokens). Printed: one prompt alone by the
library's ``encode`` and ``encode_batch_fast``, and by ``Tokenizer.encode`` as the server calls it;
all the prompts in N threads at once, each thread one prompt a call, by ``encode_batch`` (one
text) and by ``Tokenizer.encode``; all of them in one ``encode_batch`` and one
``encode_batch_fast`` call. ``Tokenizer.encode`` three ways: without the trie of long texts'
beginnings (``KVSERVE_PREFIX_TOKENS=0``), with an empty trie before each repetition (a burst's
first round: the shared beginning is new) and with the trie the repetitions before left (the
burst again); and the next turn of a long conversation (chat-templated text, ``--turns``), after
its history was encoded. Medians of 7 repetitions (21 for one prompt), wall ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import make_text, print_table  # noqa: E402


def _median_ms(fn: Callable[[], object], n: int = 7) -> float:
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="GGUF whose tokenizer to use (default: the random-weight files' vocabulary)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--threads", default="1,4,8,16,32")
    p.add_argument("--turns", type=int, default=40, help="turns of the conversation row (~3,000 characters each)")
    args = p.parse_args()

    from kvserve.model import prefix_tokens
    from kvserve.model.gguf_meta import read_gguf
    from kvserve.model.tokenizer import Tokenizer

    path = args.model
    if path is None:
        from kvserve.model.synth import SynthSpec, write_random_gguf

        path = os.path.join(tempfile.mkdtemp(), "vocab.gguf")
        write_random_gguf(path, SynthSpec(arch="llama", n_vocab=49152, n_layer=1, n_embd=64, n_ff=64, tied=True))
    tok = Tokenizer.from_metadata(read_gguf(path).metadata)
    hf = tok._hf
    prefix = make_text(7 + 64, 600)
    texts = [f"{prefix}\n\nQuestion {i}.0: {make_text(1000 * i, 12)}\nAnswer:" for i in range(args.prompts)]
    print(f"{os.cpu_count()} cores; {len(texts)} prompts of {len(texts[0])} characters, "
          f"{len(tok.encode(texts[0], True, True))} tokens\n")

    def one_text(t: str) -> list[int]:
        return hf.encode_batch([t], add_special_tokens=False)[0].ids

    def server(t: str) -> list[int]:
        prefix_tokens.TENANT.set("")  # as the server sets it for a request (in this thread's context)
        return tok.encode(t, True, True)

    def trie(on: bool, fresh: bool, fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            prefix_tokens.ENABLED = on
            if fresh:
                tok.forget_prefixes()
            try:
                return fn()
            finally:
                prefix_tokens.ENABLED = True
        return run

    ways = (("Tokenizer.encode, no trie", False, False), ("Tokenizer.encode, new trie", True, True),
            ("Tokenizer.encode, trie kept", True, False))
    want = trie(False, True, lambda: [server(t) for t in texts])()  # the library's ids, no trie
    rows: list[list[object]] = [
        ["one prompt alone", "encode", _median_ms(lambda: hf.encode(texts[0], add_special_tokens=False), 21)],
        ["one prompt alone", "encode_batch_fast",
         _median_ms(lambda: hf.encode_batch_fast([texts[0]], add_special_tokens=False), 21)],
    ]
    for how, on, fresh in ways:
        rows.append(["one prompt alone", how, _median_ms(trie(on, fresh, lambda: server(texts[0])), 21)])
    # a long conversation sent again with one more turn: its history's ids are the trie's
    history = "".join(f"<|im_start|>user\n{make_text(50 + t, 150)}<|im_end|>\n<|im_start|>assistant\n"
                      f"{make_text(90 + t, 250)}<|im_end|>\n" for t in range(args.turns))
    turn = f"{history}<|im_start|>user\n{make_text(7, 40)}<|im_end|>\n<|im_start|>assistant\n"
    label = f"a conversation's next turn ({len(turn):,} characters, {len(server(turn)):,} tokens)"
    server(history)
    for how, on, fresh in ways:
        rows.append([label, how, _median_ms(trie(on, fresh, lambda: server(turn)), 7)])
        if fresh:
            server(history)
    for n in (int(x) for x in args.threads.split(",")):
        with ThreadPoolExecutor(n) as ex:
            list(ex.map(server, texts))
            rows.append([f"all, {n} threads", "encode_batch, one text a call",
                         _median_ms(lambda: list(ex.map(one_text, texts)))])
            for how, on, fresh in ways:
                assert trie(on, fresh, lambda: list(ex.map(server, texts)))() == want
                run = trie(on, fresh, lambda: list(ex.map(server, texts)))
                rows.append([f"all, {n} threads", how, _median_ms(run)])
    rows.append(["all, one call", "encode_batch", _median_ms(lambda: hf.encode_batch(texts, add_special_tokens=False))])
    rows.append(["all, one call", "encode_batch_fast",
                 _median_ms(lambda: hf.encode_batch_fast(texts, add_special_tokens=False))])
    print_table(["prompts", "how", "wall ms"], rows, digits=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
