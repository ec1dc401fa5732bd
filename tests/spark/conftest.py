"""Spark fixtures: ``spark``, one local[2] SparkSession for the whole run (spark_session.py)."""

from spark_session import spark  # noqa: F401
