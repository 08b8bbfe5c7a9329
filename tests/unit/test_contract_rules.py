"""The contract's one rule table, and what the contract-fields function is given of it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from features.events import FIELDS, Reason
from features.validation import JAVA_CHECKS, _java_rules, contract_rules

_JAVA = Path(__file__).resolve().parents[2] / "pipelines/infra/jvm/ContractFields.java"


def test_the_java_function_is_given_every_rule_in_order_with_its_field() -> None:
    """One entry per rule of ``contract_rules()``, so the function's numbers are the table's;
    ``null`` exactly for the rules Spark evaluates; each other names its own field."""
    rules = contract_rules()
    given = json.loads(_java_rules())["rules"]
    assert len(given) == len(rules) == 47
    names = [spec.name for spec in FIELDS]
    for (check, _reason, field), entry in zip(rules, given, strict=True):
        if check in JAVA_CHECKS:
            assert entry["check"] == check and names[entry["field"]] == field
        else:
            assert entry is None
    assert [c for (c, _, _), e in zip(rules, given, strict=True) if e is None] == [
        "empty_payload", "invalid_encoding", "invalid_json", "not_an_object",
        "invalid_timestamp", "future_timestamp"]
    too_long = [e for e in given if e and e["check"] == "too_long"]
    assert too_long and all(e["limit"] == 64 for e in too_long)


def test_the_key_rules_come_last_so_the_functions_numbers_hold_with_them() -> None:
    with_key = contract_rules(check_key=True)
    assert with_key[:-2] == contract_rules()
    assert [r[1] for r in with_key[-2:]] == [Reason.MISSING_KEY, Reason.KEY_MISMATCH]


def test_the_java_class_knows_every_check_it_is_given() -> None:
    """The class rejects a check it does not know when it is built; its enum of checks
    and ``JAVA_CHECKS`` must name the same checks."""
    source = _JAVA.read_text()
    listed = re.search(r"enum Check \{(.*?);", source, re.S)
    assert listed is not None
    assert {name.lower() for name in re.findall(r"\b[A-Z][A-Z_]+\b", listed.group(1))} == JAVA_CHECKS
