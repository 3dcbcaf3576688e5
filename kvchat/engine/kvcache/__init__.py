"""The KV cache of one context with its cells' bookkeeping and pruning, and its readings saved on disk."""
