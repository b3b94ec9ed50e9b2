"""The on-disk contract shared by the converters (write side) and the readers (read side)."""

from fastload.format.column_writer import encode_arrays, encode_strings, write_column_pieces, write_columns
from fastload.format.columns import ArrayColumn, StringColumn, load_column, load_strings
from fastload.format.index import RecordIndex
from fastload.format.layout import (
    COLUMNS, FIELD_PREFIX, FORMAT_VERSION, HDF5_DATA, HDF5_OFFSETS, INDEX_DIR, MANIFEST_NAME,
    NO_LABEL, PACK_LOCK_NAME, PACK_STATE_DIR, SKIPPED_REPORT_NAME, STORAGE_KINDS, StorageKind,
    file_digest, lmdb_key, record_checksum, shard_name,
)
from fastload.format.manifest import (
    IndexFile, Manifest, ShardInfo, fsync_dir, parse_manifest, read_manifest, write_atomically,
    write_manifest,
)

__all__ = [
    "COLUMNS", "FIELD_PREFIX", "FORMAT_VERSION", "HDF5_DATA", "HDF5_OFFSETS", "INDEX_DIR",
    "MANIFEST_NAME", "NO_LABEL", "PACK_LOCK_NAME", "PACK_STATE_DIR", "SKIPPED_REPORT_NAME",
    "STORAGE_KINDS", "ArrayColumn", "IndexFile", "RecordIndex", "Manifest", "ShardInfo", "StorageKind", "StringColumn",
    "encode_arrays", "encode_strings", "file_digest", "fsync_dir", "lmdb_key", "load_column", "load_strings",
    "parse_manifest", "read_manifest", "record_checksum", "shard_name", "write_atomically",
    "write_column_pieces", "write_columns", "write_manifest",
]
