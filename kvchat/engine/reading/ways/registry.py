"""Which way of reading (reading.py) a conversation reads its document with."""

from __future__ import annotations

from kvchat.engine.reading.ways.fast_first import FastFirst
from kvchat.engine.reading.chunked import StreamSettings
from kvchat.engine.reading.ways.streamed import StreamedReading
from kvchat.engine.reading.ways.reading import Reading
from kvchat.engine.reading.ways.whole import WholeReading
from kvchat.engine.settings import AskSettings


def reading_for(settings: AskSettings, stream: StreamSettings, drafted: bool) -> Reading:
    """Streamed for a streaming method; whole otherwise; or its questions read fast first, where the
    settings say so (`drafted`: a draft model does the cheap pass), the document read afterwards as
    settings.later_reading says (its passages, whole, or nothing for retrieval)."""
    if settings.method.streams:
        return StreamedReading(stream)
    if not settings.reads_fast(drafted):
        return WholeReading()
    return FastFirst(WholeReading(), then=settings.later_reading)
