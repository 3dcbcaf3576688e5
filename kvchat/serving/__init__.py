"""Serving many conversations on one model, on top of the engine: chat requests read and pruned
on a context of their own through the engine's answering route (prepared.py), moved into
sequences of one shared context (slots.py), and answered together by one model thread with
continuous batching (scheduler.py)."""
