"""Tests of the canonical encoding and the fingerprint built on it.

The golden vectors pin encoding version 1: if one of them changes, every
fingerprint in flight changes, which needs a FINGERPRINT_VERSION bump.
"""

from __future__ import annotations

import enum
import inspect
import json
import math
import random
from collections import OrderedDict, namedtuple
from collections.abc import Callable
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_grousset.exceptions import FingerprintError
from celery_grousset.fingerprint import (
    FINGERPRINT_VERSION,
    bind_arguments,
    canonical_bytes,
    fingerprint,
    validate_key_names,
)


def charge(order_id: int, amount: int, currency: str = "EUR") -> None:
    """A task body used for its signature."""


def process(order: object, note: object = None) -> None:
    """A task body whose arguments the error tests fill with bad values."""


CHARGE, PROCESS = inspect.signature(charge), inspect.signature(process)
UTC, PLUS_2 = timezone.utc, timezone(timedelta(hours=2))
DT = datetime(2024, 2, 29, 23, 59, 58, 123456)


def _i64(value: int) -> bytes:
    return b"i" + value.to_bytes(8, "big", signed=True)


def _len(value: int) -> bytes:
    return value.to_bytes(8, "big")


def _order_key(order_id: int, **_: object) -> str:
    return f"order:{order_id}"


# --- golden vectors ---------------------------------------------------------------

# fmt: off
GOLDEN_INPUTS: dict[str, Callable[[], str]] = {
    "ints": lambda: fingerprint("g.ints", (0, -1, 2**63, -(2**70))),
    "strs": lambda: fingerprint("g.strs", ("", "héllo wörld ✓", "a\x00b")),
    "nested": lambda: fingerprint("g.nested", ({"b": [1, {"c": None, "a": [True]}], "a": 1.5},)),
    "list": lambda: fingerprint("g.sequence", ([1, [2, 3]],)),
    "tuple is list": lambda: fingerprint("g.sequence", ((1, (2, 3)),)),
    "aware datetime": lambda: fingerprint("g.datetime", (DT.replace(tzinfo=UTC),)),
    "same instant": lambda: fingerprint("g.datetime", (DT.replace(tzinfo=UTC).astimezone(PLUS_2),)),
    "naive datetime": lambda: fingerprint("g.datetime", (DT,)),
    "date and time": lambda: fingerprint("g.date_time", (date(1999, 12, 31), time(8, 30, 0, 5))),
    "decimal": lambda: fingerprint("g.decimal", (Decimal("12.50"), Decimal("-0.001"))),
    "uuid": lambda: fingerprint("g.uuid", (UUID("12345678-1234-5678-1234-567812345678"),)),
    "bytes": lambda: fingerprint("g.bytes", (b"\x00\xffabc",)),
    "idempotency key": lambda: fingerprint("g.idem", (1, 2), idempotency_key="order-42/charge"),
    "causality": lambda: fingerprint("g.pay", (42, 1999), signature=CHARGE, causality="m-7f"),
    "signature": lambda: fingerprint("g.pay", (42, 1), {"currency": "USD"}, signature=CHARGE),
    "key names": lambda: fingerprint("g.pay", (42, 1999), signature=CHARGE, key=("order_id",)),
    "key callable": lambda: fingerprint("g.pay", (42, 1999), signature=CHARGE, key=_order_key),
}
# fmt: on
GOLDEN_DIGESTS = {
    "ints": "0c5898eb3ef6cbc361f4ed19368217fde389345c8199853476ec38ae69475d2c",
    "strs": "b23998c14437e95f1770cd459ce51b4da21ef72c3871f01283a84097d03c57fe",
    "nested": "e94cd48db096656ec49efcb2d8734bfc0df934f2d68ad7caba9e1135c48ec34e",
    "list": "1d92b6aca546d36d7c468be47b78d64e16b5b5d0eb0768ec0c01cfa4d813251a",
    "tuple is list": "1d92b6aca546d36d7c468be47b78d64e16b5b5d0eb0768ec0c01cfa4d813251a",
    "aware datetime": "321e4f3a427cb80acc4e75fd5b77ef3a19646c6cf6a83d8d18bb71778147c9ca",
    "same instant": "321e4f3a427cb80acc4e75fd5b77ef3a19646c6cf6a83d8d18bb71778147c9ca",
    "naive datetime": "9924e88e83269fe9c1f2c31e32c26aa34fb15efe8f7eb9f35d400eb293c1af18",
    "date and time": "807e3d987aae141d059241ecbf7f705087ad15629907db02bd971ba79dc7025f",
    "decimal": "af4392e916f5140f55255be87a092787a106b61cbf93b013d95a10a2f2f51484",
    "uuid": "4e297fe0ee33bd37339664dd982ec5fd3b311ea14ef6a7cd1fac1897853cfe90",
    "bytes": "a46c6b81d0caf547730b14ffd6cc648da5c0b7b80c2b7e702a43379cccdb28df",
    "idempotency key": "0967adcf8ce1f2e48ec756078289468ac4eeac0b0527c697705f87b71705e383",
    "causality": "4cf036d1a069a7a36761589b025af967dabfa21f9c68fcb0265f5109e3c04fc8",
    "signature": "da3947abe15c8e5dfd3d2763e81045fc9fa4edd026c039a12624fa9f987ac85f",
    "key names": "5b106424d19abd4f36f20038457e535b446401e8ee2855dd1d2bb3f8b0d9cca2",
    "key callable": "180a90c9a420a819cb41061f507adda5f3f728c361e063a1c11e7e4328e8211f",
}


