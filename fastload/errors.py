"""The one small error hierarchy: every class also subclasses the builtin a caller would catch."""

from __future__ import annotations


class FastloadError(Exception):
    """Base class of every error fastload raises on purpose."""


class ManifestError(FastloadError, ValueError):
    """The manifest is missing, unreadable, or from another format version."""


class DatasetNotFoundError(FastloadError, FileNotFoundError):
    """A path that should hold a packed dataset (or a source folder) does not exist."""


class SourceNotFoundError(FastloadError, FileNotFoundError):
    """The folder or file list given to pack does not exist."""


class CorruptRecordError(FastloadError, ValueError):
    """A record's bytes do not match its checksum, or cannot be read or decoded."""


class SourceError(FastloadError, ValueError):
    """A source file or file list cannot be packed as it is."""


class PackError(FastloadError, RuntimeError):
    """A pack could not run or finish (output in use, disk full, unwritable output)."""


class RemoteReadError(FastloadError, OSError):
    """An object store failed a request for good: retries ran out, or it answered with an error."""


class RemoteNotFound(RemoteReadError, FileNotFoundError):
    """An object a dataset needs is not in the store (404)."""


class BucketNotFound(RemoteNotFound):
    """The bucket (container) of a URL does not exist, or these credentials cannot see it."""


class RemoteAccessDenied(RemoteReadError, PermissionError):
    """The store refused the request (403) or no credentials were found."""


class MissingDependencyError(FastloadError, ImportError):
    """An optional dependency is not installed."""


class SharedMemoryError(FastloadError, OSError):
    """Shared memory (``/dev/shm``) has no room for what a loader must hold there."""


class ClusterUnreachableError(FastloadError, ConnectionError):
    """No Ray cluster answered at the address given (or none runs where ``"auto"`` looks)."""


class ClusterLostError(FastloadError, ConnectionError):
    """The Ray a ``mode="ray"`` loader ran on was shut down (or replaced) while it used it."""


class SkippedRecordWarning(UserWarning):
    """A damaged record was dropped from its batch by ``on_error="skip"`` (said once per shard)."""


class CacheWarning(UserWarning):
    """The node cache could not be used for a read (which went to the store instead)."""

