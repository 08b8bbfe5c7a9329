"""shopstream's jar: built with the machine's javac, found again, and missed cleanly.

The validation reads an event's fields, and the stream deduplicates, with the project's
Java classes (``pipelines/infra/jvm/``); ``make setup`` and every Spark session build
the jar when it is missing. A user without a JDK still gets a working (slower)
validation, and a broken source fails with javac's own message.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path
from typing import Any

import pytest

from pipelines.infra import jvm_jar

pytestmark = pytest.mark.integration


def test_the_jar_is_built_once_and_found_again(make_settings: Any, tmp_path: Path) -> None:
    settings = make_settings(cache_dir=tmp_path / "cache")
    jar = jvm_jar.shopstream_jar(settings)
    assert jar is not None and jar.is_file()
    assert jar.parent == tmp_path / "cache" / "jars"
    with zipfile.ZipFile(jar) as archive:
        names = archive.namelist()
    assert {"shopstream/ContractFields.class", "shopstream/EventDedup.class",
            "shopstream/ValidUtf8.class"} <= set(names)
    built = jar.stat().st_mtime_ns
    assert jvm_jar.shopstream_jar(settings) == jar
    assert jar.stat().st_mtime_ns == built, "an unchanged source was compiled again"
    assert [p.name for p in jar.parent.iterdir()] == [jar.name], "a build left files behind"


def test_an_edited_source_builds_a_new_jar(make_settings: Any, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(cache_dir=tmp_path / "cache")
    first = jvm_jar.shopstream_jar(settings)
    edited = {**jvm_jar._sources(), "EventDedup.java": jvm_jar._sources()["EventDedup.java"] + b"\n// an edit\n"}
    monkeypatch.setattr(jvm_jar, "_sources", lambda: edited)
    second = jvm_jar.shopstream_jar(settings)
    assert first is not None and second is not None and second != first
    assert second.is_file()


def test_without_javac_there_is_no_jar_and_a_warning(make_settings: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no javac on it
    with caplog.at_level(logging.WARNING, logger="pipelines.infra.jvm_jar"):
        assert jvm_jar.shopstream_jar(make_settings(cache_dir=tmp_path / "cache")) is None
    assert "no javac" in caplog.text
    assert not (tmp_path / "cache" / "jars").exists()


def test_a_source_javac_rejects_fails_with_its_message(make_settings: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jvm_jar, "_sources", lambda: {"Broken.java": b"package shopstream; class Broken {"})
    with pytest.raises(jvm_jar.JarBuildError, match="(?s)javac failed.*reached end of file"):
        jvm_jar.shopstream_jar(make_settings(cache_dir=tmp_path / "cache"))
    assert list((tmp_path / "cache" / "jars").iterdir()) == [], "half a jar was left"