@pytest.mark.parametrize("case", list(GOLDEN_INPUTS))
def test_golden_vectors_pin_version_1(case: str) -> None:
    # Given the encoding version this suite pins
    assert FINGERPRINT_VERSION == 1
    # When the fingerprint of a pinned case is computed
    digest = GOLDEN_INPUTS[case]()
    # Then it is exactly the recorded BLAKE3-256 hex digest
    assert digest == GOLDEN_DIGESTS[case]


def test_canonical_bytes_of_a_small_value_are_pinned() -> None:
    # Given a small nested value with unsorted keys
    value = {"b": [1, 2.5, None, True], "a": "x"}
    # When it is encoded
    encoded = canonical_bytes(value)
    # Then the bytes follow the documented tagged, length-prefixed format exactly
    assert encoded == bytes.fromhex(
        "6d 0000000000000002"  # m, 2 entries
        " 0000000000000001 61 73 0000000000000001 78"  # "a": s "x"
        " 0000000000000001 62 6c 0000000000000004"  # "b": l, 4 items
        " 69 0000000000000001 66 4004000000000000 4e 54"  # i 1, f 2.5, N, T
    )


# fmt: off
SCALARS = [
    (-1, _i64(-1)), (2**63, b"I" + _len(9) + (2**63).to_bytes(9, "big", signed=True)),
    (-0.0, b"f" + bytes(8)),
    (b"ab", b"b" + _len(2) + b"ab"), (UUID(int=1), b"U" + _len(0) + _len(1)),
    (datetime(1, 1, 1, tzinfo=UTC), b"Z" + bytes(8)), (date(1, 1, 2), b"d" + bytes(3) + b"\x02"),
    (datetime(1, 1, 1, 0, 0, 1), b"z" + (10**6).to_bytes(8, "big")),
    (time(0, 0, 0, 7), b"t" + _len(7)), (time(3, tzinfo=PLUS_2), b"u" + _len(3_600_000_000)),
    (Decimal("12.50"), b"e\x00" + _len(3) + b"\x01\x02\x05" + _i64(-1)),
    (Decimal("-0.00"), b"e\x00" + _len(0) + _i64(0)),
]
# fmt: on


@pytest.mark.parametrize(("value", "expected"), SCALARS)
def test_scalar_encodings_follow_the_documented_format(value: object, expected: bytes) -> None:
    # Given a scalar of each tagged kind
    # When it is encoded
    encoded = canonical_bytes(value)
    # Then the bytes are the ones the module docstring documents
    assert encoded == expected


