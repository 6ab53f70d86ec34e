"""`neutralise`: the control characters of untrusted text made visible (see
`cli/terminal.py`, which prints every rich segment through it). Free of rich, so a command
that prints plain lines (`epiflow protocol parse`) does not import it.
"""

from __future__ import annotations

_KEPT = {ord("\n"), ord("\t")}

_TABLE: dict[int, str] = {
    **{code: chr(0x2400 + code) for code in range(0x20) if code not in _KEPT},
    0x7F: "\u2421",
    **{code: "\ufffd" for code in range(0x80, 0xA0)},
}


def neutralise(text: str) -> str:
    """`text` with every control character except newline and tab made visible, in one
    linear pass and without changing its length."""
    return text.translate(_TABLE)
