"""Request-body documentation for ``/openapi.json``.

The handlers parse bodies themselves (llama-server's lenient semantics: nulls are defaults,
unknown fields ignored, limits clamp, its own error messages), so these pydantic models only
*describe* the bodies: ``doc_body(Model)`` goes into a route's ``openapi_extra`` and
``install_openapi`` adds the model schemas to ``components``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

Prompt = str | list[int | str] | list[str | list[int | str]] | dict[str, Any]
Stop = str | list[str]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class CompletionRequest(_Body):
    """llama.cpp native completion (also accepted by /v1/completions with OpenAI aliases)."""

    prompt: Prompt = Field(description="String, token ids, mixed array, or an array of prompts")
    stream: bool = False
    n_predict: int = Field(-1, description="Aliases: max_tokens, max_completion_tokens; -1 = unlimited")
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    mirostat: int = 0
    seed: int = -1
    stop: Stop = Field(default_factory=list)
    n_probs: int = Field(0, description="Alias: logprobs")
    n_cmpl: int = Field(1, description="Alias: n; parallel samples of the same prompt")
    cache_prompt: bool = True
    n_cache_reuse: int = 0
    id_slot: int = -1
    n_keep: int = 0
    return_tokens: bool = False
    return_progress: bool = False
    timings_per_token: bool = False
    post_sampling_probs: bool = False
    logit_bias: list[list[Any]] | dict[str, Any] = Field(default_factory=list)
    samplers: list[str] | str | None = None
    response_fields: list[str] = Field(default_factory=list)


class ChatMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Body):
    """OpenAI chat completion; llama.cpp sampling fields of CompletionRequest also apply."""

    messages: list[ChatMessage]
    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = Field(None, description='{"include_usage": bool}')
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: Stop | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = Field(None, description='Only {"type": "text"}')
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool | None = None


class InfillRequest(_Body):
    input_prefix: str | list[int | str]
    input_suffix: str | list[int | str]
    input_extra: list[dict[str, str]] = Field(default_factory=list, description='[{"filename", "text"}]')
    prompt: str = ""
    stream: bool = False
    n_predict: int = -1


class TokenizeRequest(_Body):
    content: str | list[int | str]
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]


class EmbeddingRequest(_Body):
    input: str | list[int] | list[str | list[int]] | None = None
    content: str | list[int] | list[str | list[int]] | None = None
    encoding_format: str = Field("float", description="float | base64 (OpenAI format)")
    embd_normalize: int = 2
    model: str | None = None


class SlotActionRequest(_Body):
    filename: str = Field("", description="For save/restore: a bare file name inside --slot-save-path")


class ResponsesInputTokensRequest(_Body):
    input: str | list[dict[str, Any]]
    instructions: str | None = None


class ResponsesRequest(ResponsesInputTokensRequest):
    """OpenAI Responses; converted to a chat completion (llama.cpp sampling fields also apply)."""

    model: str | None = None
    stream: bool = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = Field(None, description='Only {"type": "function", ...} tools')
    tool_choice: str | dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = Field(None, description='{"effort": ...}')
    text: dict[str, Any] | None = Field(None, description='{"format": {"type": "text"|"json_object"|"json_schema"}}')


class AnthropicMessage(_Body):
    role: str
    content: str | list[dict[str, Any]]


class AnthropicMessagesRequest(_Body):
    """Anthropic Messages; converted to a chat completion."""

    messages: list[AnthropicMessage]
    model: str | None = None
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int = Field(4096, description="Not required here (4096 when absent)")
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[dict[str, Any]] | None = Field(None, description="[{name, description, input_schema}]")
    tool_choice: dict[str, Any] | None = Field(None, description='{"type": "auto"|"any"|"tool"|"none"}')
    thinking: dict[str, Any] | None = Field(None, description='{"type": "enabled", "budget_tokens": N}')


MODELS: list[type[BaseModel]] = [CompletionRequest, ChatMessage, ChatCompletionRequest, InfillRequest,
                                 TokenizeRequest, DetokenizeRequest, EmbeddingRequest, SlotActionRequest,
                                 ResponsesInputTokensRequest, ResponsesRequest, AnthropicMessage,
                                 AnthropicMessagesRequest]


def doc_body(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    return {"requestBody": {"required": required, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        for m in MODELS:
            js = m.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(js.pop("$defs", {}))
            comps[m.__name__] = js
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

