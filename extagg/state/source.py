"""Spark-style options for the state readers: ``spark.read.format("statestore").options(...)``.

:func:`read_state_source` takes Spark's option names (case-insensitive, values as strings or
Python values), applies Spark's rules for missing, invalid and conflicting options, and calls
:func:`~extagg.state.reader.read_state` or :func:`~extagg.state.reader.read_change_feed`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from extagg.state.errors import StateSourceConflictError, StateSourceOptionError
from extagg.state.options import check_store_name_option
from extagg.state.provider import DEFAULT_STORE_NAME
from extagg.state.reader import read_change_feed, read_state
from extagg.state.rows import Rows

__all__ = ["read_state_source", "SOURCE_OPTIONS"]

#: Spark option name (lower case) -> its spelling
SOURCE_OPTIONS = {
    name.lower(): name
    for name in (
        "path",
        "batchId",
        "operatorId",
        "storeName",
        "joinSide",
        "snapshotStartBatchId",
        "snapshotPartitionId",
        "readChangeFeed",
        "changeStartBatchId",
        "changeEndBatchId",
    )
}
_TRANSFORM_WITH_STATE = {
    "statevarname": "stateVarName",
    "readregisteredtimers": "readRegisteredTimers",
    "flattencollectiontypes": "flattenCollectionTypes",
}


def _int_option(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            raise StateSourceOptionError(name, f"must be an integer, got {text!r}.") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateSourceOptionError(name, f"must be an integer, got {value!r}.")
    if value < 0:
        raise StateSourceOptionError(
            name,
            f"[STDS_INVALID_OPTION_VALUE.IS_NEGATIVE] Invalid value for source option '{name}': "
            "cannot be negative.",
            error_class="STDS_INVALID_OPTION_VALUE.IS_NEGATIVE",
        )
    return value


def _bool_option(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise StateSourceOptionError(name, f"must be 'true' or 'false', got {value!r}.")


def _required(name: str) -> StateSourceOptionError:
    return StateSourceOptionError(
        name,
        f"[STDS_REQUIRED_OPTION_UNSPECIFIED] '{name}' must be specified.",
        error_class="STDS_REQUIRED_OPTION_UNSPECIFIED",
    )


def read_state_source(
    path: str | os.PathLike[str] | None = None,
    options: Mapping[str, Any] | None = None,
    **more: Any,
) -> Rows[Any]:
    """Read state with Spark's ``statestore`` data source options.

    Options (case-insensitive): ``batchId``, ``operatorId``, ``storeName``, ``joinSide``,
    ``snapshotStartBatchId``, ``snapshotPartitionId``, ``readChangeFeed``,
    ``changeStartBatchId``, ``changeEndBatchId``. Errors follow Spark's:
    ``STDS_REQUIRED_OPTION_UNSPECIFIED``, ``STDS_INVALID_OPTION_VALUE`` and
    ``STDS_CONFLICT_OPTIONS``, each naming the option; unknown options are rejected, so a typo
    cannot go unnoticed.

    Parameters
    ----------
    path
        The checkpoint directory (or the ``path`` option).
    options
        The options as a mapping.
    **more
        More options as keywords.

    Returns
    -------
    Rows
        :class:`StateRow` rows, or :class:`ChangeRow` rows with ``readChangeFeed``.
    """
    given: dict[str, Any] = {}
    for raw_name, value in {**(options or {}), **more}.items():
        lowered = str(raw_name).lower()
        if lowered in _TRANSFORM_WITH_STATE:
            raise StateSourceOptionError(
                _TRANSFORM_WITH_STATE[lowered],
                "is only for transformWithState operators, which extagg state stores are not.",
            )
        if lowered not in SOURCE_OPTIONS:
            raise StateSourceOptionError(
                str(raw_name),
                f"unknown option; known options are {sorted(SOURCE_OPTIONS.values())}.",
            )
        name = SOURCE_OPTIONS[lowered]
        if name in given:
            raise StateSourceOptionError(name, "is given more than once (names ignore case).")
        given[name] = value
    if path is not None:
        if "path" in given:
            raise StateSourceConflictError(("path",), "Give the path once.")
        given["path"] = path
    if given.get("path") is None:
        raise _required("path")

    store_name = DEFAULT_STORE_NAME
    if "storeName" in given:
        store_name = check_store_name_option(given["storeName"], "storeName")
    join_side = str(given.get("joinSide", "none")).strip().lower()
    if join_side not in ("left", "right", "none"):
        raise StateSourceOptionError(
            "joinSide", f"must be 'left', 'right' or 'none', got {given['joinSide']!r}."
        )
    if join_side != "none" and store_name != DEFAULT_STORE_NAME:
        raise StateSourceConflictError(
            ("joinSide", "storeName"), "A join side reads the join's own stores."
        )
    change_feed = _bool_option("readChangeFeed", given.get("readChangeFeed", False))
    if change_feed:
        conflicting = [
            name
            for name in ("batchId", "snapshotStartBatchId", "snapshotPartitionId")
            if given.get(name) is not None
        ]
        if join_side != "none":
            conflicting.insert(0, "joinSide")
        if conflicting:
            raise StateSourceConflictError(
                ("readChangeFeed", *conflicting),
                "The change feed reads a range given by changeStartBatchId/changeEndBatchId.",
            )
    else:
        for name in ("changeStartBatchId", "changeEndBatchId"):
            if given.get(name) is not None:
                raise StateSourceOptionError(
                    name, "Only specify this option when readChangeFeed is set to true."
                )
    if join_side != "none":
        raise StateSourceOptionError(
            "joinSide", "extagg state stores hold no stream-stream join state; use 'none'."
        )

    operator_id = _int_option("operatorId", given.get("operatorId", 0))
    if change_feed:
        start = _int_option("changeStartBatchId", given.get("changeStartBatchId"))
        if start is None:
            raise _required("changeStartBatchId")
        end = _int_option("changeEndBatchId", given.get("changeEndBatchId"))
        if end is not None and end < start:
            raise StateSourceOptionError(
                "changeEndBatchId",
                f"'changeEndBatchId' ({end}) cannot be smaller than 'changeStartBatchId' "
                f"({start}). Please check the input to 'changeStartBatchId' and "
                "'changeEndBatchId'.",
            )
        return read_change_feed(given["path"], start, end, operator_id or 0, store_name)

    batch_id = _int_option("batchId", given.get("batchId"))
    snapshot_start = _int_option("snapshotStartBatchId", given.get("snapshotStartBatchId"))
    snapshot_partition = _int_option("snapshotPartitionId", given.get("snapshotPartitionId"))
    if snapshot_start is not None and snapshot_partition is None:
        raise _required("snapshotPartitionId")
    if snapshot_partition is not None and snapshot_start is None:
        raise _required("snapshotStartBatchId")
    if snapshot_start is not None and batch_id is not None and snapshot_start > batch_id:
        raise StateSourceOptionError(
            "snapshotStartBatchId",
            f"must be less than or equal to 'batchId' ({batch_id}), got {snapshot_start}.",
        )
    return read_state(
        given["path"],
        batch_id=batch_id,
        operator_id=operator_id or 0,
        store_name=store_name,
        partition_id=snapshot_partition,
        snapshot_start_batch_id=snapshot_start,
    )
