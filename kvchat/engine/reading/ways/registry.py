"""Which way of reading (reading.py) a conversation reads its document with."""

from __future__ import annotations

from kvchat.engine.reading.ways.fast_first import FastFirst
from kvchat.engine.reading.ways.streamed import StreamedReading
from kvchat.engine.reading.ways.reading import Reading
from kvchat.engine.reading.ways.whole import WholeReading
from kvchat.engine.reading.sizing import reading_settings, reads_whole
from kvchat.engine.settings import AskSettings
from kvchat.events import LaterReading
from kvchat.llama import LlamaModel


def reading_for(settings: AskSettings, drafted: bool, whole: bool = True) -> Reading:
    """Streamed for a streaming method; whole otherwise; or its questions read fast first, where the
    settings say so (`drafted`: a draft model does the cheap pass), the document read afterwards as
    settings.later_reading says (its passages, whole, or nothing for retrieval). `whole` False: the
    document cannot be read whole (sizing.reads_whole): its passages are read instead."""
    if settings.method.streams:
        return StreamedReading()
    if not settings.reads_fast(drafted):
        return WholeReading()
    later = settings.later_reading
    return FastFirst(WholeReading(), then=LaterReading.PASSAGES if later is not None and not whole else later)


def reading_of(
    model: LlamaModel, n_document: int, settings: AskSettings, drafted: bool,
) -> tuple[AskSettings, str | None, Reading]:
    """How a document of `n_document` tokens is read with `settings`: the settings it is read
    with, the notice when they are not those asked for (sizing.reading_settings: one too long to
    read whole), and the way of reading (reading_for())."""
    read_with, notice = reading_settings(model, n_document, settings, drafted)
    return read_with, notice, reading_for(read_with, drafted, reads_whole(model, n_document))
