"""What kvchat will do with a document, told before reading it: its size in the model's tokens,
whether it fits the model's context (and so how it is read), and how long the reading will take
at this machine's last measured speed (`kvchat inspect`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvchat.documents import Document
from kvchat.engine.prompt_text import document_prompt, prompt_text
from kvchat.engine.settings import AskSettings
from kvchat.events import LaterReading
from kvchat.engine.reading.cheap_pass import fast_is_sooner, fast_reading_s, question_reads_fast
from kvchat.engine.reading.sizing import reads_whole
from kvchat.engine.reading.speeds import PASSAGES_SPEED, ReadingSpeeds
from kvchat.engine.reading.ways.registry import reading_of
from kvchat.llama import LlamaModel


@dataclass(frozen=True)
class ReadingPlan:
    path: str
    format: str
    pages: int
    chars: int
    tokens: int  # the document's part of the prompt: the system prompt and the document
    fits_context: bool
    method: str  # what the reading will use: the settings' method, or snapstream past the context
    # a whole (or streamed) reading: tokens at the last measured speed; None before any was measured, or
    # where the document is read fast only (past the context)
    est_read_s: float | None
    # the questions read fast (fast_reading.py) while the whole reading follows in the background
    reads_fast: bool = False
    est_fast_s: float | None = None  # that fast reading, at the last measured speed of one
    # what the document is read as after the first fast answers (AskSettings.later_reading): "passages",
    # "whole", or None where every question reads fast (retrieval)
    later_reading: str | None = "whole"
    est_later_s: float | None = None  # that reading, at the last measured speed of one

    def reads_fast_before_the_rest(self, read: int) -> bool:
        """Whether a question about the document reads fast rather than awaiting the rest of its
        whole reading under way, `read` of its tokens read (cheap_pass.fast_is_sooner): always
        where every question reads fast."""
        left_s = None if self.est_read_s is None else self.est_read_s * (1 - read / max(self.tokens, 1))
        return self.reads_fast and (self.later_reading != LaterReading.WHOLE or fast_is_sooner(self.est_fast_s, left_s))

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def reading_plan(
    model: LlamaModel, document: Document, settings: AskSettings, speeds: ReadingSpeeds | None, with_draft: bool
) -> ReadingPlan:
    """`with_draft`: a draft model does fast readings' cheap pass (AskSettings.reads_fast)."""
    tokens = len(document_prompt(model, document, prompt_text(document), settings.system)[1])
    read_with, _, reading = reading_of(model, tokens, settings, with_draft)
    speed = speeds.tokens_per_s("stream" if read_with.method.streams else "read") if speeds else None
    whole = reads_whole(model, tokens)
    reads_fast = question_reads_fast(tokens, read_with, with_draft, whole)
    fast_s = fast_reading_s(tokens, read_with, speeds) if reads_fast else None
    est_read_s = round(tokens / speed, 1) if speed and (whole or read_with.method.streams) else None
    later = reading.later if reads_fast else LaterReading.WHOLE
    bank_speed = speeds.measured(PASSAGES_SPEED) if speeds else None
    est_later_s = est_read_s if later is LaterReading.WHOLE else round(tokens / bank_speed, 1) if later and bank_speed else None
    return ReadingPlan(
        path=str(document.path),
        format=document.kind,
        pages=len(document.pages) or 1,
        chars=len(document.text),
        tokens=tokens,
        fits_context=tokens <= model.shape.n_ctx_train,
        method=read_with.method.name,
        est_read_s=est_read_s,
        reads_fast=reads_fast,
        est_fast_s=round(fast_s, 1) if fast_s is not None else None,
        later_reading=later.value if later is not None else None,
        est_later_s=est_later_s,
    )
