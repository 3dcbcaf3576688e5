"""Which way of reading (reading.py) a conversation reads its document with."""

from __future__ import annotations

from kvchat.engine.reading.ways.fast_first import FastFirst
from kvchat.engine.reading.chunked import StreamSettings
from kvchat.engine.reading.ways.streamed import StreamedReading
from kvchat.engine.reading.ways.reading import Reading
from kvchat.engine.reading.ways.whole import WholeReading
from kvchat.engine.settings import AskSettings


def reading_for(settings: AskSettings, stream: StreamSettings, drafted: bool) -> Reading:
    """Streamed for a streaming method; whole otherwise, and then its questions read fast until it
    is read whole, where the settings say so (`drafted`: a draft model does the cheap pass), or
    every question fast for retrieval."""
    if settings.method.streams:
        return StreamedReading(stream)
    if not settings.reads_fast(drafted):
        return WholeReading()
    return FastFirst(WholeReading(), then_whole=settings.reads_whole_later)
