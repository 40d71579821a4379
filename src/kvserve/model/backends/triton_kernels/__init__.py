"""Triton kernels of the CUDA attention backend, and their launchers, a module a concept:

- ``common``: the paged cache's addressing (``_kv_block``), ``DecodeWorkspace`` (split partials);
- ``rope``: ``rope_write`` (RoPE on q and k, k/v written to the cache);
- ``decode``: ``decode_attention`` (split-K decode and the merge of the splits);
- ``cascade``: the shared-prefix kernel of ``decode_attention`` with a ``CascadeGroups``;
- ``fused_decode``: ``decode_fused`` (RoPE, KV write, split-K and merge in one launch);
- ``extend``: ``extend_attention`` (prefill/extend chunks, causal, sliding windows).

Softmax runs in base 2 (scores scaled by log2(e)); accumulation in float32.
"""

from .cascade import CascadeGroups, cascade_groups_tensor, cascade_lists, shared_prefix_attention
from .common import LOG2E, DecodeWorkspace
from .decode import decode_attention
from .extend import extend_attention
from .fused_decode import decode_fused, pdl_supported, quant_fits
from .rope import rope_write

__all__ = [
    "LOG2E", "CascadeGroups", "DecodeWorkspace", "cascade_groups_tensor", "cascade_lists", "decode_attention",
    "decode_fused", "extend_attention", "pdl_supported", "quant_fits", "rope_write", "shared_prefix_attention",
]
