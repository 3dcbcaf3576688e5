"""`kvchat chat`: a Textual app for talking with a document (installed as kvchat.tui)."""
