"""Writes where the ranks' store is, as this rank was told (TORCHELASTIC_USE_AGENT_STORE: "True"
when rank 0's host serves it, "unset" when rank 0's program is to), to
$OUT/<job>-rank<RANK>.txt. It needs no torch."""

import os

out = os.path.join(os.environ["OUT"], f"{os.environ['TRAINYARD_JOB_ID']}-rank{os.environ['RANK']}")
with open(out + ".tmp", "w") as f:
    f.write(os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "unset"))
os.rename(out + ".tmp", out + ".txt")
