"""What docs/compat.md says about tool calls and reasoning (rendered by ``kvserve.args.render``)."""

from __future__ import annotations

COMPAT_SECTION = """
## Tool calls and reasoning (`/v1/chat/completions`)

`tools`, `tool_choice` (`auto`, `none`, `required`, `{"type": "function", "function": {"name": ...}}`),
`parallel_tool_calls`, `reasoning_format`, `chat_template_kwargs` (`enable_thinking`, ...),
`reasoning_effort`, `reasoning_budget_tokens` and the flags `--reasoning-format`, `-rea`,
`--reasoning-budget`, `--reasoning-budget-message`, `--reasoning-effort`, `--reasoning-preserve`,
`--skip-chat-parsing` are implemented. Output is parsed into `message.tool_calls` /
`message.reasoning_content`, or streamed as llama-server's deltas (`delta.reasoning_content`;
`delta.tool_calls` whose first entry per call carries `index`, `id`, `type`, `function.name`, then
argument fragments; `finish_reason: "tool_calls"` after an end of generation or a stop word).
Markers that may be arriving (`<tool_c`, `</thi`) are held back while streaming.

- The tool-call family is recognised from markers in the template source: Mistral `[TOOL_CALLS]`
  (`[{...}]` arrays or `name[ARGS]{...}` / `name[CALL_ID]id[ARGS]{...}`), Hermes / Qwen 2.5
  `<tool_call>{...}</tool_call>`, Llama 3.x (`<|start_header_id|>` with `<|python_tag|>` or
  `"parameters"`: a reply that is `{"name": ..., "parameters": ...}`, several joined by `;`), else
  a generic JSON format. llama-server b10621 derives its parser by analysing the template and has
  dedicated handlers for more families (GPT-OSS, Kimi K2, DeepSeek V3.2, Qwen3-Coder XML, Gemma 4
  and others); those templates get the generic parser here.
- A template that cannot render `tools` (SmolLM2's, Gemma 3's) gets the tools described in its
  system message with the generic JSON format (`{"tool_call": {"name", "arguments"}}`,
  `{"tool_calls": [...]}` with parallel calls, `{"response": "..."}` to answer); earlier calls and
  `tool` results are shown to it in that JSON. llama-server renders such a template without the
  tools and returns plain content.
- A reply that is only a JSON call (`{"name": ..., "arguments": ...}`, optionally in a json code
  fence) is a tool call in every family: small models (Qwen2.5-Coder-0.5B) drop their markers;
  llama-server returns it as content. Only calls of a tool in `tools` are parsed; anything else is
  content. `arguments` is the JSON text as the model wrote it.
- `tool_choice: "required"` and a named function constrain the output with a grammar from its
  first token to one call written as bare JSON, the arguments following the tool's parameters
  schema (with a thinking block opened by the prompt, from its end tag on), so even a 135M model
  produces a valid call. llama-server lets text precede the call and ignores a named function
  (a non-string `tool_choice` counts as `auto` there); here an unknown name is a 400, and
  `required` with `response_format` / `json_schema` is a 400. `auto` is not constrained
  (llama-server applies a lazy grammar from the family's start marker).
- `parallel_tool_calls: false` keeps the first call; the default is the template's capability.
- Templates that `tojson` tool-call arguments get them as objects (llama.cpp's workaround);
  `enable_thinking` is always passed to the template: true for a template with thinking (tags or a
  reaction to the flag) unless `-rea off`, `reasoning_effort: "none"` or the request says otherwise.
- Thinking tags recognised in templates: `<think>`/`</think>`, `[THINK]`/`[/THINK]`,
  `<|START_THINKING|>`/`<|END_THINKING|>`. A block opened by the generation prompt is parsed as
  reasoning from the first token; an unterminated block is reasoning; whitespace-only reasoning
  is dropped. `deepseek-legacy` parses like `deepseek`, as b10621's parser does (it does not read
  `reasoning_in_content`).
- Reasoning budgets count generated tokens inside the block (the generation prompt's tokens are
  seen first, so an opened block counts from the first token) and then force the message and the
  end tag, one token per step. llama.cpp also waits for an incomplete UTF-8 character before
  forcing; kvserve does not. `reasoning_control` (ending reasoning at runtime) is refused.
- `generation_settings.chat_format` is `peg-native` for chat requests, as in b10621.
"""
