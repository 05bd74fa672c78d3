"""The exceptions module's shared helper for naming records in error messages."""

from __future__ import annotations

from epochstream.exceptions import UserFunctionError, short_repr


class _BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr today")


def test_short_repr_cuts_long_values_and_survives_a_failing_repr() -> None:
    assert short_repr("ab") == "'ab'"
    assert short_repr("x" * 500) == "'" + "x" * 199 + "..."
    assert short_repr(list(range(100)), 10) == "[0, 1, 2, ..."
    assert (
        short_repr(_BrokenRepr())
        == "<_BrokenRepr with failing repr: RuntimeError('no repr today')>"
    )


def test_user_function_error_names_the_record_even_if_its_repr_fails() -> None:
    err = UserFunctionError("map (1/2)", _BrokenRepr(), ValueError("bad"))
    assert "failing repr" in str(err) and "ValueError: bad" in str(err)
