"""GBNF as llama.cpp accepts it: every construct, checked by feeding text to the compiled matcher,
and llama.cpp's parse errors."""

from __future__ import annotations

import pytest

from kvserve.grammar import GrammarCompiler, GrammarError, GrammarSpec
from kvserve.grammar.gbnf import GrammarSyntaxError, gbnf_to_lark


def accepts(compiler: GrammarCompiler, grammar: str, text: str | list[int], *, byte_wise: bool = False) -> bool:
    """Whether ``text`` (or a token list) is a complete sentence of ``grammar``."""
    st = compiler.compile(GrammarSpec("gbnf", grammar)).new_state()
    if isinstance(text, str):
        data = text.encode()
        ids = [compiler.text_to_tokens(bytes([b]))[0] for b in data] if byte_wise else compiler.text_to_tokens(data)
    else:
        ids = text
    for t in ids:
        if not st.allows(t):
            return False
        st.accept(t)
    return st.accepting


@pytest.mark.parametrize("grammar,good,bad", [
    ('root ::= "yes" | "no"', ["yes", "no"], ["maybe", "yesno", ""]),
    ('root ::= ("ab" | "abc") "cd"', ["abcd", "abccd"], ["abd"]),  # character-level, not longest match
    ('root ::= [a-c]+', ["abcab"], ["abd", ""]),
    ('root ::= [^a-c\\n]+', ["xyz", "d e"], ["xa", "x\ny"]),
    ('root ::= . "!"', ["a!", "é!", "\n!"], ["ab!", "!"]),
    ('root ::= [0-9]{3}', ["123"], ["12", "1234"]),
    ('root ::= [0-9]{2,3}', ["12", "123"], ["1", "1234"]),
    ('root ::= "a"{2,}', ["aa", "aaaaa"], ["a"]),
    ('root ::= "a"{0,2} "b"', ["b", "ab", "aab"], ["aaab"]),
    ('root ::= ("x" "y"?)* "." ', ["xxyx.", "."], ["y."]),
    ('root ::= "\\x41\\u00e9\\U0001F600\\t\\"\\\\"', ["A\u00e9\U0001F600\t\"\\"], ["A"]),
    ('root ::= [\\-\\]]+', ["-]-"], ["a"]),
    ('root ::= item ("," item)*\nitem ::= [a-z]+  # a comment\n', ["a,bc,d"], ["a,", ",a"]),
    ('root ::= "a" |\n  "b"\n', ["a", "b"], ["ab"]),
    ('root ::= (\n  "a"\n  "b"\n)', ["ab"], ["a"]),
    ('root ::= expr\nexpr ::= expr "+" num | num\nnum ::= [0-9]', ["1+2+3", "4"], ["1+", "+1"]),
])
def test_gbnf_constructs(compiler, grammar: str, good: list[str], bad: list[str]) -> None:
    for text in good:
        assert accepts(compiler, grammar, text), (grammar, text)
        assert accepts(compiler, grammar, text, byte_wise=True), (grammar, text)
    for text in bad:
        assert not accepts(compiler, grammar, text), (grammar, text)


def test_token_terminals_and_negations(compiler, tok) -> None:
    im_start = tok.encode("<|im_start|>", add_special=False, parse_special=True)
    assert len(im_start) == 1
    tid = im_start[0]
    a = tok.encode("a", add_special=False, parse_special=False)
    assert accepts(compiler, f'root ::= <[{tid}]> "a"', [tid] + a)
    assert accepts(compiler, 'root ::= <|im_start|> "a"', [tid] + a)  # <text> names one token
    assert not accepts(compiler, f'root ::= <[{tid}]> "a"', a)
    # a special token is reachable only through a token terminal, never through its text
    assert not accepts(compiler, 'root ::= "<|im_start|>"', [tid])
    other = tok.encode("hello", add_special=False, parse_special=False)
    assert accepts(compiler, f'root ::= !<[{tid}]>*', other + a)
    assert not accepts(compiler, f'root ::= !<[{tid}]>*', other + [tid])
    assert accepts(compiler, 'root ::= !<|im_start|> "a"', other[:1] + a)
    assert not accepts(compiler, 'root ::= !<|im_start|> "a"', [tid] + a)


@pytest.mark.parametrize("grammar,message", [
    ('root ::= "a', "unexpected end of input"),
    ("root ::= x", "Undefined rule identifier 'x'"),
    ('rot ::= "a"', "grammar does not contain a 'root' symbol"),
    ("root ::= *", "expecting preceding item to */+/?/{ at "),
    ('root ::= "a"{3000}', "number of repetitions exceeds sane defaults"),
    ('root ::= "a"{2,x}', "expecting '}' at x}"),
    ('root ::= "a"{x}', "expecting an int at x}"),
    ("root ::= <hello world>", "invalid token '<hello world>'"),
    ('root ::= "\\q"', "unknown escape at \\q"),
    ('root ::= "\\x4"', "expecting 2 hex chars at 4\""),
    ('root = "a"', 'expecting ::= at = "a"'),
    ('root ::= ("a"', "expecting ')' at "),
    ('root ::= "a" )', 'expecting newline or end at )'),
])
def test_gbnf_errors_are_llama_cpp_messages(compiler, grammar: str, message: str) -> None:
    with pytest.raises(GrammarError) as e:
        compiler.compile(GrammarSpec("gbnf", grammar))
    assert str(e.value).startswith("Failed to initialize samplers: failed to parse grammar: ")
    assert message in str(e.value)


def test_text_token_terminal_needs_a_vocabulary() -> None:
    with pytest.raises(GrammarSyntaxError, match="no vocab to parse token"):
        gbnf_to_lark("root ::= <think>")
    assert "<[5]>" in gbnf_to_lark("root ::= <[5]>")


def test_later_definition_replaces_earlier(compiler) -> None:
    g = 'root ::= x\nx ::= "a"\nx ::= "b"'
    assert accepts(compiler, g, "b") and not accepts(compiler, g, "a")


def test_llguidance_lark_passthrough(compiler) -> None:
    g = '%llguidance {}\nstart: "x" /[0-9]+/'
    assert accepts(compiler, g, "x42") and not accepts(compiler, g, "y")
