"""The model as data: ModelSpec and its parts, workspaces, user-model loading and inspection, canonical layouts, the
digits data, the golden manifest format. Imports platform and interop.
"""