# --- canonical equalities and distinctions ------------------------------------------


class Colour(enum.IntEnum):
    RED = 1


class Mood(str, enum.Enum):
    HAPPY = "happy"


Point = namedtuple("Point", "x y")
# fmt: off
SAME: list[tuple[object, object]] = [
    ((1, 2), [1, 2]), ({1: "a", 2: "b"}, {"2": "b", "1": "a"}), (-0.0, 0.0),
    (Decimal("1.0"), Decimal("1.00")), (Decimal("100"), Decimal("1E+2")),
    (Decimal("0"), Decimal("-0.000")), (b"abc", bytearray(b"abc")), (b"abc", memoryview(b"abc")),
    (Colour.RED, 1), (Mood.HAPPY, "happy"), (Point(1, 2), [1, 2]),
    (OrderedDict([("b", 1), ("a", 2)]), {"a": 2, "b": 1}),
    (datetime(2024, 1, 1, 12, tzinfo=UTC), datetime(2024, 1, 1, 14, tzinfo=PLUS_2)),
]
DIFFERENT: list[tuple[object, object]] = [
    (True, 1), (False, 0), (1, 1.0), (0, None), (Decimal("1"), 1), (Decimal("1"), 1.0),
    (Decimal("-1"), Decimal("1")), ("1", 1), ("", b""), ([], {}), ([[]], []), ([1, 2], [[1], 2]),
    ("a\ud800b", "ab"),  # lone surrogates are encoded, not rejected
    (datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 1)),
    (date(2024, 1, 1), datetime(2024, 1, 1)),
    (time(1), time(1, tzinfo=UTC)), (UUID(int=1), (1).to_bytes(16, "big")), (2**63 - 1, 2**63),
]
# fmt: on


@pytest.mark.parametrize(
    ("left", "right", "expected_same"),
    [(*pair, True) for pair in SAME] + [(*pair, False) for pair in DIFFERENT],
)
def test_equal_after_json_round_trip_iff_same_encoding(
    left: object, right: object, expected_same: bool
) -> None:
    # Given two values, which JSON either keeps apart (expected_same=False) or not
    # When both are encoded
    same = canonical_bytes(left) == canonical_bytes(right)
    # Then they encode the same exactly when they are one canonical value
    assert same is expected_same


# --- binding --------------------------------------------------------------------------


def test_positional_keyword_and_default_spellings_bind_the_same() -> None:
    # Given a task whose second argument defaults to "EUR"
    def fp(*args: object, **kwargs: object) -> str:
        return fingerprint("shop.refund", args, kwargs, signature=CHARGE)

    # When it is called positionally, by keyword, and relying on the default
    spellings = {
        fp(1, 2, "EUR"),
        fp(1, 2),
        fp(order_id=1, amount=2),
        fp(1, currency="EUR", amount=2),
    }
    # Then all spellings share one fingerprint, and another value does not
    assert len(spellings) == 1
    assert fp(1, 2, "USD") not in spellings


def test_var_arguments_bind_to_list_and_dict_and_no_signature_keeps_both() -> None:
    # Given a signature with *args and **kwargs, and no signature at all
    def run(order_id: int, *lines: object, **options: object) -> None: ...

    signature = inspect.signature(run)
    # When arguments are bound
    bound = bind_arguments(signature, (7, "a", "b"), {"rush": True})
    # Then *args is a list and **kwargs a dict under their names; without a signature
    # the arguments are kept under "args" and "kwargs"
    assert bound == {"order_id": 7, "lines": ["a", "b"], "options": {"rush": True}}
    assert bind_arguments(signature, (7,), {}) == {"order_id": 7, "lines": [], "options": {}}
    assert bind_arguments(None, (1, (2,)), {"k": "v"}) == {"args": [1, (2,)], "kwargs": {"k": "v"}}


