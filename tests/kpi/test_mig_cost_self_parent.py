"""A device named as its own MIG parent (damaged metadata) is not a MIG GPU: it keeps its whole price."""

from phasescope.kpi.cost import Prices, mig_prices
from phasescope.schema import DeviceInfo


def test_a_device_that_is_its_own_parent_keeps_its_whole_price() -> None:
    # Before: it counted as its own only instance (1/1 of the GPU-hour), then as the parent paying the
    # unassigned rest, 0: a whole GPU priced at $0 per hour, with a note saying so.
    gpu = DeviceInfo("GPU-a", "NVIDIA A100-SXM4-40GB", 0, parent_uuid="GPU-a")
    prices, notes = mig_prices({"GPU-a": Prices(4.0, 0.2)}, [gpu])
    assert prices == {"GPU-a": Prices(4.0, 0.2)}
    assert notes == {}
