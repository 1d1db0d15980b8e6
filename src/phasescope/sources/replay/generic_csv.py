"""CSV GPU logs written by people's own scripts (format `csv`): `power_W`, `gpu_util`, `temperature_C`,
`gpu_index`, `timestamp`/`time`/`epoch` ... in any order, with units in the header (`[W]`, `(MiB)`, `_mW`),
in the values (`41%`) or not at all.

Read by the nvidia-smi CSV reader's code (`nvidia_smi_csv.read_log`): one parser, two names, so that a file
is called what it is. Which header spellings mean which signal, and the units: `phasescope.signal_names`.
Reading says in one line which column became what and which were ignored.

Options as `nvidia-smi-csv`: `columns=`, `gpus=N`, `interval=S`.
"""

from __future__ import annotations

from phasescope.schema import Trace
from phasescope.sources.replay import nvidia_smi_csv
from phasescope.sources.replay._common import Options, PathLike, guarded

NAME = "csv"
OPTIONS = nvidia_smi_csv.OPTIONS


def sniff(path: PathLike) -> bool:
    return nvidia_smi_csv.sniff_own(path)


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    return nvidia_smi_csv.read_log(path, options, NAME)
