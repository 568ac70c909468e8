"""Text bound for a terminal, made safe to show: names and messages from a model file (an ONNX tensor name, a
converter's message) may hold control characters (ESC starts a terminal command), and a file name that is no UTF-8
holds lone surrogates that no terminal encoding can write."""

from __future__ import annotations

KEPT = frozenset("\n\t")  # the layout's own line breaks and tabs


def visible(text: str) -> str:
    """``text`` with every character a terminal would act on or cannot show (C0 and C1 controls, DEL, format
    characters such as a right-to-left override, lone surrogates) written as its Python escape (``\\x1b``,
    ``\\u202e``, ``\\udcff``), line breaks and tabs kept; printable text, emoji and CJK included, as it is."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or char in KEPT else escaped(char) for char in text)


def escaped(char: str) -> str:
    """``char`` as Python's escape writes it: ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``."""
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
