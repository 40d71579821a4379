"""llama.cpp's built-in chat formats: the non-Jinja route (``--no-jinja``) and ``--chat-template NAME``.

Each format turns ``(role, content)`` pairs into a prompt string, following the rules of
``llm_chat_apply_template`` in llama.cpp's ``src/llama-chat.cpp``. ``detect_format`` picks the
format for a template string as ``llm_chat_detect_template`` does: a built-in name, else markers
found in the (Jinja) template text. ``trim`` strips C ``isspace`` characters only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Msg = tuple[str, str]  # (role, content)
Format = Callable[[Sequence[Msg], bool], str]

_WS = " \t\n\v\f\r"
EOS_DS = "<｜end▁of▁sentence｜>"


def trim(text: str) -> str:
    return text.strip(_WS)


def _each(
    head: Callable[[str], str], tail: str, gen: str, body: Callable[[str, str], str] | None = None
) -> Format:
    """``head(role) + content + tail`` per message (``body`` rewrites the content), ``gen`` to prompt."""

    def fmt(chat: Sequence[Msg], add_ass: bool) -> str:
        out = [head(r) + (body(r, c) if body else c) + tail for r, c in chat]
        return "".join(out) + (gen if add_ass else "")

    return fmt


def _by_role(parts: dict[str, tuple[str, str]], gen: str, strip: Sequence[str] = ()) -> Format:
    """Roles in ``parts`` get ``prefix + content + suffix`` (trimmed for roles in ``strip``);
    other roles are dropped."""

    def fmt(chat: Sequence[Msg], add_ass: bool) -> str:
        out = []
        for role, content in chat:
            if role in parts:
                pre, post = parts[role]
                out.append(pre + (trim(content) if role in strip or "*" in strip else content) + post)
        return "".join(out) + (gen if add_ass else "")

    return fmt


def _mistral_v7(trailing: str) -> Format:
    def fmt(chat: Sequence[Msg], add_ass: bool) -> str:
        out = []
        for role, content in chat:
            if role == "system":
                out.append(f"[SYSTEM_PROMPT]{trailing}{content}[/SYSTEM_PROMPT]")
            elif role == "user":
                out.append(f"[INST]{trailing}{content}[/INST]")
            else:
                out.append(f"{trailing}{content}</s>")
        return "".join(out)

    return fmt


def _mistral(leading: str, trailing: str, trim_assistant: bool) -> Format:
    def fmt(chat: Sequence[Msg], add_ass: bool) -> str:
        out, inside = [], False
        for role, content in chat:
            if not inside:
                out.append(f"{leading}[INST]{trailing}")
                inside = True
            if role == "system":
                out.append(content + "\n\n")
            elif role == "user":
                out.append(f"{content}{leading}[/INST]")
            else:
                out.append(trailing + (trim(content) if trim_assistant else content) + "</s>")
                inside = False
        return "".join(out)

    return fmt


def _llama2(system: bool, bos_inside: bool, strip: bool) -> Format:
    def fmt(chat: Sequence[Msg], add_ass: bool) -> str:
        out, inside = ["[INST] "], True  # the BOS at the start is the tokenizer's
        for role, content in chat:
            content = trim(content) if strip else content
            if not inside:
                inside = True
                out.append("<s>[INST] " if bos_inside else "[INST] ")
            if role == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system else content + "\n")
            elif role == "user":
                out.append(content + " [/INST]")
            else:
                out.append(content + "</s>")
                inside = False
        return "".join(out)

    return fmt


def _monarch(chat: Sequence[Msg], add_ass: bool) -> str:
    out = [("" if i == 0 else "<s>") + f"{r}\n{c}</s>\n" for i, (r, c) in enumerate(chat)]
    return "".join(out) + ("<s>assistant\n" if add_ass else "")


def _gemma(chat: Sequence[Msg], add_ass: bool) -> str:
    out, system = [], ""
    for role, content in chat:
        if role == "system":
            system += trim(content)
            continue
        role = "model" if role == "assistant" else role
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(trim(content) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add_ass else "")


def _orion(chat: Sequence[Msg], add_ass: bool) -> str:
    out, system = [], ""
    for role, content in chat:
        if role == "system":
            system += content
        elif role == "user":
            out.append("Human: " + (system + "\n\n" if system else "") + content + "\n\nAssistant: </s>")
            system = ""
        else:
            out.append(content + "</s>")
    return "".join(out)


def _openchat(chat: Sequence[Msg], add_ass: bool) -> str:
    out = []
    for role, content in chat:
        if role == "system":
            out.append(content + "<|end_of_turn|>")
        else:
            out.append(f"GPT4 Correct {role[:1].upper()}{role[1:]}: {content}<|end_of_turn|>")
    return "".join(out) + ("GPT4 Correct Assistant:" if add_ass else "")


def _vicuna(orca: bool) -> Format:
    system = ("SYSTEM: ", "\n") if orca else ("", "\n\n")
    return _by_role(
        {"system": system, "user": ("USER: ", "\n"), "assistant": ("ASSISTANT: ", "</s>\n")}, "ASSISTANT:"
    )


def _chatglm3(chat: Sequence[Msg], add_ass: bool) -> str:
    return "[gMASK]sop" + "".join(f"<|{r}|>\n {c}" for r, c in chat) + ("<|assistant|>" if add_ass else "")


def _chatglm4(chat: Sequence[Msg], add_ass: bool) -> str:
    return "[gMASK]<sop>" + "".join(f"<|{r}|>\n{c}" for r, c in chat) + ("<|assistant|>\n" if add_ass else "")


def _minicpm(chat: Sequence[Msg], add_ass: bool) -> str:
    return "".join(f"<用户>{trim(c)}<AI>" if r == "user" else trim(c) for r, c in chat)


def _rwkv_world(chat: Sequence[Msg], add_ass: bool) -> str:
    out = []
    for i, (role, content) in enumerate(chat):
        if role == "system":
            out.append(f"System: {trim(content)}\n\n")
        elif role == "user":
            out.append(f"User: {trim(content)}\n\n" + ("Assistant:" if i == len(chat) - 1 else ""))
        elif role == "assistant":
            out.append(f"Assistant: {trim(content)}\n\n")
    return "".join(out)


def _granite3(chat: Sequence[Msg], add_ass: bool) -> str:
    out = [
        f"<|start_of_role|>{r}<|end_of_role|>"
        + ("<|tool_call|>" if r == "assistant_tool_call" else "")
        + c
        + "<|end_of_text|>\n"
        for r, c in chat
    ]
    return "".join(out) + ("<|start_of_role|>assistant<|end_of_role|>" if add_ass else "")


def _granite4(chat: Sequence[Msg], add_ass: bool) -> str:
    out = [
        (
            "<|start_of_role|>assistant<|end_of_role|><|tool_call|>"
            if r == "assistant_tool_call"
            else f"<|start_of_role|>{r}<|end_of_role|>"
        )
        + c
        + "<|end_of_text|>\n"
        for r, c in chat
    ]
    return "".join(out) + ("<|start_of_role|>assistant<|end_of_role|>" if add_ass else "")


def _gigachat(chat: Sequence[Msg], add_ass: bool) -> str:
    has_system = bool(chat) and chat[0][0] == "system"
    out = [f"<s>{chat[0][1]}<|message_sep|>" if has_system else "<s>"]
    for role, content in chat[1 if has_system else 0 :]:
        if role == "user":
            out.append(
                f"user<|role_sep|>{content}<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
            )
        elif role == "assistant":
            out.append(f"assistant<|role_sep|>{content}<|message_sep|>")
    return "".join(out) + ("assistant<|role_sep|>" if add_ass else "")


def _bailing_role(role: str) -> str:
    return "HUMAN" if role == "user" else role.upper()


def _bailing(think: bool) -> Format:
    def fmt(chat: Sequence[Msg], add_ass: bool) -> str:
        out = "".join(f"<role>{_bailing_role(r)}</role>{c}" for r, c in chat)
        return out + (("<role>ASSISTANT</role>" + ("<think>" if think else "")) if add_ass else "")

    return fmt


def _bailing2(chat: Sequence[Msg], add_ass: bool) -> str:
    has_system = bool(chat) and chat[0][0] == "system"
    out = "" if has_system else "<role>SYSTEM</role>detailed thinking off<|role_end|>"
    out += "".join(f"<role>{_bailing_role(r)}</role>{c}<|role_end|>" for r, c in chat)
    return out + ("<role>ASSISTANT</role>" if add_ass else "")


def _smolvlm(chat: Sequence[Msg], add_ass: bool) -> str:
    out = ["<|im_start|>"]
    for role, content in chat:
        if role == "system":
            out.append(content + "\n\n")
        elif role == "user":
            out.append(f"User: {content}<end_of_utterance>\n")
        else:
            out.append(f"Assistant: {content}<end_of_utterance>\n")
    return "".join(out) + ("Assistant:" if add_ass else "")


def _hunyuan_dense(chat: Sequence[Msg], add_ass: bool) -> str:
    out = []
    for i, (role, content) in enumerate(chat):
        if i == 0 and role == "system":
            out.append(content + "<｜hy_place▁holder▁no▁3｜>")
        if role == "assistant":
            out.append(f"<｜hy_Assistant｜>{content}<｜hy_place▁holder▁no▁2｜>")
        elif role == "user":
            out.append(f"<｜hy_User｜>{content}<｜hy_Assistant｜>")
    return "".join(out)


def _hunyuan_vl(chat: Sequence[Msg], add_ass: bool) -> str:
    out = ["<｜hy_begin▁of▁sentence｜>"]
    for i, (role, content) in enumerate(chat):
        if i == 0 and role == "system":
            out.append(content + "<｜hy_place▁holder▁no▁3｜>")
        elif role == "user":
            out.append(content + "<｜hy_User｜>")
        elif role == "assistant":
            out.append(content + "<｜hy_Assistant｜>")
    return "".join(out)


def _hunyuan_moe(chat: Sequence[Msg], add_ass: bool) -> str:
    out = []
    for role, content in chat:
        if role == "system":
            out.append(f"<|startoftext|>{content}<|extra_4|>")
        elif role == "assistant":
            out.append(f"{content}<|eos|>")
        else:
            out.append(f"<|startoftext|>{content}<|extra_0|>")
    return "".join(out)


def _dots1(chat: Sequence[Msg], add_ass: bool) -> str:
    out = []
    for role, content in chat:
        if role == "system":
            out.append(f"<|system|>{content}<|endofsystem|>")
        elif role == "user":
            out.append(f"<|userprompt|>{content}<|endofuserprompt|>")
        else:
            out.append(f"<|response|>{content}<|endofresponse|>")
    return "".join(out) + ("<|response|>" if add_ass else "")


_KIMI = {
    "system": "<|im_system|>system<|im_middle|>",
    "user": "<|im_user|>user<|im_middle|>",
    "assistant": "<|im_assistant|>assistant<|im_middle|>",
    "tool": "<|im_system|>tool<|im_middle|>",
}
_PANGU = {"system": "系统", "user": "用户", "assistant": "助手", "tool": "工具", "function": "方法"}


def _pangu(chat: Sequence[Msg], add_ass: bool) -> str:
    out = []
    for i, (role, content) in enumerate(chat):
        if i == 0 and role != "system":
            out.append("[unused9]系统：[unused10]")
        if role in _PANGU:
            out.append(f"[unused9]{_PANGU[role]}：{content}[unused10]")
    return "".join(out) + ("[unused9]助手：" if add_ass else "")


def _role_tag(open_: str, close: str) -> Callable[[str], str]:
    return lambda role: f"{open_}{role}{close}"


def _seed_body(role: str, content: str) -> str:
    return trim(content) if role == "assistant" else content


def _trimmed(role: str, content: str) -> str:
    return trim(content)


_EXAONE3 = {
    "system": ("[|system|]", "[|endofturn|]\n"),
    "user": ("[|user|]", "\n"),
    "assistant": ("[|assistant|]", "[|endofturn|]\n"),
}

# Every name llama.cpp knows (``LLM_CHAT_TEMPLATES``), plus ``dots1``, which it only detects.
FORMATS: dict[str, Format] = {
    "chatml": _each(_role_tag("<|im_start|>", "\n"), "<|im_end|>\n", "<|im_start|>assistant\n"),
    "llama2": _llama2(system=False, bos_inside=False, strip=False),
    "llama2-sys": _llama2(system=True, bos_inside=False, strip=False),
    "llama2-sys-bos": _llama2(system=True, bos_inside=True, strip=False),
    "llama2-sys-strip": _llama2(system=True, bos_inside=False, strip=True),
    "mistral-v1": _mistral(" ", " ", trim_assistant=False),
    "mistral-v3": _mistral("", " ", trim_assistant=True),
    "mistral-v3-tekken": _mistral("", "", trim_assistant=False),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": _each(_role_tag("<|", "|>\n"), "<|end|>\n", "<|assistant|>\n"),
    "phi4": _each(_role_tag("<|im_start|>", "<|im_sep|>"), "<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _each(_role_tag("<|", "|>\n"), "\n", "<|assistant|>\n"),
    "zephyr": _each(_role_tag("<|", "|>\n"), "<|endoftext|>\n", "<|assistant|>\n"),
    "monarch": _monarch,
    "gemma": _gemma,
    "orion": _orion,
    "openchat": _openchat,
    "vicuna": _vicuna(orca=False),
    "vicuna-orca": _vicuna(orca=True),
    "deepseek": _by_role(
        {
            "system": ("", ""),
            "user": ("### Instruction:\n", "\n"),
            "assistant": ("### Response:\n", "\n<|EOT|>\n"),
        },
        "### Response:\n",
    ),
    "deepseek2": _by_role(
        {"system": ("", "\n\n"), "user": ("User: ", "\n\n"), "assistant": ("Assistant: ", EOS_DS)},
        "Assistant:",
    ),
    "deepseek3": _by_role(
        {"system": ("", "\n\n"), "user": ("<｜User｜>", ""), "assistant": ("<｜Assistant｜>", EOS_DS)},
        "<｜Assistant｜>",
    ),
    "deepseek-ocr": lambda chat, add_ass: "".join(c for _, c in chat),
    "command-r": _by_role(
        {
            r: (f"<|START_OF_TURN_TOKEN|><|{t}_TOKEN|>", "<|END_OF_TURN_TOKEN|>")
            for r, t in (("system", "SYSTEM"), ("user", "USER"), ("assistant", "CHATBOT"))
        },
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        strip="*",
    ),
    "llama3": _each(
        _role_tag("<|start_header_id|>", "<|end_header_id|>\n\n"),
        "<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        _trimmed,
    ),
    "chatglm3": _chatglm3,
    "chatglm4": _chatglm4,
    "glmedge": _each(_role_tag("<|", "|>\n"), "", "<|assistant|>"),
    "minicpm": _minicpm,
    "exaone3": _by_role(_EXAONE3, "[|assistant|]", strip="*"),
    "exaone4": _by_role({**_EXAONE3, "tool": ("[|tool|]", "[|endofturn|]\n")}, "[|assistant|]", strip="*"),
    "exaone-moe": _by_role(
        {r: (f"<|{r}|>\n", "<|endofturn|>\n") for r in ("system", "user", "assistant", "tool")},
        "<|assistant|>\n",
        strip="*",
    ),
    "rwkv-world": _rwkv_world,
    "granite": _granite3,
    "granite-4.0": _granite4,
    "granite-4.1": _granite4,
    "gigachat": _gigachat,
    "megrez": _each(
        _role_tag("<|role_start|>", "<|role_end|>"), "<|turn_end|>", "<|role_start|>assistant<|role_end|>"
    ),
    "yandex": _by_role(
        {"user": (" Пользователь: ", "\n\n"), "assistant": (" Ассистент: ", "\n\n")}, " Ассистент:[SEP]"
    ),
    "bailing": _bailing(think=False),
    "bailing-think": _bailing(think=True),
    "bailing2": _bailing2,
    "llama4": _each(
        _role_tag("<|header_start|>", "<|header_end|>\n\n"),
        "<|eot|>",
        "<|header_start|>assistant<|header_end|>\n\n",
        _trimmed,
    ),
    "smolvlm": _smolvlm,
    "hunyuan-moe": _hunyuan_moe,
    "gpt-oss": lambda chat, add_ass: (
        "".join(
            f"<|start|>{r}<|message|>{c}" + ("<|return|>" if r == "assistant" else "<|end|>") for r, c in chat
        )
        + ("<|start|>assistant" if add_ass else "")
    ),
    "hunyuan-dense": _hunyuan_dense,
    "hunyuan-vl": _hunyuan_vl,
    "kimi-k2": lambda chat, add_ass: (
        "".join(_KIMI.get(r, "") + c + "<|im_end|>" for r, c in chat)
        + (_KIMI["assistant"] if add_ass else "")
    ),
    "seed_oss": _each(_role_tag("<seed:bos>", "\n"), "<seed:eos>", "<seed:bos>assistant\n", _seed_body),
    "grok-2": lambda chat, add_ass: (
        "".join(
            f"System: {trim(c)}<|separator|>\n\n"
            if r == "system"
            else f"Human: {trim(c)}<|separator|>\n\n"
            if r == "user"
            else f"Assistant: {c}<|separator|>\n\n"
            if r == "assistant"
            else ""
            for r, c in chat
        )
        + ("Assistant:" if add_ass else "")
    ),
    "pangu-embedded": _pangu,
    "solar-open": _each(_role_tag("<|begin|>", "<|content|>"), "<|end|>", "<|begin|>assistant"),
    "dots1": _dots1,
}

DETECT_ONLY = frozenset({"dots1"})
BUILTIN_NAMES: tuple[str, ...] = tuple(sorted(n for n in FORMATS if n not in DETECT_ONLY))


def apply_format(name: str, chat: Sequence[Msg], add_ass: bool) -> str:
    return FORMATS[name](chat, add_ass)
