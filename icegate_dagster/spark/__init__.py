"""The engine: the process's Spark session, with the Iceberg runtime and the catalog.

- :mod:`.session`: the one session of the process, started on first use, stopped at exit;
- :mod:`.conf`: every setting of the session, the user's ``spark.conf`` merged last;
- :mod:`.catalog_conf`: the ``catalog:`` block as Spark's catalog settings, same name;
- :mod:`.jars`: the Iceberg runtime and the JDBC drivers, found before the JVM starts;
- :mod:`.s3_file_io`: Iceberg's S3FileIO and its AWS bundle, for a catalog in S3;
- :mod:`.jvm_options`: the driver JVM's class-data sharing, collector and JIT;
- :mod:`.secret_settings`: the settings that hold a secret, kept off the command line;
- :mod:`.class_archive`: the archive of the driver's classes that ``scripts/setup.sh``
  makes (``python -m icegate_dagster.spark.class_archive``).

May import ``config``, ``errors`` and ``catalog``; never ``maintenance``, Dagster or an
entry point. Nothing here imports pyspark at import time: a process starts its JVM only
when an operation needs one.
"""
