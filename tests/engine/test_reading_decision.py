"""How a document is read, decided in one place (ways/registry.reading_of) for every front end and
`kvchat inspect`: from the settings, the document's length against the model's trained context
(the tiny model's 4,096), whether a draft does the cheap pass and whether the model runs on a GPU."""

from __future__ import annotations

import pytest

from kvchat.engine import AskSettings
from kvchat.engine.reading.ways.registry import reading_of
from kvchat.llama import LlamaModel, gpu_offload_supported
from kvchat.policy import Full, SnapKV, SnapStream

FITS, TOO_LONG = 3000, 6000
# (document tokens, settings, drafted) -> (method read with, way of reading, what is read after the first answer, notice?)
SITUATIONS = [
    (FITS, AskSettings(), True, ("snapkv", "fast", "passages", False)),
    (FITS, AskSettings(), False, ("snapkv", "full", "whole", False)),
    (FITS, AskSettings(read="fast"), True, ("snapkv", "fast", "whole", False)),
    (FITS, AskSettings(read="fast"), False, ("snapkv", "fast", "whole", False)),
    (FITS, AskSettings(read="retrieval"), False, ("snapkv", "fast", None, False)),
    (FITS, AskSettings(read="full"), True, ("snapkv", "full", "whole", False)),
    (FITS, AskSettings(method=Full(), read="full"), True, ("full", "full", "whole", False)),
    (FITS, AskSettings(method=SnapStream(), read="full"), True, ("snapstream", "streamed", "whole", False)),
    (TOO_LONG, AskSettings(), True, ("snapkv", "fast", "passages", True)),
    (TOO_LONG, AskSettings(read="fast"), True, ("snapkv", "fast", "passages", True)),
    (TOO_LONG, AskSettings(read="retrieval"), False, ("snapkv", "fast", None, True)),
    (TOO_LONG, AskSettings(), False, ("snapstream", "streamed", "whole", True)),
    (TOO_LONG, AskSettings(read="full"), True, ("snapstream", "streamed", "whole", True)),
    (TOO_LONG, AskSettings(method=SnapKV(), method_named=True), False, ("snapkv", "full", "whole", False)),  # refused when read
]


@pytest.mark.parametrize(("n_document", "settings", "drafted", "expected"), SITUATIONS)
def test_one_place_decides_how_a_document_is_read(tiny_model, monkeypatch, n_document, settings, drafted, expected) -> None:
    monkeypatch.setattr(LlamaModel, "on_gpu", False)  # on the CPU, also where the tests run on a GPU
    read_with, notice, reading = reading_of(tiny_model, n_document, settings, drafted)
    later = reading.later.value if reading.later is not None else None
    assert (read_with.method.name, reading.name, later, notice is not None) == expected


# On a GPU, kvchat's own choice (read auto, no method named) of a document that fits is its whole
# cache; a choice the user made, a server's bounded sequence or a document past the context is read
# as on the CPU.
ON_GPU = [
    (FITS, AskSettings(), True, ("full", "full", "whole", False)),
    (FITS, AskSettings(), False, ("full", "full", "whole", False)),
    (FITS, AskSettings(read="fast"), True, ("snapkv", "fast", "whole", False)),
    (FITS, AskSettings(read="retrieval"), False, ("snapkv", "fast", None, False)),
    (FITS, AskSettings(read="full"), True, ("snapkv", "full", "whole", False)),
    (FITS, AskSettings(method_named=True), True, ("snapkv", "fast", "passages", False)),
    (FITS, AskSettings(kept_cells=1024 + 64 + 512), True, ("snapkv", "fast", "passages", False)),
    (TOO_LONG, AskSettings(), True, ("snapkv", "fast", "passages", True)),
    (TOO_LONG, AskSettings(), False, ("snapstream", "streamed", "whole", True)),
]


@pytest.mark.parametrize(("n_document", "settings", "drafted", "expected"), ON_GPU)
def test_on_a_gpu_kvchat_answers_a_document_that_fits_from_its_whole_cache(
    tiny_model, monkeypatch, n_document, settings, drafted, expected,
) -> None:
    monkeypatch.setattr(LlamaModel, "on_gpu", True)
    read_with, notice, reading = reading_of(tiny_model, n_document, settings, drafted)
    later = reading.later.value if reading.later is not None else None
    assert (read_with.method.name, reading.name, later, notice is not None) == expected


def test_a_model_is_on_a_gpu_when_a_gpu_build_holds_every_layer(tiny_model_path) -> None:
    with LlamaModel(tiny_model_path, gpu_layers=2**31 - 1) as every_layer:
        assert every_layer.on_gpu is gpu_offload_supported()  # False on a CPU build, which ignores gpu_layers
        n_layer = every_layer.shape.n_layer
    with LlamaModel(tiny_model_path, gpu_layers=n_layer - 1) as all_but_one:
        assert all_but_one.on_gpu is False
