"""The small files around Spark's state: schema files, operator metadata, commit and offset
logs, and the query ``metadata`` file.

* ``state/<op>/<part>[/<store>]/_metadata/schema``: a ``writeUTF`` version (``v1`` or ``v2``),
  then the key and value schemas -- v1 as one ``writeUTF`` each, v2 as an ``int32`` chunk count
  and ``writeUTF`` chunks. Spark 4's v3 files (``_stateSchema/...``, named by operator metadata
  v2) hold a ``writeUTF`` version and JSON of the column families' schemas.
* ``state/<op>/_metadata/metadata`` (v1) and ``state/<op>/_metadata[/metadata]/v2/<batch>`` (v2):
  a version line, then JSON of the operator and its stores.
* ``commits/<batch>``: ``v1`` then ``{"nextBatchWatermarkMs": ...}``; ``offsets/<batch>``: ``v1``,
  the batch metadata (watermark, timestamp, SQL confs), then one line per source offset.

Java's ``writeUTF`` is "modified UTF-8" (2-byte length, NUL as two bytes, supplementary
characters as surrogate pairs); it is decoded and encoded exactly.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from extagg.errors import CorruptFileError, ExtaggError
from extagg.state.spark.types import StructType, UnsupportedSparkTypeError, parse_schema

__all__ = [
    "StoreInfo",
    "OperatorInfo",
    "UnsupportedLogVersionError",
    "read_schema_file",
    "schema_file_bytes",
    "read_operator_metadata",
    "operator_metadata_text",
    "read_log",
    "log_batches",
    "java_utf",
    "read_java_utf",
]

MAX_UTF_CHUNK = 65535


class UnsupportedLogVersionError(ExtaggError, ValueError):
    """A checkpoint file has a version this reader does not know; names the file."""


def java_utf(text: str) -> bytes:
    """``DataOutputStream.writeUTF(text)``: 2-byte length, modified UTF-8."""
    data = text.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")
    out = bytearray()
    for char in data:
        code = ord(char)
        if 0 < code < 0x80:
            out.append(code)
        elif code < 0x800:
            out += bytes([0xC0 | code >> 6, 0x80 | code & 0x3F])
        elif code < 0x10000:
            out += bytes([0xE0 | code >> 12, 0x80 | (code >> 6) & 0x3F, 0x80 | code & 0x3F])
        else:  # a surrogate pair, each half as 3 bytes
            code -= 0x10000
            for half in (0xD800 | code >> 10, 0xDC00 | code & 0x3FF):
                out += bytes([0xE0 | half >> 12, 0x80 | (half >> 6) & 0x3F, 0x80 | half & 0x3F])
    if len(out) > MAX_UTF_CHUNK:
        raise ValueError(f"writeUTF string too long ({len(out)} bytes)")
    return struct.pack(">H", len(out)) + bytes(out)


def read_java_utf(data: bytes, offset: int, path: str) -> tuple[str, int]:
    """Decode a ``writeUTF`` string at ``offset``; returns it and the next offset."""
    if offset + 2 > len(data):
        raise CorruptFileError(path, offset, "truncated: a writeUTF length needs 2 bytes")
    (size,) = struct.unpack_from(">H", data, offset)
    raw = data[offset + 2 : offset + 2 + size]
    if len(raw) != size:
        raise CorruptFileError(path, offset, f"truncated: a writeUTF string of {size} bytes")
    try:
        text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
        text = text.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeError as exc:
        raise CorruptFileError(path, offset, f"bad modified UTF-8: {exc}") from None
    return text, offset + 2 + size


def _schema(text: str, path: str, offset: int) -> StructType:
    try:
        return parse_schema(text)
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, UnsupportedSparkTypeError):
            raise UnsupportedSparkTypeError(f"{path}: {exc}") from None
        raise CorruptFileError(path, offset, f"bad schema JSON: {exc}") from None


def read_schema_file(path: str) -> tuple[StructType, StructType]:
    """The (key, value) schemas of a v1/v2/v3 state schema file (v3: the default family)."""
    with open(path, "rb") as handle:
        data = handle.read()
    version, pos = read_java_utf(data, 0, path)
    if version == "v1":
        key, after = read_java_utf(data, pos, path)
        value, _ = read_java_utf(data, after, path)
        return _schema(key, path, pos), _schema(value, path, after)
    if version == "v2":
        texts = []
        for _ in range(2):
            if pos + 4 > len(data):
                raise CorruptFileError(path, pos, "truncated: a chunk count needs 4 bytes")
            (chunks,) = struct.unpack_from(">i", data, pos)
            start = pos
            pos += 4
            if chunks < 1:
                raise CorruptFileError(path, start, f"bad chunk count {chunks}")
            parts = []
            for _ in range(chunks):
                part, pos = read_java_utf(data, pos, path)
                parts.append(part)
            texts.append(("".join(parts), start))
        return (
            _schema(texts[0][0], path, texts[0][1]),
            _schema(texts[1][0], path, texts[1][1]),
        )
    if version == "v3":
        try:
            body = json.loads(data[pos:].decode("utf-8"))
            families = body["stateStoreColFamilySchema"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptFileError(path, pos, f"bad v3 schema JSON: {exc}") from None
        for family in families:
            if family.get("colFamilyName", "default") == "default":
                key, value = family["keySchema"], family["valueSchema"]
                return _schema_any(key, path, pos), _schema_any(value, path, pos)
        raise UnsupportedSparkTypeError(
            f"{path}: state schema v3 without a 'default' column family (transformWithState "
            "state variables are not supported)"
        )
    raise UnsupportedLogVersionError(
        f"{path}: unsupported state schema version {version!r} (supported: v1, v2, v3)"
    )


def _schema_any(value: Any, path: str, offset: int) -> StructType:
    return _schema(value if isinstance(value, str) else json.dumps(value), path, offset)


def schema_file_bytes(key_schema: StructType, value_schema: StructType) -> bytes:
    """A v2 schema file, as Spark's ``SchemaV2Writer`` writes it."""
    out = bytearray(java_utf("v2"))
    for schema in (key_schema, value_schema):
        text = schema.json()
        chunks = [text[i : i + MAX_UTF_CHUNK] for i in range(0, len(text), MAX_UTF_CHUNK)] or [""]
        out += struct.pack(">i", len(chunks))
        for chunk in chunks:
            out += java_utf(chunk)
    return bytes(out)


