"""How a prompt comes into the KV cache: read whole, streamed, put together, or fast first; sized and timed."""
