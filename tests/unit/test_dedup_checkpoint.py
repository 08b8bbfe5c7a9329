"""Which dedup operator a checkpoint's state metadata names (no Spark)."""

from __future__ import annotations

import pytest

from pipelines.streaming.dedup import written_operator


@pytest.mark.parametrize(("names", "operator"), [
    (["v2"], "bucketed"),
    (["v2", ".v2.crc"], "bucketed"),
    (["metadata", ".metadata.crc"], "spark"),
    # a job killed while Spark wrote the first batch's metadata: nothing says which
    ([], None),
    ([".metadata.3a6a8924-c842-45f6-a17e-133ee6dbf2ec.tmp"], None),
])
def test_the_operator_is_read_from_what_spark_finished_writing(
    names: list[str], operator: str | None,
) -> None:
    assert written_operator(names) == operator
