"""The Spark line this process runs on: PySpark's major.minor and its Scala version.

Two lines are supported side by side, each in its own virtualenv: 3.5 (Scala 2.12, the
default: ``scripts/setup.sh``, ``.venv``) and 4.1 (Scala 2.13: ``scripts/setup.sh
--spark4``, ``.venv-spark4``). The line chooses the jars (Iceberg's runtime is built per
Spark major.minor and Scala version, so each line has its own lock,
:mod:`~icegate_dagster.spark.jars`) and the class-data sharing archive
(:mod:`~icegate_dagster.spark.class_archive`), which holds one line's classes only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from icegate_dagster.errors import SparkStartError


@dataclass(frozen=True)
class SparkLine:
    """One supported Spark line: what it runs with and how set-up makes it."""

    #: Spark's major.minor, as in PySpark's version and Iceberg's runtime artifact.
    spark: str
    #: The Scala version PyPI's PySpark of this line is built with.
    scala: str
    #: The jars lock of this line, a file of the ``icegate_dagster.spark`` package.
    lock: str
    #: The set-up command that makes this line's environment and fetches its jars.
    setup_command: str

    @property
    def name(self) -> str:
        """``3.5_2.12``: Spark's and Scala's versions, as Maven artifacts name them."""
        return f"{self.spark}_{self.scala}"

    @property
    def runtime_artifact(self) -> str:
        """The artifact of Iceberg's Spark runtime for this line."""
        return f"iceberg-spark-runtime-{self.name}"


DEFAULT_LINE = SparkLine("3.5", "2.12", "jars.lock", "scripts/setup.sh")
SPARK4_LINE = SparkLine("4.1", "2.13", "jars-spark4.lock", "scripts/setup.sh --spark4")
SPARK_LINES = (DEFAULT_LINE, SPARK4_LINE)


def line_of(pyspark_version: str) -> SparkLine:
    """The supported line of a PySpark version (``4.1.4`` -> 4.1); a clear error naming
    the supported lines when there is none."""
    major_minor = ".".join(pyspark_version.split(".")[:2])
    for line in SPARK_LINES:
        if line.spark == major_minor:
            return line
    supported = ", ".join(f"{line.spark} ({line.setup_command})" for line in SPARK_LINES)
    raise SparkStartError(
        f"PySpark {pyspark_version} is on no supported Spark line: install one of {supported}"
    )


@functools.cache
def running_line() -> SparkLine:
    """The line of the PySpark this interpreter imports (``pyspark.__version__``)."""
    import pyspark

    return line_of(pyspark.__version__)
