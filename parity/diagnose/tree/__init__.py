"""The descent into a model's own tree, in the worker that holds both sides: the worker task (descent), the walk
level by level (walk), and one reader per framework and runtime: the reference side of a source framework
(torch_tree; keras_tree; jax_tree, with nnx_tree and jax_calls for Flax; onnx_tree on a user's ONNX file) and the
path side of an export (graph_tree: an exported ONNX graph; litert_tree: a ``.tflite`` file; jax_tf_tree: a jax2tf
SavedModel).

``READERS`` holds the reader of each source framework, imported here: a reader imports no framework at module level.
May import ``parity.diagnose.causes`` and ``parity.diagnose.graph``.
"""

from parity.diagnose.tree import jax_tree, keras_tree, onnx_tree, torch_tree

# the module that reads each source framework's tree: ``Levels(runner, x)`` or ``level_of(runner, x, scope, names)``
READERS = {"torch": torch_tree, "jax": jax_tree, "tf": keras_tree, "onnx": onnx_tree}
SOURCES = tuple(READERS)
