"""Spark Connect without a server: what a run says before any session exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from icegate_dagster.config import config_from_dict
from icegate_dagster.errors import SparkStartError
from icegate_dagster.spark.session import get_spark
from tests.servers import free_port


def test_an_unreachable_server_is_named_without_its_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens on the port: the run says so at once (PySpark's client would
    retry for minutes), naming the URL with its token masked."""
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    port = free_port()
    url = f"sc://127.0.0.1:{port}/;token=tok-5e3c1a9b7d"
    config = config_from_dict({"spark": {"remote": url}}, tmp_path)
    with pytest.raises(SparkStartError) as raised:
        get_spark(config)
    message = str(raised.value)
    assert f"nothing answers at 127.0.0.1:{port}" in message
    assert f"sc://127.0.0.1:{port}/;token=***" in message
    assert "tok-5e3c1a9b7d" not in message

