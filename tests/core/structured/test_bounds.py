"""Grammar documents are measured before llguidance sees them (``structured/bounds.py``).

The crash inputs of issue 40 run in a subprocess: before the bounds they killed the
interpreter with SIGSEGV (the library's recursion past the C stack), which would take the
test session down with them; here a crash fails one test. The deepest documents the
bounds accept are compiled too, on the main thread's ordinary stack: a bound that let a
crashing document through fails there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from draftwise.structured import StructuredOutputsParams
from draftwise.structured.bounds import (
    MAX_CHOICES,
    MAX_REFERENCE_DEPTH,
    MAX_REPEAT,
    GrammarBoundError,
    check_json_schema,
    check_lark,
    check_regex,
)
from grammar_documents import gbnf_chain, lark_chain, ref_chain
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError


def nested_properties(n: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def run_isolated(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


CRASHERS = {
    "json $defs chain 3000": f"StructuredOutputsParams(json={ref_chain(3000)!r})",
    "lark rule chain 3000": f"StructuredOutputsParams(grammar={lark_chain(3000)!r})",
    "gbnf rule chain 3000": f"StructuredOutputsParams(grammar={gbnf_chain(3000)!r})",
}


@pytest.mark.parametrize("name", list(CRASHERS))
def test_crash_inputs_are_refused_not_fatal(name: str) -> None:
    done = run_isolated(f"""
        from draftwise.structured import StructuredOutputsParams
        from pydantic import ValidationError
        try:
            {CRASHERS[name]}
        except ValidationError as exc:
            print("refused:", exc.errors()[0]["msg"])
        else:
            print("accepted")
    """)
    assert done.returncode == 0, f"{name}: exit {done.returncode} {done.stderr[-500:]}"
    assert "refused:" in done.stdout and "levels deep" in done.stdout, done.stdout


def test_deepest_accepted_documents_compile_on_an_ordinary_stack() -> None:
    """Just under the limit, each kind still reaches the library, which takes it."""
    n = MAX_REFERENCE_DEPTH - 8
    done = run_isolated(f"""
        import json
        from draftwise.structured import StructuredOutputsParams
        StructuredOutputsParams(json=json.loads({json.dumps(json.dumps(ref_chain(n)))}))
        StructuredOutputsParams(grammar={lark_chain(n)!r})
        StructuredOutputsParams(grammar={gbnf_chain(n)!r})
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-800:]


def test_reference_depth_counts_chains_and_nesting() -> None:
    check_json_schema(ref_chain(MAX_REFERENCE_DEPTH // 2 - 4))
    with pytest.raises(GrammarBoundError, match="levels deep"):
        check_json_schema(ref_chain(MAX_REFERENCE_DEPTH))
    # nesting through "properties" counts too: two JSON levels a schema level
    check_json_schema(nested_properties(MAX_REFERENCE_DEPTH // 2 - 2))
    with pytest.raises(GrammarBoundError):
        check_json_schema(nested_properties(MAX_REFERENCE_DEPTH))


def test_recursive_schemas_and_grammars_are_not_chains() -> None:
    """A schema or grammar that refers to itself is legitimate: measured once round."""
    tree = {"$ref": "#/$defs/node", "$defs": {"node": {
        "type": "object", "properties": {"kids": {"type": "array",
                                                  "items": {"$ref": "#/$defs/node"}}}}}}
    check_json_schema(tree)
    check_json_schema({"$ref": "#", "type": "object"})
    check_lark('start: expr\nexpr: "(" expr ")" | "x"\n')
    # a cycle of many rules is a chain all the same
    cycle = "\n".join(["start: r0", *(f"r{i}: r{i + 1} | \"x\"" for i in range(400)),
                       'r400: r0 | "y"'])
    with pytest.raises(GrammarBoundError):
        check_lark(cycle)


def test_lark_parentheses_strings_and_embedded_json() -> None:
    deep_parens = "start: " + "(" * (MAX_REFERENCE_DEPTH + 5) + '"x"' + ")" * (
        MAX_REFERENCE_DEPTH + 5)
    with pytest.raises(GrammarBoundError):
        check_lark(deep_parens)
    # brackets and names inside strings and regexes are not structure
    check_lark('start: "((((((((" /[(]{2}r1/ "r1"\nr1: "y"\n')
    embedded = f"start: data\ndata: %json {json.dumps(ref_chain(MAX_REFERENCE_DEPTH))}\n"
    with pytest.raises(GrammarBoundError, match="schema nests"):
        check_lark(embedded)


@pytest.mark.parametrize("pattern", ["a{1000000}", "a{2,1000000}", "(ab){10001}",
                                     "x{99999999999999999999}"])
def test_regex_repetition_counts_are_bounded(pattern: str) -> None:
    with pytest.raises(GrammarBoundError, match="repetition"):
        check_regex(pattern)


def test_regex_counts_under_the_limit_and_literal_braces_pass() -> None:
    check_regex(f"a{{{MAX_REPEAT}}}")
    check_regex(r"\{1000000\}")
    check_regex("[0-9]{1,3}")


def test_params_refuse_by_field_with_the_limit() -> None:
    with pytest.raises(ValidationError, match=f"between 1 and {MAX_CHOICES}"):
        StructuredOutputsParams(choice=[f"c{i}" for i in range(MAX_CHOICES + 1)])
    with pytest.raises(ValidationError, match="regex: the repetition"):
        StructuredOutputsParams(regex="a{1000000}")
    assert StructuredOutputsParams(choice=[f"c{i}" for i in range(MAX_CHOICES)]).kind == "choice"


@settings(max_examples=60, deadline=None)
@given(st.recursive(
    st.sampled_from([{"type": "string"}, {"type": "integer"}, True]),
    lambda inner: st.one_of(
        st.builds(lambda s: {"type": "array", "items": s}, inner),
        st.builds(lambda s: {"anyOf": [s, {"type": "null"}]}, inner),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, min_size=1, max_size=3)
        .map(lambda p: {"type": "object", "properties": p}),
    ), max_leaves=40))
def test_measured_depth_bounds_the_real_nesting(schema: object) -> None:
    """For ref-free schemas the measure is JSON nesting: refused exactly when deeper."""

    def depth(node: object) -> int:
        if isinstance(node, dict):
            return 1 + max((depth(v) for v in node.values()), default=0)
        if isinstance(node, list):
            return 1 + max((depth(v) for v in node), default=0)
        return 0

    if depth(schema) > MAX_REFERENCE_DEPTH:
        with pytest.raises(GrammarBoundError):
            check_json_schema(schema)
    else:
        check_json_schema(schema)
