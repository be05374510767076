"""The driver JVM's own options: class-data sharing, the collector and the JIT.

Each is chosen before the JVM starts and only where the user's ``spark.conf`` chose
nothing of the kind: the archive of the driver's classes that set-up makes
(:mod:`~icegate_dagster.spark.class_archive`), the serial collector for a small local
driver, and C1 alone for a pass known to rewrite little.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

from icegate_dagster.spark.line import DEFAULT_LINE, SparkLine, running_line

#: Where setup puts the archives of the driver's classes (``icegate_dagster.spark.class_archive``):
#: beside the installed packages they were made from, one per Spark line (:func:`classes_archive`).
CLASSES_ARCHIVE_DIR = Path(sys.prefix) / "share" / "icegate"
#: The JVM's notes on the archive off: they go to standard output.
QUIET_CLASS_SHARING = "-Xlog:cds=off,cds+dynamic=off"
#: JVM options a user may have set themselves, which then win.
_USER_CLASS_SHARING = ("-XX:SharedArchiveFile", "-Xshare", "-XX:ArchiveClassesAtExit")


def classes_archive(line: SparkLine | None = None) -> Path:
    """The archive of ``line``'s driver classes (the running PySpark's line by default): an
    archive holds one Spark line's classes, so each line has its own file. The default
    line's keeps the name it had before there were two (images built with it still map it);
    another line's is named by the line (``spark-driver-classes-4.1_2.13.jsa``)."""
    line = line or running_line()
    suffix = "" if line == DEFAULT_LINE else f"-{line.name}"
    return CLASSES_ARCHIVE_DIR / f"spark-driver-classes{suffix}.jsa"


def class_sharing_options(user_options: str = "", archive: Path | None = None) -> str:
    """The driver JVM options that map ``archive`` (:func:`classes_archive` by default) when
    it exists ("" otherwise, or when the user's own options already choose class-data
    sharing). The JVM's notes about the archive are silenced: they would go to standard
    output, which ``--json`` owns."""
    archive = archive or classes_archive()
    if not archive.is_file() or any(option in user_options for option in _USER_CLASS_SHARING):
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto {QUIET_CLASS_SHARING}"


#: The driver's collector in local mode with a small heap: the serial collector runs no
#: threads of its own, which on a few cores take CPU from Spark's tasks (G1's do). The JVM
#: itself picks it below 2 CPUs or 1792 MB of memory. Measured on 2 cores, cold processes:
#: a full pass over 12 small tables 72 s instead of 74-77 s, 0.4 GB compacted in 45 s
#: instead of 49-50 s, and 150-250 MB less resident memory in both (docs/performance.md).
SERIAL_GC = "-XX:+UseSerialGC"
#: Above this driver heap a stop-the-world collector's pauses grow: G1 stays.
SERIAL_GC_MAX_HEAP = 2 * 1024**3
_USER_GC = re.compile(r"-XX:[+-]Use\w*GC\b")
_JVM_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)b?\s*$", re.IGNORECASE)


def jvm_bytes(text: str) -> int | None:
    """A JVM memory size as Spark reads ``spark.driver.memory`` (``512m``, ``2g``; a bare
    number is MiB), in bytes; None when it is not one."""
    match = _JVM_SIZE.match(text)
    if match is None:
        return None
    number, unit = int(match.group(1)), (match.group(2) or "m").lower()
    return int(number * 1024 ** "bkmgt".index(unit))


def local_gc_options(master: str, user: Mapping[str, str]) -> str:
    """:data:`SERIAL_GC` for a local master whose driver heap is at most
    :data:`SERIAL_GC_MAX_HEAP` (Spark's default is 1 GB), unless the user's options choose
    a collector; "" otherwise (a cluster's driver, a big heap, the user's own choice)."""
    if not master.startswith("local"):
        return ""
    options = " ".join(
        user.get(key, "")
        for key in ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions")
    )
    if _USER_GC.search(options):
        return ""
    heap = jvm_bytes(user.get("spark.driver.memory", "1g"))
    if heap is None or heap > SERIAL_GC_MAX_HEAP:
        return ""
    return SERIAL_GC


#: The driver's JIT for a pass whose rewrites are known to be small before its JVM starts:
#: C1 alone. C2 spends the first tables' CPU compiling Spark's and Iceberg's planning code,
#: which a small pass runs a few times only; its faster code pays on big rewrites. Measured
#: on 2 cores, cold processes: 12 small tables' full pass 37 s instead of 45 s; 0.4 GB
#: compacted in 54 s instead of 50 s (docs/performance.md).
QUICK_JIT = "-XX:TieredStopAtLevel=1"
#: The most bytes of data files a pass may have to rewrite to start with :data:`QUICK_JIT`.
QUICK_JIT_MAX_BYTES = 256 * 1024**2
_USER_JIT = re.compile(r"-XX:(TieredStopAtLevel=|[+-]TieredCompilation\b)|-Xint\b|-Xcomp\b")


def local_jit_options(master: str, user: Mapping[str, str], *, small_work: bool) -> str:
    """:data:`QUICK_JIT` for a local driver whose pass is ``small_work`` (see
    :data:`QUICK_JIT_MAX_BYTES`), unless the user's options choose the JIT; "" otherwise."""
    if not small_work or not master.startswith("local"):
        return ""
    options = " ".join(
        user.get(key, "")
        for key in ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions")
    )
    return "" if _USER_JIT.search(options) else QUICK_JIT