SIGNATURES = [
    inspect.signature(lambda a, b=2, *, c, d=4: None),
    inspect.signature(lambda a, /, b, c=3: None),
    inspect.signature(lambda a, *rest, b=1, **extra: None),
    inspect.signature(lambda: None),
]
# fmt: off
CALLS: list[tuple[tuple[object, ...], dict[str, object]]] = [
    ((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, 3), {}), ((1,), {"c": 3}), ((1,), {"b": 5, "c": 3}),
    ((), {"a": 1, "c": 3}), ((1,), {"a": 1}), ((1, 2), {"b": 2}), ((1,), {"zzz": 0}),
]
# fmt: on


@pytest.mark.parametrize("signature", SIGNATURES, ids=str)
@pytest.mark.parametrize(("args", "kwargs"), CALLS, ids=repr)
def test_bind_arguments_agrees_with_inspect(
    signature: inspect.Signature, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    # Given what inspect.Signature.bind makes of a call (None: it refuses it)
    expected: dict[str, object] | None = None
    try:
        reference = signature.bind(*args, **kwargs)
        reference.apply_defaults()
        expected = {
            k: list(v) if isinstance(v, tuple) else v for k, v in reference.arguments.items()
        }
    except TypeError:
        pass
    # When bind_arguments binds the same call
    try:
        actual: dict[str, object] | None = bind_arguments(signature, args, kwargs)
    except FingerprintError:
        actual = None
    # Then both bind identically, or both refuse
    assert actual == expected


def test_binding_failures_name_the_parameters() -> None:
    # Given calls with a missing and with an unexpected argument
    # When they are fingerprinted
    with pytest.raises(FingerprintError) as missing:
        fingerprint("shop.charge", (1,), signature=CHARGE)
    with pytest.raises(FingerprintError, match="unexpected keyword argument 'colour'"):
        fingerprint("shop.charge", (1, 2), {"colour": "red"}, signature=CHARGE)
    # Then the errors (ValueErrors too) name the parameters and the problem
    assert "parameters (order_id, amount, currency): missing" in str(missing.value)
    assert isinstance(missing.value, ValueError)


def test_key_names_select_only_those_arguments() -> None:
    # Given a key naming only order_id
    def fp(*args: object, **kwargs: object) -> str:
        return fingerprint("t", args, kwargs, signature=CHARGE, key=("order_id",))

    # When the other arguments change
    same = {fp(42, 100), fp(42, 999, "USD"), fp(amount=1, order_id=42)}
    # Then the fingerprint only follows order_id; naming every argument equals no key
    assert len(same) == 1 and fp(43, 100) not in same
    everything = ("currency", "amount", "order_id")
    assert fingerprint("t", (1, 2), signature=CHARGE, key=everything) == fingerprint(
        "t", (1, 2), signature=CHARGE
    )


def test_callable_key_is_called_with_bound_arguments() -> None:
    # Given a key function that sees arguments by name, defaults applied
    seen: list[dict[str, object]] = []

    def key(**bound: object) -> object:
        seen.append(bound)
        return [bound["order_id"], bound["currency"]]

    # When two calls agree on what the key returns
    first = fingerprint("t", (42, 1), signature=CHARGE, key=key)
    second = fingerprint("t", (42, 2), signature=CHARGE, key=key)
    # Then they share a fingerprint, which differs from fingerprinting the arguments
    assert seen[0] == {"order_id": 42, "amount": 1, "currency": "EUR"}
    assert first == second != fingerprint("t", (42, 1), signature=CHARGE)


def test_callable_key_errors_are_fingerprint_errors_with_the_key_path() -> None:
    # Given key functions that fail, or return an unencodable value
    # When fingerprints are computed
    with pytest.raises(FingerprintError, match=r"grousset_key\(\) raised KeyError"):
        fingerprint("t", (1, 2), signature=CHARGE, key=lambda **bound: bound["nope"])
    with pytest.raises(FingerprintError) as raised:
        fingerprint("t", (1, 2), signature=CHARGE, key=lambda **bound: {"ids": {1, 2}})
    # Then the path of the bad value starts at grousset_key()
    assert 'grousset_key()["ids"]' in str(raised.value)


def test_a_kwargs_task_is_keyed_as_its_errors_say() -> None:
    """A (**kwargs) task could not be keyed: a tuple naming a keyword argument was refused
    with no way out, and a callable reading it by name raised a bare KeyError (a review)."""
    def notify(**kwargs: Any) -> None: ...

    sig = inspect.signature(notify)
    # Given a tuple key naming a keyword argument / Then it is refused, saying how instead
    with pytest.raises(FingerprintError) as refused:
        validate_key_names(sig, ("order_id",))
    hint = "grousset_key=lambda kwargs, **rest: kwargs['order_id']"
    assert hint in str(refused.value), refused.value
    # Given the callable the docs' first guess writes / Then its error names what it gets
    with pytest.raises(FingerprintError, match=r"by name: kwargs \(a \*args or \*\*kwargs"):
        fingerprint("t", (), {"order_id": 1}, signature=sig, key=lambda **kw: kw["order_id"])
    # When keyed as the hint says / Then calls agree on the order alone
    key = eval(hint.split("=", 1)[1])  # (the hint's own text, run as given)
    one = fingerprint("t", (), {"order_id": 1, "x": 1}, signature=sig, key=key)
    assert one == fingerprint("t", (), {"order_id": 1, "x": 2}, signature=sig, key=key)
    assert one != fingerprint("t", (), {"order_id": 2, "x": 1}, signature=sig, key=key)


def test_a_key_function_error_does_not_quote_the_calls_secrets() -> None:
    """The error of a key function that failed on a secret argument quoted it (and kept
    it in the chained traceback): the caller's logs, Sentry and the result backend."""

    def token_task(ref: str, token: str) -> None: ...

    # Given a key function that fails on the call's token, named and quoted in its error
    # When the fingerprint is computed
    with pytest.raises(FingerprintError) as raised:
        fingerprint("t", ("r-1", "KeyFnSecretJJ"), signature=inspect.signature(token_task),
                    key=lambda ref, token: int(token))  # fmt: skip
    # Then the error names what failed, without the token, and chains no exception
    message = str(raised.value)
    assert "grousset_key() raised ValueError: invalid literal" in message, message
    assert "KeyFnSecretJJ" not in message, message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_key_function_returning_nothing_is_refused_not_one_key_for_every_call() -> None:
    """``def key(order_id, **_): f"order:{order_id}"`` (no ``return``) gave every call one
    fingerprint: order 2's payment was answered with order 1's memo, its body never run."""

    def forgot_return(**bound: object) -> None:
        key = f"order:{bound['order_id']}"  # (and no `return key`)
        assert key

    # Given key functions that return nothing, or an empty value
    for key in (forgot_return, lambda **b: "", lambda **b: [], lambda **b: {}, lambda **b: ()):
        # When a call is fingerprinted / Then it is refused, naming the likely mistake
        refused = r"grousset_key\(\) returned .*share one key.*`return`"
        with pytest.raises(FingerprintError, match=refused):
            fingerprint("t", (1, 2), signature=CHARGE, key=key)
    # A falsy key that identifies something (order 0, False) is still a key
    assert fingerprint("t", (0, 2), signature=CHARGE, key=lambda **b: b["order_id"]) != (
        fingerprint("t", (1, 2), signature=CHARGE, key=lambda **b: b["order_id"])
    )
    assert fingerprint("t", (0, 2), signature=CHARGE, key=lambda **b: False)


def test_key_names_are_validated_up_front_and_on_use() -> None:
    # Given a key naming an argument the task does not have
    # When it is validated up front, or used
    with pytest.raises(FingerprintError) as upfront:
        validate_key_names(CHARGE, ("order", "amount"))
    with pytest.raises(FingerprintError) as used:
        fingerprint("t", (1, 2), signature=CHARGE, key=("order",))
    with pytest.raises(FingerprintError, match="names no argument"):
        validate_key_names(CHARGE, ())
    # Then errors name the bad key and every valid name; valid selections pass
    for error in (upfront.value, used.value):
        assert "'order'" in str(error) and "order_id, amount, currency" in str(error)
    for ok in (("order_id", "currency"), "order_id", lambda **_: 1, None):
        validate_key_names(CHARGE, ok)
    validate_key_names(None, ("args",))


def test_idempotency_key_overrides_arguments() -> None:
    # Given two different calls sharing an idempotency key
    # When both are fingerprinted
    first = fingerprint("t", (1, 2), signature=CHARGE, idempotency_key="abc")
    second = fingerprint("t", (3,), {"x": {1}}, idempotency_key="abc")
    # Then the arguments (even invalid ones) are ignored, but the key and name count
    assert first == second
    assert first != fingerprint("t", (1, 2), signature=CHARGE, idempotency_key="abd")
    assert first != fingerprint("u", (1, 2), signature=CHARGE, idempotency_key="abc")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fingerprint("t", idempotency_key=""), "idempotency_key must be a non-empty str"),
        (lambda: fingerprint("t", idempotency_key=42), "idempotency_key must be"),  # type: ignore[arg-type]
        (lambda: fingerprint(""), "name must be a non-empty str"),
        (lambda: fingerprint("t", causality=7), "causality must be a str"),  # type: ignore[arg-type]
    ],
)
def test_invalid_name_causality_and_idempotency_key(call: Callable[[], str], message: str) -> None:
    # Given an invalid name, causality or idempotency key
    # When fingerprinted
    with pytest.raises(FingerprintError) as raised:
        call()
    # Then the error says which one is wrong
    assert message in str(raised.value)


