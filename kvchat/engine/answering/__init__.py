"""Answers: the one route from a question to its answer (route.py), in parts or from kept entries, their
generation, and the passages of the document they drew on."""
