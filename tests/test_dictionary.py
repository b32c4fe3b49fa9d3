"""Dictionary storage: versioned edits, import/export round trip, registration-time snapshots."""
from __future__ import annotations

import pytest
import yaml

from registry import Registry
from registry.dictionary.definitions import (
    definition_as_of, dump_document, export_document, get_definition, import_definitions, parse_document,
    update_definition,
)
from registry.core.errors import DefinitionError, InputError


def test_edit_records_version_and_runs_keep_their_snapshot(registry: Registry):
    old = registry.register_arrays("before", {"train/clip_fraction": ([1, 2], [0.1, 0.2])},
                                   framework="stable-baselines3")
    old_series = registry.run_detail(old.run_id)["series"][0]
    name = old_series["definition"]
    with registry.transaction() as s:
        before = get_definition(s, name)
        v0 = before.version
        update_definition(s, name, {"healthy_range": {"low": 0.02, "high": 0.25}}, author="alice", note="tighter")
    with registry.read() as s:
        defn = get_definition(s, name)
        assert defn.version == v0 + 1
        last = defn.versions[-1]
        assert (last.author, last.change_note, last.changed_fields) == ("alice", "tighter", ["healthy_range"])
        snapshot = definition_as_of(s, defn.id, old_series["definition_version"])
        assert snapshot["healthy_range"] != {"low": 0.02, "high": 0.25}
    new = registry.register_arrays("after", {"train/clip_fraction": ([1], [0.1])}, framework="stable-baselines3")
    assert registry.run_detail(new.run_id)["series"][0]["definition_version"] == v0 + 1


def test_export_import_round_trip_is_lossless(registry: Registry, tmp_path):
    with registry.read() as s:
        doc = export_document(s)
    text = dump_document(doc, "yaml")
    specs = parse_document(text)
    assert [sp["name"] for sp in specs] == [d["name"] for d in doc["definitions"]]
    with registry.transaction() as s:
        report = import_definitions(s, specs, author="bob")
    assert report.updated == [] and report.created == []
    json_specs = parse_document(dump_document(doc, "json"))
    assert json_specs == specs


def test_import_creates_and_updates(registry: Registry):
    doc = {"format": "rlregistry-dictionary", "definitions": [{
        "name": "format_reward", "display_name": "Format reward", "layer": "objective", "quantity": "reward",
        "averaging": "sequence", "smoothing_window": 50,
        "aliases": [{"framework": "custom", "key": "rewards/format"}],
    }]}
    with registry.transaction() as s:
        assert import_definitions(s, parse_document(yaml.safe_dump(doc)), author="t").created == ["format_reward"]
    doc["definitions"][0]["smoothing_window"] = 80
    with registry.transaction() as s:
        assert import_definitions(s, parse_document(yaml.safe_dump(doc)), author="t").updated == ["format_reward"]
    result = registry.register_arrays("r", {"rewards/format": ([1], [1.0])}, framework="custom")
    assert result.mapped == {"rewards/format": "format_reward"}


@pytest.mark.parametrize("mutation, message", [
    ({"layer": "middle"}, "layer must be one of"),
    ({"kl_estimator": "k4"}, "kl_estimator must be one of"),
    ({"healthy_range": {"low": 2, "high": 1}}, "above high"),
    ({"smoothing_window": 0}, "smoothing_window"),
    ({"aliases": [{"framework": "keras", "key": "x"}]}, "framework must be one of"),
    ({"surprise": 1}, "unknown field"),
])
def test_invalid_definitions_are_rejected(mutation, message):
    item = {"name": "x", "layer": "objective", "quantity": "reward", **mutation}
    with pytest.raises(InputError, match=message):
        parse_document(yaml.safe_dump({"definitions": [item]}), "team.yaml")


def test_alias_owned_by_another_definition_is_refused(registry: Registry):
    with registry.read() as s:
        doc = export_document(s)
    taken = doc["definitions"][0]["aliases"][0]
    spec = {"name": "thief", "layer": "diagnostic", "quantity": "other", "aliases": [taken]}
    with registry.transaction() as s, pytest.raises(DefinitionError, match="already belongs to"):
        import_definitions(s, parse_document(yaml.safe_dump({"definitions": [spec]})), author="t")


def test_malformed_yaml_names_the_position():
    with pytest.raises(InputError, match=r"team.yaml, line \d+"):
        parse_document("definitions:\n  - name: [unclosed\n", "team.yaml")
