"""`kvchat serve`: an OpenAI-compatible chat server (installed as kvchat.server)."""
