"""Watching graph nodes through llama.cpp's eval callback, shared by both attention probes."""

from __future__ import annotations

from kvchat.llama._lib import ggml_base, raw


class NodeWatcher:
    """While active, asks the scheduler for the nodes named `<node_prefix><layer>` and passes each
    computed one to `_collect(tensor, layer)`. An error inside the callback is kept (it must
    never raise into C) and raised by `_raise_kept()` after the decode.

    cut_after(layer) makes every decode stop after that layer (the cheap pass of a fast reading):
    the scheduler is asked for the layer's output node (`l_out-<layer>`), and told not to go on
    once it is computed, which ends the graph's computation there (ggml_backend_sched_compute_splits
    stops the split; llama_decode still succeeds). The layers above are not computed: their cells
    hold nothing usable, and the logits neither.
    """

    node_prefix = b""
    n_layer: int  # the model's layers (set by each probe)

    def __init__(self) -> None:
        self._lib = ggml_base()
        self._active = False
        self._error: Exception | None = None
        self.last_layer: int | None = None  # decodes stop after this layer (None: they run whole)
        self._cut_node = b""
        # Referenced for the probe's lifetime: llama.cpp calls it on every graph node.
        self.callback = raw.ggml_backend_sched_eval_callback(self._on_node)

    def _collect(self, tensor: int, layer: int) -> None:
        raise NotImplementedError

    def cut_after(self, layer: int | None) -> None:
        """Stop every decode after `layer` (0-based), or run them whole again (None)."""
        self.last_layer = layer
        self._cut_node = b"" if layer is None else b"l_out-%d" % layer

    @property
    def layer_count(self) -> int:
        """The layers a decode computes."""
        return self.n_layer if self.last_layer is None else self.last_layer + 1

    def _on_node(self, tensor: int, ask: bool, _user_data: object) -> bool:
        if not self._active and self.last_layer is None:
            return False
        try:
            name = self._lib.ggml_get_name(tensor)
            if name == self._cut_node:
                return ask  # computed up to this node (asked for), then no further (told to stop)
            if not self._active:
                return False
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
