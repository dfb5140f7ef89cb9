"""Arguments and options the commands share: durations, JSON values, ``--json``, RUN_ID."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import click

from jobrun._core import refuse

if TYPE_CHECKING:
    # click 8.2 made ParamType generic; at run time the plain class works on every click.
    DurationBase = click.ParamType[timedelta, Any]
    JsonBase = click.ParamType[Any, Any]
else:
    DurationBase = JsonBase = click.ParamType

F = TypeVar("F", bound=Callable[..., object])

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table."
)
run_id_argument = click.argument("run_id", metavar="RUN_ID")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``45s``, ``2w``, or a sum of them such as ``1d12h``."""
    compact = text.strip().lower()
    if not compact or _PART.sub("", compact):
        raise refuse(
            "duration",
            "is not a number and a unit",
            message=f"{text!r} is not a duration: use a number and a unit, e.g. 7d, 12h, 30m",
        )
    seconds = sum(float(amount) * _UNITS[unit] for amount, unit in _PART.findall(compact))
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise refuse(
            "duration",
            "is longer than any duration Python can hold",
            message=f"{text!r} is longer than any duration Python can hold "
            "(about 2.7 million years)",
        ) from None


class Duration(DurationBase):
    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


class JsonValue(JsonBase):
    """Any JSON text, decoded; NaN and Infinity are refused as jobrun refuses them."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            decoded = json.loads(value, parse_constant=_refuse_constant)
        except ValueError as error:
            self.fail(f"not valid JSON: {error}", param, ctx)
        except RecursionError:
            self.fail(
                "nested too deeply to decode (a run carries ids and configuration)", param, ctx
            )
        if isinstance(decoded, float) and not math.isfinite(decoded):
            self.fail("numbers must be finite", param, ctx)
        return decoded


def duration_option(name: str, *, help: str, required: bool = False) -> Callable[[F], F]:
    """``name`` as an option taking a DURATION (7d, 12h, 1d12h, ...); ``None`` when not given."""
    return click.option(name, type=Duration(), required=required, metavar="DURATION", help=help)