def test_name_and_causality_are_part_of_the_material() -> None:
    # Given one call
    base = fingerprint("t", (1,))
    # When the name or causality changes
    variants = {fingerprint("u", (1,))} | {
        fingerprint("t", (1,), causality=c) for c in ("c1", "c2", "")
    }
    # Then each gives a different, well-formed fingerprint; None is no causality
    assert base not in variants and len(variants) == 4
    assert all(len(v) == 64 and int(v, 16) >= 0 and v == v.lower() for v in variants)
    assert fingerprint("t", (1,), causality=None) == base


# --- errors ---------------------------------------------------------------------------


class Opaque:
    """An arbitrary object with no canonical form."""


# fmt: off
UNENCODABLE = [
    ({"items": [1, 2, {3}]}, 'order["items"][2]', "has no order; pass a sorted list"),
    ({"tags": frozenset({"a"})}, 'order["tags"]', "frozenset has no order"),
    ([Opaque()], "order[0]", "test_fingerprint.Opaque object has no deterministic"),
    ({"total": math.nan}, 'order["total"]', "float nan is not finite"),
    ([1, math.inf], "order[1]", "float inf is not finite"),
    ({"price": Decimal("NaN")}, 'order["price"]', "Decimal('NaN') is not finite"),
    ({"a": {1: "x", "1": "y"}}, 'order["a"]', "mixed dict key types"),
    ({"a": {"x": 1, 2: "y"}}, 'order["a"]', "mixed dict key types"),
    ({"a": {True: 1}}, 'order["a"]', "mixed dict key types"),
    ({"a": {1.5: 1}}, 'order["a"]', "unsupported dict key: a float key"),
    ({"__type__": "datetime", "__value__": "2024-01-01"}, "order", "ambiguous with kombu"),
]
# fmt: on


