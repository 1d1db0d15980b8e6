"""Pod attribution: a pod-info series that names no device is dropped, not filed under an empty device key
(a mutation audit found this untested)."""

from __future__ import annotations

from phasescope.fleet import attribution


def test_pod_info_naming_no_device_is_dropped() -> None:
    got = attribution.from_label_sets(
        [
            {"__name__": attribution.POD_INFO, "uuid": "GPU-a", "pod": "train-0", "namespace": "ml"},
            {"__name__": attribution.POD_INFO, "uuid": "", "pod": "stray", "namespace": "other"},
        ]
    )
    assert got == {"GPU-a": {"pod": "train-0", "namespace": "ml"}}
