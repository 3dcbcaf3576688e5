"""The document's text as the model reads it: its passages (BM25 over them: passages.py), the text
and pages a selection kept (document_text.py), and the passages an answer drew on (sources.py).
Below the reading (reading/) and the answering (answering/), which both use it."""