@pytest.mark.parametrize(("order", "path", "hint"), UNENCODABLE)
def test_unencodable_values_name_their_path(order: object, path: str, hint: str) -> None:
    # Given an argument holding a value with no canonical encoding
    # When the call is fingerprinted
    with pytest.raises(FingerprintError) as raised:
        fingerprint("shop.process", (order,), signature=PROCESS)
    # Then the error names the argument path, the problem and the ways out
    message = str(raised.value)
    assert f"cannot fingerprint {path}:" in message and hint in message
    assert "grousset_key=" in message and "idempotency_key=" in message


def test_self_referencing_container_is_reported_not_overflowing() -> None:
    # Given a list that contains itself, inside a dict
    loop: list[object] = [1]
    loop.append(loop)
    # When it is fingerprinted
    with pytest.raises(FingerprintError) as raised:
        fingerprint("shop.process", ({"loop": loop},), signature=PROCESS)
    # Then the error points at the self reference
    assert 'order["loop"][1]: it is the same container as order["loop"]' in str(raised.value)


def test_nesting_deeper_than_the_cap_is_refused() -> None:
    # Given 101 nested lists (not a cycle), and 100 which are fine
    deep: list[object] = []
    for _ in range(100):
        deep = [deep]
    # When they are encoded, under a custom path
    canonical_bytes(deep[0])
    with pytest.raises(FingerprintError) as raised:
        canonical_bytes(deep, path="deep")
    # Then only the deeper one is refused, naming the path and the cap
    assert "cannot fingerprint deep[0][0]" in str(raised.value)
    assert "more than 100 levels" in str(raised.value)


