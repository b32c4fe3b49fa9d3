"""Run diagnosis: detectors over canonical curves, health baselines, joint readings.

Public API::

    from registry.analysis.diagnosis import Curve, MetricInfo, diagnose, build_baseline
    diag = diagnose({"kl_old_mean": Curve(steps, values), ...}, {"kl_old_mean": MetricInfo(...)},
                    baseline=None, checkpoints=[10000, 20000])
    for f in diag.findings: print(f.summary())
    json.dumps(diag.to_dict())

Every tunable is in :class:`DiagnosisSettings`; the detector -> canonical metric table is
:data:`METRIC_ROLES`.
"""
from registry.analysis.diagnosis.baseline import BaselineProfile, MetricBaseline, PhaseBand, build_baseline
from registry.analysis.diagnosis.detectors import DETECTOR_IDS
from registry.analysis.diagnosis.dictionary import metric_infos_from_definitions
from registry.analysis.diagnosis.engine import check_baseline, diagnose, joint_readings
from registry.analysis.diagnosis.settings import DEFAULT_SETTINGS, METRIC_ROLES, DiagnosisSettings
from registry.analysis.diagnosis.types import Curve, Diagnosis, Finding, JointReading, MetricInfo, TriageStep

__all__ = [
    "BaselineProfile", "Curve", "DEFAULT_SETTINGS", "DETECTOR_IDS", "Diagnosis", "DiagnosisSettings", "Finding",
    "JointReading", "METRIC_ROLES", "MetricBaseline", "MetricInfo", "PhaseBand", "TriageStep", "build_baseline",
    "check_baseline", "diagnose", "joint_readings", "metric_infos_from_definitions",
]
