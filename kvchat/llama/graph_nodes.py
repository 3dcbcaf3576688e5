"""Watching graph nodes through llama.cpp's eval callback, shared by both attention probes."""

from __future__ import annotations

from kvchat.llama._lib import ggml_base, raw


class NodeWatcher:
    """While active, asks the scheduler for the nodes named `<node_prefix><layer>` and passes each
    computed one to `_collect(tensor, layer)`. An error inside the callback is kept (it must
    never raise into C) and raised by `_raise_kept()` after the decode."""

    node_prefix = b""

    def __init__(self) -> None:
        self._lib = ggml_base()
        self._active = False
        self._error: Exception | None = None
        # Referenced for the probe's lifetime: llama.cpp calls it on every graph node.
        self.callback = raw.ggml_backend_sched_eval_callback(self._on_node)

    def _collect(self, tensor: int, layer: int) -> None:
        raise NotImplementedError

    def _on_node(self, tensor: int, ask: bool, _user_data: object) -> bool:
        if not self._active:
            return False
        try:
            name = self._lib.ggml_get_name(tensor)
            layer = name[len(self.node_prefix) :] if name and name.startswith(self.node_prefix) else b""
            if not layer.isdigit():
                return False  # other nodes, and views of ours ("Qcur-3 (view)")
            if not ask:
                self._collect(tensor, int(layer))
        except Exception as error:
            self._error = error
            self._active = False
        return True

    def _raise_kept(self) -> None:
        self._active = False
        if self._error is not None:
            error, self._error = self._error, None
            raise error
