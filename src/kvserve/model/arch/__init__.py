"""Architecture registry: GGUF ``general.architecture`` → nn.Module class."""

from __future__ import annotations

from torch import nn

from .gemma3 import Gemma3Model
from .llama import LlamaModel
from .qwen2 import Qwen2Model
from .qwen3 import Qwen3Model

ARCHITECTURES: dict[str, type[nn.Module]] = {
    "llama": LlamaModel,
    "qwen2": Qwen2Model,
    "qwen3": Qwen3Model,
    "gemma3": Gemma3Model,
}
