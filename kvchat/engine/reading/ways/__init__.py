"""The ways of reading: small frozen objects that read a conversation's document whole into a
PromptRun (which then holds it as its restore point). whole.py reads it (or loads its saved
reading), streamed.py reads it within the budget (reading/chunked.py), fast_first.py leaves it to
the questions, which read fast (reading/fast_reading.py) until it is read whole for those after.
registry.py chooses.

Adding a way: a class with `read()` (and `defers()` if the first question reads instead), and its
line in reading_for().
"""

from kvchat.engine.reading.ways.fast_first import FastFirst
from kvchat.engine.reading.ways.reading import DocumentPrompt, Reading
from kvchat.engine.reading.ways.registry import reading_for
from kvchat.engine.reading.ways.streamed import StreamedReading
from kvchat.engine.reading.ways.whole import WholeReading

__all__ = ["DocumentPrompt", "FastFirst", "Reading", "StreamedReading", "WholeReading", "reading_for"]
