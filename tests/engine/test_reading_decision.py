"""How a document is read, decided in one place (ways/registry.reading_of) for every front end and
`kvchat inspect`: from the settings, the document's length against the model's trained context
(the tiny model's 4,096) and whether a draft does the cheap pass."""

from __future__ import annotations

import pytest

from kvchat.engine import AskSettings
from kvchat.engine.reading.ways.registry import reading_of
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
    (TOO_LONG, AskSettings(method=SnapKV(), auto_stream=False), False, ("snapkv", "full", "whole", False)),  # refused when read
]


@pytest.mark.parametrize(("n_document", "settings", "drafted", "expected"), SITUATIONS)
def test_one_place_decides_how_a_document_is_read(tiny_model, n_document, settings, drafted, expected) -> None:
    read_with, notice, reading = reading_of(tiny_model, n_document, settings, drafted)
    later = reading.later.value if reading.later is not None else None
    assert (read_with.method.name, reading.name, later, notice is not None) == expected
