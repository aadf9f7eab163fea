"""Test runner copied into the sandbox next to the candidate (as ``/work/_harness/runner.py``); stdlib only.

It is *not* trusted: the candidate shares its process. It only frames one result line, prefixed with a
per-run nonce, on a duplicate of fd 1 taken before the candidate loads (the candidate's own prints go to
stderr). ``spec.json`` -- nonce, inputs, assert code -- is read and deleted before the candidate is
imported, so the candidate cannot read the nonce or the asserts from disk.

Kinds (``spec["kind"]``):

* ``exprs``: assert tests of the form ``assert <expr> == <literal>`` (all of a record's asserts, or all of a
  ``check`` function's body), rewritten by the parent: only the left-hand expressions come here; they are
  evaluated in order (after ``from module import *``, ``candidate`` bound to the entry point, and ``setup``)
  and reported as ``{"values": [...]}`` in a typed JSON (tuples, sets, dicts with any keys, bytes kept
  apart), which the parent compares with the literals it kept -- the expected values never enter the sandbox.

* ``call``: call ``module.call(*args, **kwargs)`` and report ``{"value": <JSON>}``; the parent compares it
  with an expected value that never enters the sandbox.
* ``asserts`` (MBPP style): ``from module import *``, run ``setup``, then each assert statement; report
  ``{"ran": n}`` after the n-th. ``check`` (HumanEval style): define ``check`` from the test code and call
  ``check(module.entry_point)``; report ``{"ran": 1}`` when it returns. The parent passes the test only if
  the process exits 0 *and* exactly one framed ``ran`` equal to the number of asserts arrived, so
  ``sys.exit(0)``/``os._exit(0)`` in the solution, an exception, or a crash all fail.

Every comparison in assert code is rewritten to ``_lit_rl_cmp``, which refuses operands that are not plain
builtin values (exact ``int``/``str``/``list``/...): an "AlwaysEqual" object, or an ``int`` subclass with its
own ``__eq__``, fails the assert instead of passing it. Known gap (kinds ``asserts``/``check`` only; ``exprs``
and ``call`` do not have it): the assert code lives in this process, so
a candidate that inspects the harness's frames (the calling assert's constants, the nonce in ``main``'s
locals; ``test_known_gap_...`` pins it) can pass or forge assert tests. Call and stdin/stdout tests, judged
in the parent against values that never enter the sandbox, do not have that weakness: prefer them for
adversarial training.
"""

import ast
import json
import operator
import os
import sys

_PLAIN = (int, float, complex, str, bytes, bool, type(None))
_OPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_BY_NAME = {k.__name__: f for k, f in _OPS.items()}


def _plain(v, depth=0) -> bool:
    if depth > 50:
        return False
    t = type(v)
    if t in _PLAIN:
        return True
    if t in (list, tuple, set, frozenset):
        return all(_plain(x, depth + 1) for x in v)
    if t is dict:
        return all(_plain(k, depth + 1) and _plain(x, depth + 1) for k, x in v.items())
    return False


def _lit_rl_cmp(left, op, right):
    if not (_plain(left) and _plain(right)):
        raise AssertionError(
            f"comparison of a non-builtin value ({type(left).__name__} vs {type(right).__name__})"
        )
    return _BY_NAME[op](left, right)


def _lit_rl_truth(v):
    if not _plain(v):
        raise AssertionError(f"truth value of a non-builtin value ({type(v).__name__})")
    return bool(v)


class _Rewrite(ast.NodeTransformer):
    """``a == b < c`` -> ``_lit_rl_cmp(a, Eq, b) and _lit_rl_cmp(b, Lt, c)``; ``assert x`` -> truth-checked."""

    def visit_Compare(self, node):
        self.generic_visit(node)
        parts, left = [], node.left
        for op, right in zip(node.ops, node.comparators):  # (a chained middle operand is evaluated twice)
            parts.append(
                ast.Call(
                    ast.Name("_lit_rl_cmp", ast.Load()), [left, ast.Constant(type(op).__name__), right], []
                )
            )
            left = right
        return parts[0] if len(parts) == 1 else ast.BoolOp(ast.And(), parts)

    def visit_Assert(self, node):
        self.generic_visit(node)
        if not (isinstance(node.test, ast.Call) and getattr(node.test.func, "id", "") == "_lit_rl_cmp"):
            node.test = ast.Call(ast.Name("_lit_rl_truth", ast.Load()), [node.test], [])
        return node


