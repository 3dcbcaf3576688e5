"""The llama adapter: the only code that imports llama_cpp."""

from kvchat.llama._lib import LLAMA_CPP_VERSION, STATE_FORMAT
from kvchat.llama.context import ContextSettings, LlamaContext, StateBytes, max_sequences
from kvchat.llama.cpu import WEIGHT_LAYOUTS, WEIGHTS_ENV, available_cpus, extra_buffer_types, system_info, weight_layout
from kvchat.llama.model import CACHE_TYPES, Detokenizer, LlamaModel, ModelShape, gpu_offload_supported
from kvchat.llama.probe import AttentionProbe
from kvchat.llama.sampler import Sampler, SamplerSettings
from kvchat.llama.state import for_streams as state_for_streams

__all__ = [
    "CACHE_TYPES",
    "LLAMA_CPP_VERSION",
    "WEIGHTS_ENV",
    "WEIGHT_LAYOUTS",
    "AttentionProbe",
    "ContextSettings",
    "Detokenizer",
    "LlamaContext",
    "LlamaModel",
    "ModelShape",
    "STATE_FORMAT",
    "Sampler",
    "SamplerSettings",
    "StateBytes",
    "available_cpus",
    "extra_buffer_types",
    "gpu_offload_supported",
    "max_sequences",
    "state_for_streams",
    "system_info",
    "weight_layout",
]
