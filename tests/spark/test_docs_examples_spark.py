"""The documentation pages with PySpark examples, run with the shared local SparkSession."""

from __future__ import annotations

import pytest

from tests import docs_runner

PAGES = [p for p in docs_runner.pages() if docs_runner.needs_spark(p)]


@pytest.mark.spark
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(docs_runner.ROOT)))
def test_spark_page_examples_run(page, tmp_path, spark_context):
    # the examples call SparkSession.builder.getOrCreate(), which returns the shared session
    docs_runner.run_page(page, tmp_path)
    assert not spark_context._jsc.sc().isStopped(), f"{page.name} must not stop the session"
