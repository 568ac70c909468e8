"""Foreign formats in and out: ONNX test-data folders, Polygraphy JSON, a user's ONNX file as a source.
Imports platform only.
"""
