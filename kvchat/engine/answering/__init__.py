"""Answers: generating them, and the passages of the document they drew on."""