# --- properties -----------------------------------------------------------------------

_keys = st.text(max_size=6).filter(lambda key: key not in ("__type__", "__value__"))
_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=10)
json_values = st.recursive(
    _scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)
# Small domains make near-collisions (True/1/1.0, "1"/1, []/{}, {1:..}/{"1":..}) likely.
_tricky = st.sampled_from([None, True, False, 0, 1, -1, 0.0, -0.0, 1.0, "", "0", "1", 2**64])
tricky_values = st.recursive(
    _tricky,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.sampled_from(["", "0", "1", "a"]), inner, max_size=3)
        | st.dictionaries(st.sampled_from([0, 1, -1]), inner, max_size=3)
    ),
    max_leaves=8,
)
any_values = st.one_of(json_values, tricky_values)


def _transform(value: Any, rnd: random.Random | None) -> Any:
    """Shuffle dict insertion order (with ``rnd``), else turn lists into tuples."""
    if isinstance(value, dict):
        items = [(key, _transform(item, rnd)) for key, item in value.items()]
        if rnd is not None:
            rnd.shuffle(items)
        return dict(items)
    if isinstance(value, list):
        items = [_transform(item, rnd) for item in value]
        return items if rnd is not None else tuple(items)
    return value


def _normalise(value: Any) -> Any:
    """Reference canonicaliser: what JSON keeps distinct, kept distinct."""
    if isinstance(value, (list, tuple)):
        return ("list", tuple(_normalise(item) for item in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _normalise(v)) for k, v in value.items())))
    if isinstance(value, float):
        return ("float", value + 0.0)
    return (type(value).__name__, value)  # NoneType, bool, int, str: tags keep True != 1


@given(json_values, st.randoms(use_true_random=False))
def test_dict_order_and_tuples_never_change_the_encoding(value: Any, rnd: random.Random) -> None:
    # Given a JSON-like value, the same with every dict reordered, and with tuples for lists
    shuffled, as_tuples = _transform(value, rnd), _transform(value, None)
    # When they are encoded
    encodings = {canonical_bytes(value), canonical_bytes(shuffled), canonical_bytes(as_tuples)}
    # Then the encodings are identical
    assert len(encodings) == 1


@given(any_values)
def test_json_round_trip_never_changes_the_encoding(value: Any) -> None:
    # Given a value and what the task serializer's JSON round trip makes of it
    round_tripped = json.loads(json.dumps(value))
    # When both are encoded
    # Then the encodings are identical
    assert canonical_bytes(round_tripped) == canonical_bytes(value)


@given(any_values, any_values)
def test_encoding_is_injective(left: Any, right: Any) -> None:
    # Given two values, and whether JSON would tell them apart
    distinct = _normalise(left) != _normalise(right)
    # When both are encoded and fingerprinted
    same_bytes = canonical_bytes(left) == canonical_bytes(right)
    same_fingerprint = fingerprint("t", (left,)) == fingerprint("t", (right,))
    # Then equal encodings happen exactly for equal canonical values
    assert same_bytes is not distinct
    assert same_fingerprint is not distinct


