"""A location's pyarrow file system, configured the way pyiceberg's FileIO configures it.

Never ``pyarrow.fs.FileSystem.from_uri``: that ignores ``s3.endpoint`` and the keys, and
asks AWS about a bucket of the same name (``Could not resolve host:
<bucket>.s3.us-east-1.amazonaws.com``). A table's folder is opened through its own FileIO
(:func:`io_filesystem`, the catalog's and the table's properties); a location outside any
table, such as ``wal.root``, through a FileIO built from storage properties
(:func:`storage_filesystem`): ``s3.endpoint``, ``s3.access-key-id``,
``s3.secret-access-key``, ``s3.session-token``, ``s3.region``, ``s3.path-style-access``,
``s3.force-virtual-addressing``, ``s3.connect-timeout``, ``s3.request-timeout``...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from icegate_dagster.config.models import DEFAULT_S3_REGION

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

_REGION_KEYS = ("s3.region", "client.region")
#: The schemes pyiceberg's pyarrow FileIO opens with storage properties.
CONFIGURED_SCHEMES = frozenset(
    {"s3", "s3a", "s3n", "oss", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "wasb", "wasbs"}
)


def io_filesystem(io: Any, location: str) -> tuple[FileSystem, str] | None:
    """The file system of ``location`` as the FileIO ``io`` configures it, and the
    location's path there (``bucket/key`` on S3); None when ``io`` is no pyarrow FileIO."""
    if not (hasattr(io, "parse_location") and hasattr(io, "fs_by_scheme")):  # PyArrowFileIO
        return None
    scheme, netloc, path = io.parse_location(location)
    return io.fs_by_scheme(scheme, netloc), path


def pyarrow_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """``properties`` as pyiceberg's pyarrow FileIO reads them: an endpoint without a region
    gets :data:`~icegate_dagster.config.models.DEFAULT_S3_REGION` (pyiceberg would ask AWS
    about the bucket), and ``s3.path-style-access`` (Iceberg Java's
    name, which pyiceberg does not read) becomes ``s3.force-virtual-addressing``, its
    opposite, unless that is set."""
    props = dict(properties)
    if props.get("s3.endpoint") and not any(props.get(k) for k in _REGION_KEYS):
        props["s3.region"] = DEFAULT_S3_REGION
    path_style = props.get("s3.path-style-access")
    if path_style is not None and "s3.force-virtual-addressing" not in props:
        virtual = path_style.strip().lower() not in ("true", "1", "yes")
        props["s3.force-virtual-addressing"] = str(virtual).lower()
    return props


def storage_filesystem(location: str, properties: Mapping[str, str]) -> tuple[FileSystem, str]:
    """The file system of ``location`` (a URI or a plain local path) configured from storage
    ``properties`` (see :func:`pyarrow_properties`), and the location's path there."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    found = io_filesystem(PyArrowFileIO(pyarrow_properties(properties)), location)
    assert found is not None  # a PyArrowFileIO always answers
    return found
