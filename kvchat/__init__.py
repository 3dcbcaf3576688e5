"""kvchat: chat with long documents on your own machine, with a KV cache that stays small."""

import logging

logging.getLogger("kvchat").addHandler(logging.NullHandler())

__version__ = "0.1.0"
