"""A PyTorch reference implementation of AsyncTForCausalLM (docs/DESIGN.md §5), HuggingFace-style, that
loads the same checkpoint directories as asynct. Written for clarity: no KV cache, every call
recomputes the whole sequence. For users who want to check asynct's outputs, and for tests."""
from .modeling_asynct import AsyncTForCausalLM, async_attention, load_asynct

__all__ = ["AsyncTForCausalLM", "async_attention", "load_asynct"]
