"""The verdicts: error statistics and closeness, the one metrics module, the training-step check.
NumPy only; imports platform and model.
"""