@given(any_values)
def test_wrapping_a_value_in_a_list_changes_its_encoding(value: Any) -> None:
    # Given a value and the same value wrapped once more
    wrapped = [value]
    # When both are encoded
    # Then the encodings differ (length prefixes keep nesting unambiguous)
    assert canonical_bytes(wrapped) != canonical_bytes(value)


# -- FINGERPRINT_KEY: keyed fingerprints ----------------------------------------------------

KEY_A, KEY_B = "a" * 16 + "-secret-key-one!", "b" * 16 + "-secret-key-two!"


def test_a_fingerprint_key_keys_every_fingerprint_and_payload_hash() -> None:
    from django.test import override_settings

    from celery_grousset.fingerprint import payload_hash

    sig = inspect.signature(charge)
    bound = {"order_id": 7, "amount": 1250, "currency": "EUR"}

    def three() -> tuple[str, str, str]:
        return (
            fingerprint("shop.charge", (7, 1250), signature=sig),
            fingerprint("ns", idempotency_key="k"),
            payload_hash("shop.charge", bound),
        )

    plain = three()
    # Given a key / When the same calls are fingerprinted under it, and under another
    with override_settings(GROUSSET={"FINGERPRINT_KEY": KEY_A}):
        keyed = three()
        again = fingerprint("shop.charge", (7, 1250), signature=sig)
    with override_settings(GROUSSET={"FINGERPRINT_KEY": KEY_B.encode()}):
        other = fingerprint("shop.charge", (7, 1250), signature=sig)
    # Then each differs from the unkeyed one, is stable under its key, and differs by key
    assert all(k != p and len(k) == 64 for k, p in zip(keyed, plain, strict=True))
    assert again == keyed[0] and other not in (keyed[0], plain[0])
    # ... and without the key set again, the fingerprints are the unkeyed ones
    assert fingerprint("shop.charge", (7, 1250), signature=sig) == plain[0]


@pytest.mark.parametrize("value", ["short-secret", b"x" * 31, 12345, ["k" * 40]])
def test_a_fingerprint_key_too_short_or_not_text_is_refused_without_showing_it(
    value: object,
) -> None:
    from celery_grousset.conf import GroussetSettingsError, validate_setting

    with pytest.raises(GroussetSettingsError, match="at least 32 bytes") as refused:
        validate_setting("FINGERPRINT_KEY", value)
    assert "short-secret" not in str(refused.value) and "xxxx" not in str(refused.value)
    assert "secrets.token_urlsafe(32)" in str(refused.value)


def test_a_guarded_call_under_a_fingerprint_key_runs_once_and_is_found_under_it(
    grousset_eager: object,
) -> None:
    import uuid

    from django.test import override_settings

    from celery_grousset.contrib.pytest import Journal
    from tests import services
    from tests.ledger.models import Effect
    from tests.tasks import effect

    services.require_database("default")
    key = f"keyed-{uuid.uuid4().hex[:8]}"
    with override_settings(GROUSSET={"DATABASE": "default", "FINGERPRINT_KEY": KEY_A}):
        # Given a key / When a call is delivered twice
        first, second = effect.apply((key,)).get(), effect.apply((key,)).get()
        record = Journal().get(effect, key)
        keyed = effect.grousset_fingerprint((key,), {})
    # Then it ran once, the duplicate got the memo, and its record is under the keyed
    # fingerprint, not the unkeyed one
    assert Effect.objects.using("default").filter(key=key).count() == 1 and second == first
    assert record.fingerprint == keyed != effect.grousset_fingerprint((key,), {})


def test_a_lazy_translation_is_the_text_it_reads_now() -> None:
    """kombu's JSON sends a ``gettext_lazy`` string as the ``str`` it is at publish: the
    fingerprint reads it so too (it was refused at publish as an unknown object)."""
    from django.utils import translation
    from django.utils.translation import gettext_lazy

    from celery_grousset.fingerprint import canonical_bytes

    label = gettext_lazy("Receipt")
    with translation.override("en"):
        assert canonical_bytes({"subject": label}) == canonical_bytes({"subject": "Receipt"})
        assert fingerprint("t", ("Receipt",)) == fingerprint("t", (label,))