def _compile(src, name):
    tree = ast.fix_missing_locations(_Rewrite().visit(ast.parse(src, name)))
    return compile(tree, name, "exec")


def _enc(v, depth=0):
    """Typed JSON for builtin values; anything else (user classes, subclasses) is refused."""
    t = type(v)
    if depth > 50:
        raise TypeError("value nested too deeply")
    if t in (int, float, str, bool, type(None)):
        return v
    if t is list:
        return [_enc(x, depth + 1) for x in v]
    if t is tuple:
        return {"__tuple__": [_enc(x, depth + 1) for x in v]}
    if t in (set, frozenset):
        return {"__set__": [_enc(x, depth + 1) for x in v], "frozen": t is frozenset}
    if t is dict:
        return {"__dict__": [[_enc(k, depth + 1), _enc(x, depth + 1)] for k, x in v.items()]}
    if t is bytes:
        return {"__bytes__": v.hex()}
    if t is complex:
        return {"__complex__": [v.real, v.imag]}
    raise TypeError(f"result of type {t.__name__} is not a plain builtin value")


def main():
    out = os.dup(1)
    os.dup2(2, 1)
    with open("/work/_harness/spec.json") as f:
        spec = json.load(f)
    os.unlink("/work/_harness/spec.json")
    nonce, dumps, write = spec.pop("nonce"), json.dumps, os.write  # bound before the candidate can patch them
    sys.path.insert(0, "/work")
    try:
        import importlib

        if spec["kind"] == "call":
            fn = getattr(importlib.import_module(spec["module"]), spec["call"])
            payload = dumps({"value": fn(*spec["args"], **spec["kwargs"])}, allow_nan=False)
        elif spec["kind"] == "exprs":
            ns = {"__name__": "__lit_rl_test__"}
            exec(compile(f"from {spec['module']} import *", "<import>", "exec"), ns)  # noqa: S102
            if spec.get("entry_point"):
                ns["candidate"] = getattr(importlib.import_module(spec["module"]), spec["entry_point"])
            exec(compile(spec["setup"], "<setup>", "exec"), ns)  # noqa: S102
            values = [_enc(eval(compile(e, f"<expr {i}>", "eval"), ns)) for i, e in enumerate(spec["exprs"])]
            payload = dumps({"values": values}, allow_nan=False)
        else:
            ns = {"__name__": "__lit_rl_test__", "_lit_rl_truth": _lit_rl_truth, "_lit_rl_cmp": _lit_rl_cmp}
            ran = 0
            if spec["kind"] == "asserts":
                codes = [_compile(spec["setup"], "<setup>")] + [
                    _compile(a, f"<assert {i}>") for i, a in enumerate(spec["asserts"])
                ]
                exec(compile(f"from {spec['module']} import *", "<import>", "exec"), ns)  # noqa: S102
                exec(codes[0], ns)  # noqa: S102 - running the tests is the point
                for code in codes[1:]:
                    exec(code, ns)  # noqa: S102
                    ran += 1
            else:
                exec(_compile(spec["check"], "<check>"), ns)  # noqa: S102
                ns["check"](getattr(importlib.import_module(spec["module"]), spec["entry_point"]))
                ran = 1
            payload = '{"ran": ' + str(int(ran)) + "}"
    except BaseException as e:  # noqa: BLE001 - SystemExit from the solution is a failure like any other
        try:
            payload = dumps({"error": (type(e).__name__ + ": " + str(e))[:300]})
        except BaseException:  # noqa: BLE001
            payload = '{"error": "unprintable exception"}'
    write(out, (nonce + payload + "\n").encode())


if __name__ == "__main__":
    main()
