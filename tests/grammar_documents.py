"""Grammar documents that nest by reference: the shapes that crashed the grammar library.

Shared by the bounds' unit tests and the hostile-server tests, so both probe the same
documents.
"""

from __future__ import annotations


def ref_chain(n: int) -> dict:
    """``$defs`` d0 -> d1 -> ... -> dn, dn a string: n references followed in a row."""
    defs: dict = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def lark_chain(n: int) -> str:
    """Lark rules r0 -> r1 -> ... -> rn, rn a literal."""
    return "\n".join(["start: r0", *(f"r{i}: r{i + 1}" for i in range(n)), f'r{n}: "x"'])


def gbnf_chain(n: int) -> str:
    """The same chain in GBNF."""
    return "\n".join(["root ::= r0", *(f"r{i} ::= r{i + 1}" for i in range(n)), f'r{n} ::= "x"'])
