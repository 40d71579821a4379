"""GBNF (llama.cpp's grammar format) → llguidance Lark, with llama.cpp's parser rules and messages.

The parser follows ``llama_grammar_parser`` (src/llama-grammar.cpp) step by step, so a grammar
llama-server accepts is accepted here and a rejected one fails with the same wording:

- rules ``name ::= alternates`` end at a newline, except inside parentheses or after ``|``;
  names are ``[a-zA-Z0-9-]+``; ``#`` comments; a later definition of a name replaces the earlier;
- terminals: ``"literal"``, ``[a-z]`` / ``[^...]`` classes, ``.`` (any code point), escapes
  ``\\x.. \\u.... \\U........ \\t \\r \\n \\\\ \\" \\[ \\] \\-``;
- token terminals ``<[id]>`` and ``<text>`` (the text must tokenize, special tokens parsed, to
  exactly one token) and their negations ``!<[id]>`` / ``!<text>`` (any single token but that one);
- repetition ``* + ? {m} {m,} {m,n}`` on the preceding item (a whole literal, class, token,
  rule reference or group); ``{m,n}`` with ``m`` > 2000 is refused, ``n`` > 2000 means unbounded;
- every referenced rule must be defined; ``root`` is the start symbol.

Output semantics are llama.cpp's: a character-level context-free language. Every literal is
emitted as a sequence of one-character lexemes, so llguidance's longest-match lexer never has to
choose between overlapping literals (``("ab" | "abc") "cd"`` accepts ``abcd``). Left recursion,
which llama.cpp refuses, is accepted (the Earley parser handles it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Union

__all__ = ["GrammarSyntaxError", "gbnf_to_lark", "MAX_REPETITION_THRESHOLD"]

MAX_REPETITION_THRESHOLD = 2000


class GrammarSyntaxError(ValueError):
    """A GBNF grammar llama.cpp's parser would refuse; the message is llama.cpp's."""


# -- AST ------------------------------------------------------------------------------------------


@dataclass
class Lit:
    chars: list[int]


@dataclass
class Cls:
    negated: bool
    ranges: list[tuple[int, int]]


@dataclass
class AnyChar:
    pass


@dataclass
class Tok:
    token: int
    negated: bool


@dataclass
class Ref:
    name: str


@dataclass
class Group:
    alts: list[list["Item"]]


@dataclass
class Rep:
    item: "Item"
    lo: int
    hi: int | None  # None: unbounded


Item = Union[Lit, Cls, AnyChar, Tok, Ref, Group, Rep]
TokenResolver = Callable[[str], "list[int]"]


# -- parser (llama_grammar_parser) ----------------------------------------------------------------


def _is_word(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z") or c == "-" or ("0" <= c <= "9")


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


class _Parser:
    def __init__(self, src: str, resolve: TokenResolver | None) -> None:
        self.s = src
        self.resolve = resolve
        self.rules: dict[str, list[list[Item]]] = {}
        self.refs: list[str] = []
        # llama.cpp's symbol table size: rule names seen plus generated symbols (one per group,
        # one per optional repetition step); its repetition guard counts these.
        self.names_seen: set[str] = set()
        self.n_symbols = 0

    def see(self, name: str) -> None:
        if name not in self.names_seen:
            self.names_seen.add(name)
            self.n_symbols += 1

    def ch(self, i: int) -> str:
        return self.s[i] if i < len(self.s) else ""

    def at(self, i: int) -> str:
        return self.s[i:]

    def space(self, i: int, newline_ok: bool) -> int:
        while True:
            c = self.ch(i)
            if c in (" ", "\t") or (newline_ok and c in ("\r", "\n")):
                i += 1
            elif c == "#":
                while self.ch(i) not in ("", "\r", "\n"):
                    i += 1
            else:
                return i

    def name(self, i: int) -> int:
        j = i
        while self.ch(j) and _is_word(self.ch(j)):
            j += 1
        if j == i:
            raise GrammarSyntaxError(f"expecting name at {self.at(i)}")
        return j

    def integer(self, i: int) -> int:
        j = i
        while self.ch(j) and _is_digit(self.ch(j)):
            j += 1
        if j == i:
            raise GrammarSyntaxError(f"expecting integer at {self.at(i)}")
        return j

    def hex(self, i: int, size: int) -> tuple[int, int]:
        j, value = i, 0
        while j < i + size and self.ch(j):
            c = self.ch(j).lower()
            if not ("0" <= c <= "9" or "a" <= c <= "f"):
                break
            value = value * 16 + int(c, 16)
            j += 1
        if j != i + size:
            raise GrammarSyntaxError(f"expecting {size} hex chars at {self.at(i)}")
        return value, j

    def char(self, i: int) -> tuple[int, int]:
        c = self.ch(i)
        if c == "\\":
            e = self.ch(i + 1)
            if e == "x":
                return self.hex(i + 2, 2)
            if e == "u":
                return self.hex(i + 2, 4)
            if e == "U":
                return self.hex(i + 2, 8)
            simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
            if e in simple:
                return simple[e], i + 2
            raise GrammarSyntaxError(f"unknown escape at {self.at(i)}")
        if c:
            return ord(c), i + 1
        raise GrammarSyntaxError("unexpected end of input")

    def token(self, i: int) -> tuple[int, int]:
        start = i
        if self.ch(i) != "<":
            raise GrammarSyntaxError(f"expecting '<' at {self.at(i)}")
        i += 1
        if self.ch(i) == "[":
            i += 1
            end = self.integer(i)
            tid = int(self.s[i:end])
            if tid > 0xFFFFFFFF:
                raise GrammarSyntaxError(f"parsed token id is too big at {self.at(i)}")
            i = end
            if self.ch(i) != "]":
                raise GrammarSyntaxError(f"expecting ']' at {self.at(i)}")
            i += 1
            if self.ch(i) != ">":
                raise GrammarSyntaxError(f"expecting '>' at {self.at(i)}")
            return tid, i + 1
        if self.resolve is None:
            raise GrammarSyntaxError(f"no vocab to parse token at {self.at(start)}")
        while self.ch(i) and self.ch(i) != ">":
            i += 1
        if self.ch(i) != ">":
            raise GrammarSyntaxError(f"expecting '>' at {self.at(i)}")
        i += 1
        ids = self.resolve(self.s[start:i])
        if len(ids) != 1:
            raise GrammarSyntaxError(f"invalid token '{self.s[start:i]}'")
        return ids[0], i

    def alternates(self, i: int, nested: bool) -> tuple[list[list[Item]], int]:
        seq, i = self.sequence(i, nested)
        alts = [seq]
        while self.ch(i) == "|":
            i = self.space(i + 1, True)
            seq, i = self.sequence(i, nested)
            alts.append(seq)
        return alts, i

    def sequence(self, i: int, nested: bool) -> tuple[list[Item], int]:
        seq: list[Item] = []
        # Index of the item a repetition applies to (None: nothing to repeat yet) and the
        # number of rules a repetition of it generates in llama.cpp (its explosion guard).
        last: int | None = None
        n_prev = 1

        def repeat(lo: int, hi: int | None, pos: int) -> None:
            nonlocal n_prev
            if last is None or last >= len(seq):
                raise GrammarSyntaxError(f"expecting preceding item to */+/?/{{ at {self.at(pos)}")
            total = hi if hi is not None and hi > 0 else (lo if lo > 0 else 1)
            if n_prev * total > MAX_REPETITION_THRESHOLD:
                raise GrammarSyntaxError(
                    "number of rules that are going to be repeated multiplied by the new repetition "
                    "exceeds sane defaults, please reduce the number of repetitions or rule complexity"
                )
            seq[last] = Rep(seq[last], lo, hi)
            self.n_symbols += 1 if hi is None else hi - lo
            n_prev *= total

        while i < len(self.s):
            c = self.ch(i)
            if c == '"':
                i += 1
                chars: list[int] = []
                while self.ch(i) != '"':
                    if not self.ch(i):
                        raise GrammarSyntaxError("unexpected end of input")
                    cp, i = self.char(i)
                    chars.append(cp)
                last, n_prev = len(seq), 1
                seq.append(Lit(chars))
                i = self.space(i + 1, nested)
            elif c == "[":
                i += 1
                negated = self.ch(i) == "^"
                if negated:
                    i += 1
                ranges: list[tuple[int, int]] = []
                while self.ch(i) != "]":
                    if not self.ch(i):
                        raise GrammarSyntaxError("unexpected end of input")
                    lo, i = self.char(i)
                    hi = lo
                    if self.ch(i) == "-" and self.ch(i + 1) != "]":
                        if not self.ch(i + 1):
                            raise GrammarSyntaxError("unexpected end of input")
                        hi, i = self.char(i + 1)
                    ranges.append((lo, hi))
                last, n_prev = len(seq), 1
                seq.append(Cls(negated, ranges))
                i = self.space(i + 1, nested)
            elif c in ("<", "!"):
                negated = c == "!"
                if negated:
                    i += 1
                tid, i = self.token(i)
                last, n_prev = len(seq), 1
                seq.append(Tok(tid, negated))
                i = self.space(i, nested)
            elif _is_word(c):
                end = self.name(i)
                self.refs.append(self.s[i:end])
                self.see(self.s[i:end])
                last, n_prev = len(seq), 1
                seq.append(Ref(self.s[i:end]))
                i = self.space(end, nested)
            elif c == "(":
                i = self.space(i + 1, True)
                n_before = self.n_symbols
                self.n_symbols += 1
                alts, i = self.alternates(i, True)
                n_prev = max(1, self.n_symbols - n_before)
                last = len(seq)
                seq.append(Group(alts))
                if self.ch(i) != ")":
                    raise GrammarSyntaxError(f"expecting ')' at {self.at(i)}")
                i = self.space(i + 1, nested)
            elif c == ".":
                last, n_prev = len(seq), 1
                seq.append(AnyChar())
                i = self.space(i + 1, nested)
            elif c in ("*", "+", "?"):
                i = self.space(i + 1, nested)
                repeat(*{"*": (0, None), "+": (1, None), "?": (0, 1)}[c], i)
            elif c == "{":
                i = self.space(i + 1, nested)
                if not _is_digit(self.ch(i)):
                    raise GrammarSyntaxError(f"expecting an int at {self.at(i)}")
                end = self.integer(i)
                lo = int(self.s[i:end])
                i = self.space(end, nested)
                hi: int | None = None
                if self.ch(i) == "}":
                    hi = lo
                    i = self.space(i + 1, nested)
                elif self.ch(i) == ",":
                    i = self.space(i + 1, nested)
                    if _is_digit(self.ch(i)):
                        end = self.integer(i)
                        hi = int(self.s[i:end])
                        i = self.space(end, nested)
                    if self.ch(i) != "}":
                        raise GrammarSyntaxError(f"expecting '}}' at {self.at(i)}")
                    i = self.space(i + 1, nested)
                else:
                    raise GrammarSyntaxError(f"expecting ',' at {self.at(i)}")
                if lo > MAX_REPETITION_THRESHOLD:
                    raise GrammarSyntaxError(
                        "number of repetitions exceeds sane defaults, please reduce the number of repetitions"
                    )
                if hi is not None and hi > MAX_REPETITION_THRESHOLD:
                    hi = None
                repeat(lo, hi, i)
            else:
                break
        return seq, i

    def rule(self, i: int) -> int:
        end = self.name(i)
        name = self.s[i:end]
        self.see(name)
        i = self.space(end, False)
        if self.s[i : i + 3] != "::=":
            raise GrammarSyntaxError(f"expecting ::= at {self.at(i)}")
        i = self.space(i + 3, True)
        alts, i = self.alternates(i, False)
        self.rules[name] = alts
        if self.ch(i) == "\r":
            i += 2 if self.ch(i + 1) == "\n" else 1
        elif self.ch(i) == "\n":
            i += 1
        elif self.ch(i):
            raise GrammarSyntaxError(f"expecting newline or end at {self.at(i)}")
        return self.space(i, True)

    def parse(self) -> dict[str, list[list[Item]]]:
        i = self.space(0, True)
        while i < len(self.s):
            i = self.rule(i)
        for ref in self.refs:
            if ref not in self.rules:
                raise GrammarSyntaxError(f"Undefined rule identifier '{ref}'")
        return self.rules


def parse_gbnf(src: str, resolve: TokenResolver | None = None) -> dict[str, list[list[Item]]]:
    """Rules of a GBNF grammar (name → alternatives → items), or ``GrammarSyntaxError``."""
    return _Parser(src, resolve).parse()


# -- Lark emission -----------------------------------------------------------------------------


def _cp(c: int) -> str:
    return f"\\x{{{c:x}}}"


def _lit_char(c: int) -> str:
    if 0xD800 <= c <= 0xDFFF or c > 0x10FFFF:
        raise GrammarSyntaxError(f"invalid code point U+{c:X} in a literal")
    return json.dumps(chr(c), ensure_ascii=False)


class _Emitter:
    def __init__(self, rules: dict[str, list[list[Item]]]) -> None:
        self.names = {name: ("start" if name == "root" else f"r{k}_{name.lower().replace('-', '_')}")
                      for k, name in enumerate(rules)}

    def item(self, it: Item) -> str:
        if isinstance(it, Lit):
            if not it.chars:
                return '""'
            inner = " ".join(_lit_char(c) for c in it.chars)
            return inner if len(it.chars) == 1 else f"({inner})"
        if isinstance(it, Cls):
            if not it.ranges:
                return '""'
            body = "".join(_cp(lo) if lo == hi else f"{_cp(lo)}-{_cp(hi)}" for lo, hi in it.ranges
                           if lo <= hi)
            if not body:
                return "/[^\\x{0}-\\x{10ffff}]/" if not it.negated else "/(?s:.)/"
            return f"/[{'^' if it.negated else ''}{body}]/"
        if isinstance(it, AnyChar):
            return "/(?s:.)/"
        if isinstance(it, Tok):
            return f"<[{'^' if it.negated else ''}{it.token}]>"
        if isinstance(it, Ref):
            return self.names[it.name]
        if isinstance(it, Group):
            return f"({self.alts(it.alts)})"
        if isinstance(it, Rep):
            inner = self.item(it.item)
            if not inner.startswith("(") or not inner.endswith(")"):
                inner = f"({inner})"
            if (it.lo, it.hi) == (0, None):
                return f"{inner}*"
            if (it.lo, it.hi) == (1, None):
                return f"{inner}+"
            if (it.lo, it.hi) == (0, 1):
                return f"{inner}?"
            if it.hi is None:
                return f"{inner}{{{it.lo},}}"
            return f"{inner}{{{it.lo},{it.hi}}}"
        raise TypeError(it)

    def alts(self, alts: list[list[Item]]) -> str:
        return " | ".join(" ".join(self.item(x) for x in seq) if seq else '""' for seq in alts)


def gbnf_to_lark(src: str, resolve: TokenResolver | None = None) -> str:
    """Lark text (llguidance dialect) equivalent to the GBNF grammar ``src``.

    ``resolve(text)`` tokenizes a ``<text>`` token terminal (special tokens parsed); without it
    such terminals are refused as llama.cpp does without a vocabulary. Raises
    ``GrammarSyntaxError`` with llama.cpp's message for a grammar its parser refuses, and
    ``grammar does not contain a 'root' symbol`` when the start rule is missing.
    """
    rules = parse_gbnf(src, resolve)
    if "root" not in rules:
        raise GrammarSyntaxError("grammar does not contain a 'root' symbol")
    em = _Emitter(rules)
    lines = ["%llguidance {}"]
    for name, alts in rules.items():
        lines.append(f"{em.names[name]}: {em.alts(alts)}")
    return "\n".join(lines) + "\n"
