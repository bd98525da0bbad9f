"""The JSON Schema of docs/corpus.json (issue 20 owns it; the measurement, tuning and apply issues add
fields: fidelity_ncu, record_overhead/record_added_s, tune_configs_per_s, gpu_busy, per-kernel tune,
apply). Extra properties are allowed everywhere so a later stage can add its own; the fields named here
must be present with these types (null = the stage has not run for that app yet)."""

from __future__ import annotations

from typing import Any, Dict

NUM = {"type": ["number", "null"]}
INT = {"type": ["integer", "null"]}
BOOL = {"type": ["boolean", "null"]}
STR = {"type": ["string", "null"]}
NUMS = {"type": "array", "items": {"type": "number"}}

STAGE_STAMP = {"type": "object", "required": ["commit", "date"],
               "properties": {"commit": {"type": "string"}, "date": {"type": "string"}}}

INSTANCE = {
    "type": "object", "required": ["id"],
    "properties": {"id": {"type": "string"}, "grid": STR, "block": STR, "in_app_ns": NUM, "occurrences": INT,
                   "replay_ns": NUM, "status": STR, "fidelity": NUM, "ncu_ns": NUM, "fidelity_ncu": NUM},
}

TUNE = {
    "type": "object",
    "properties": {"instance": STR, "trials": INT, "trials_requested": INT, "verified_fraction": NUM,
                   "best_speedup": NUM, "best_config": {"type": ["object", "null"]},
                   "best_changes": {"type": ["object", "null"]}, "gain_from": STR, "gain_from_factor": NUM,
                   "failure_reasons": {"type": ["array", "null"], "items": {
                       "type": "object", "required": ["status", "count", "reason"],
                       "properties": {"status": {"type": "string"}, "count": {"type": "integer"},
                                      "reason": {"type": "string"}}}},
                   "traffic": {"type": ["object", "null"], "properties": {"bytes_moved": INT, "read_bytes": INT,
                                                                         "written_bytes": INT}},
                   "tune_configs_per_s": NUM, "gpu_busy": NUM, "space": STR, "error": STR},
}

KERNEL = {
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string"}, "demangled": STR, "static_hash": STR, "has_ir": BOOL,
                   "replayable": BOOL, "not_replayable_reason": STR, "launches": INT, "instances_recorded": INT,
                   "in_app_ns": NUM, "total_in_app_ns": NUM, "verified": BOOL, "ncu_ns": NUM,
                   "instances": {"type": "array", "items": INSTANCE}, "tune": {"oneOf": [TUNE, {"type": "null"}]}},
}

APPLY = {
    "type": "object",
    "properties": {"kernels_applied": INT, "app_ok": BOOL, "wall_speedup": NUM,
                   "kernels": {"type": "array", "items": {"type": "object", "required": ["kernel"],
                                                          "properties": {"kernel": {"type": "string"},
                                                                         "predicted": NUM, "realized": NUM}}}},
}

APP = {
    "type": "object",
    "required": ["name", "built_unmodified", "build_error", "recorded", "app_ok_plain", "app_ok_recorded",
                 "kernels_recorded", "kernels_replayable", "kernels_verified", "not_replayable", "record_overhead",
                 "fidelity", "tune_verified_fraction", "best_speedup", "kernels", "stages"],
    "properties": {
        "name": {"type": "string"}, "built_unmodified": BOOL, "build_error": STR, "recorded": BOOL,
        "app_ok_plain": BOOL, "app_ok_recorded": BOOL, "kernels_recorded": INT, "kernels_replayable": INT,
        "kernels_verified": INT, "not_replayable": {"type": "object", "additionalProperties": {"type": "string"}},
        "record_overhead": NUM, "record_added_s": NUM, "fidelity": NUMS, "fidelity_ncu": NUMS,
        "tune_verified_fraction": NUM, "best_speedup": NUM, "tune_configs_per_s": NUM, "gpu_busy": NUM,
        "kernels": {"type": "array", "items": KERNEL}, "apply": {"oneOf": [APPLY, {"type": "null"}]},
        "stages": {"type": "object", "additionalProperties": STAGE_STAMP},
    },
}

CORPUS: Dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "mneme corpus campaign results (docs/corpus.json)",
    "type": "object", "required": ["gpu", "driver", "apps"],
    "properties": {"gpu": STR, "driver": STR, "summary": {"type": "string"},
                   "apps": {"type": "array", "items": APP}},
}


def validate(doc: Dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError (with the failing path) when doc is not a valid corpus.json."""
    import jsonschema

    jsonschema.Draft202012Validator(CORPUS).validate(doc)
