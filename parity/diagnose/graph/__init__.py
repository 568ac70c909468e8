"""The ONNX graph work of a diagnosis: the graph read and run at any tensor (onnx_graph), taps found in an exported
graph (onnx_taps) and put in the golden's axis order (axis_order, mapping_check), read without disturbing the run
(instrument), a node's third opinion and cause (onnx_ops, node_causes), the reduction of a failing graph (reduce)
and ONNX Runtime's optimiser's view (optimiser).

May import ``parity.diagnose.causes``.
"""
