"""What docs/compat.md says about structured output (rendered by ``kvserve.args.render``)."""

from __future__ import annotations

COMPAT_SECTION = """
## Structured output (grammars and JSON schemas)

`grammar` (GBNF), `json_schema`, `response_format` (`json_object` with or without `schema`;
`json_schema` as `{"json_schema": {"schema": ...}}` or with the schema directly under `schema`),
`grammar_lazy` + `grammar_triggers`, and the server defaults `--grammar`, `--grammar-file`, `-j`,
`-jf` are implemented on `/completion`, `/v1/completions` and `/v1/chat/completions`, with
[llguidance](https://github.com/guidance-ai/llguidance) doing the matching.

- GBNF is parsed with llama.cpp's rules and error messages (`.`, `{m,n}`, `<[id]>`, `<token>`,
  `!<...>`, escapes, comments, newline rules) and keeps its character-level semantics. A grammar
  that does not parse is a 400 `Failed to initialize samplers: failed to parse grammar: <reason>`
  (llama-server says the same without the reason, which it only logs). Grammars starting with
  `%llguidance` are llguidance Lark (llama-server needs an llguidance build for these).
- Sampling follows llama.cpp: the chain runs unmasked and a token outside the grammar is
  resampled with the grammar's mask applied first; end-of-generation is allowed exactly when the
  grammar accepts. A grammar that allows no further token (it cannot be continued, or it is
  complete while `ignore_eos` bans the end) ends the request with `stop_type: "grammar"`
  (`finish_reason: "stop"`); llama-server has no such case (it aborts or loops).
- A schema that does not compile is a 400 `"json_schema": <reason>`; compilation is bounded by
  llguidance's fuel limits and a 10 s time limit (400 when exceeded).
- `generation_settings.grammar` shows the GBNF text, or the JSON schema for schema requests
  (llama-server shows the GBNF it converted the schema to).
- Server defaults: if several of `--grammar`, `--grammar-file`, `-j`, `-jf` are given, `-jf`
  wins, then `-j`, `--grammar-file`, `--grammar` (llama-server: the last one on the command line).
- Left-recursive GBNF rules, which llama.cpp refuses, are accepted.
- A special (control) token is produced only through a token terminal (`<[id]>`, `<name>`),
  never by a string literal that spells its text; llama.cpp matches literals against the
  token's text.
- `preserved_tokens` is still refused (400); so a one-token trigger word in `grammar_triggers`
  (which llama-server requires to be a preserved token) is a 400, as there when it is not listed.

JSON schemas give llama.cpp's json-schema-to-grammar shapes: required properties first, then
optional ones, each in schema order; no additional properties unless `additionalProperties`
allows them (`{"type": "object"}` alone is any object); llama.cpp's whitespace rule (nothing,
one space, or one or two newlines and up to 20 spaces/tabs); string formats `date`, `time`,
`date-time`, `uuid` enforced, others plain strings; unknown keywords ignored. Divergences:

- `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum` on `number` are enforced
  (llama.cpp bounds integers only and leaves numbers unbounded).
- `pattern` is llguidance's regex dialect (Rust `regex`); llama.cpp translates a JavaScript-style
  subset and refuses some constructs (anchors inside the pattern). As in llama.cpp a `pattern`
  takes precedence over `format`.
- Number literals: llama.cpp limits the integral part and the fraction to 16 digits each;
  llguidance allows any length.
- Whitespace is allowed where llguidance's JSON grammar allows it (between any two JSON
  tokens), each time bounded by llama.cpp's rule; llama.cpp places its `space` rule at fixed
  positions of its generated grammar.
"""
