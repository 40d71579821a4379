"""What docs/compat.md says about the Anthropic, Responses and Vertex AI routes (rendered by
``kvserve.args.render``)."""

from __future__ import annotations

COMPAT_SECTION = """
## Anthropic Messages, OpenAI Responses and Vertex AI

`POST /v1/messages`, `/v1/messages/count_tokens`, `/v1/responses` (and `/responses`) convert
their bodies to a chat body as llama-server b10621 does and take the chat path, so templates,
tool calls, reasoning, sampling fields and the prompt cache behave as on `/v1/chat/completions`.

- Anthropic: `system` (string or text blocks), `text` / `thinking` / `tool_use` / `tool_result`
  blocks, `tools` (`input_schema`), `tool_choice`, `stop_sequences`, `max_tokens` (4096 when
  absent), `temperature`, `top_p`, `top_k`, `stream`, `chat_template_kwargs` and `thinking` are
  used; other keys (`metadata`, `service_tier`, ...) are dropped, as llama-server drops them.
  Responses carry `thinking` (empty `signature`), `text` and `tool_use` blocks, `stop_reason`
  `end_turn` / `tool_use` / `max_tokens` (a matched stop sequence is `end_turn` with
  `stop_sequence` set, as in llama-server) and `usage` with `input_tokens` (not from the cache)
  and `cache_read_input_tokens`. The stream is `message_start`, content blocks, `message_delta`,
  `message_stop`; an error after the start is `event: error`.
- Anthropic differences from llama-server: `image` blocks (also inside `tool_result`) are a 400
  naming the block (`image input is not supported`; llama-server answers 500 with that text);
  unknown block types are a 400 (llama-server drops them; `redacted_thinking` is dropped here too);
  `tool_choice` `{"type": "tool", "name": ...}` forces that tool (llama-server: any tool),
  `{"type": "none"}` is `tool_choice: none` and `disable_parallel_tool_use` is
  `parallel_tool_calls: false` (llama-server ignores all three); `thinking: {"type": "disabled"}`
  sets `enable_thinking: false` (llama-server ignores it). In the stream each content block is
  stopped before the next one starts (llama-server stops them all at the end), and
  `content_block_start` carries `input: {}` (tool use) and `signature: ""` (thinking), as
  Anthropic's own stream does. Malformed bodies are 400s (llama-server: mostly 500).
- Responses: string or item-list `input` (input/output messages, `function_call`,
  `function_call_output`, `reasoning`), `instructions`, function `tools`, `tool_choice`,
  `max_output_tokens`, `reasoning.effort`; every other key passes to the chat body. Beyond
  llama-server: `text.format` becomes `response_format`, `tool_choice` `{"type": "function",
  "name": ...}` is accepted, and stream events carry `sequence_number`, `output_index` and
  `content_index` (so the OpenAI SDKs' stream helpers work); text released with the final result
  is streamed before the `.done` events (llama-server leaves it out of the deltas). Refused
  (400): `previous_response_id` (responses are not stored), `input_file` and `input_image` parts
  (no media input), `n` other than 1.
- Vertex AI (`AIP_MODE=PREDICTION`): `AIP_HTTP_PORT` (default 8080) replaces `--port`,
  `AIP_PREDICT_ROUTE` (default `/predict`) takes `{"instances": [...]}` (at most 128), each run on
  the route its `@requestFormat` names (camelCase alias such as `chatCompletions`, or a path),
  never streamed, answered as `{"predictions": [...]}`; `AIP_HEALTH_ROUTE` answers like `/health`.
"""