@dataclass(frozen=True)
class StoreInfo:
    store_name: str
    num_cols_prefix_key: int
    num_partitions: int
    schema_file: str | None = None


@dataclass(frozen=True)
class OperatorInfo:
    operator_id: int
    operator_name: str
    stores: tuple[StoreInfo, ...]
    version: int = 1
    properties_json: str | None = None
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def store(self, name: str) -> StoreInfo | None:
        return next((s for s in self.stores if s.store_name == name), None)


def _split_version(path: str, data: bytes) -> tuple[str, str]:
    text = data.decode("utf-8", "replace")
    first, _, rest = text.partition("\n")
    return first.strip(), rest


def read_operator_metadata(path: str) -> OperatorInfo:
    """Parse an operator metadata file (v1 or v2)."""
    with open(path, "rb") as handle:
        data = handle.read()
    version, body = _split_version(path, data)
    if version not in ("v1", "v2"):
        raise UnsupportedLogVersionError(
            f"{path}: unsupported operator metadata version {version[:20]!r} (supported: v1, v2)"
        )
    try:
        parsed = json.loads(body)
        info = parsed["operatorInfo"]
        stores = tuple(
            StoreInfo(
                str(s["storeName"]),
                int(s.get("numColsPrefixKey", 0)),
                int(s["numPartitions"]),
                s.get("stateSchemaFilePath"),
            )
            for s in parsed["stateStoreInfo"]
        )
        return OperatorInfo(
            int(info["operatorId"]),
            str(info["operatorName"]),
            stores,
            int(version[1:]),
            parsed.get("operatorPropertiesJson"),
            path,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptFileError(
            path, len(version) + 1, f"bad operator metadata JSON: {exc}"
        ) from None


def operator_metadata_text(operator: OperatorInfo) -> str:
    """Operator metadata v1 text, as Spark's ``OperatorStateMetadataV1Writer`` writes it."""
    body = {
        "operatorInfo": {
            "operatorId": operator.operator_id,
            "operatorName": operator.operator_name,
        },
        "stateStoreInfo": [
            {
                "storeName": s.store_name,
                "numColsPrefixKey": s.num_cols_prefix_key,
                "numPartitions": s.num_partitions,
            }
            for s in operator.stores
        ],
    }
    return "v1\n" + json.dumps(body, separators=(",", ":"))


def read_log(path: str, max_version: int = 1) -> list[Any]:
    """A commit/offset log entry: the JSON values after its ``v<N>`` line (``"-"`` lines of an
    offset log -- sources without an offset -- become ``None``)."""
    with open(path, "rb") as handle:
        data = handle.read()
    version, body = _split_version(path, data)
    if not version.startswith("v") or not version[1:].isdigit():
        raise CorruptFileError(path, 0, f"bad log version line {version[:20]!r}")
    if int(version[1:]) > max_version:
        raise UnsupportedLogVersionError(
            f"{path}: unsupported log version {version} (supported: up to v{max_version})"
        )
    values: list[Any] = []
    offset = len(version) + 1
    for line in body.split("\n"):
        if line.strip() in ("", "-"):
            if line.strip() == "-":
                values.append(None)
            offset += len(line) + 1
            continue
        try:
            values.append(json.loads(line))
        except ValueError as exc:
            raise CorruptFileError(path, offset, f"bad log JSON: {exc}") from None
        offset += len(line.encode()) + 1
    return values


def log_batches(directory: str) -> list[int]:
    """Batch ids of a log directory (numeric file names), ascending."""
    try:
        names: Iterable[str] = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(name) for name in names if name.isdigit())
