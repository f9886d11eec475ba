"""torchrun (python3 -m torch.distributed.run) as this machine's PyTorch has it, with one fix
where Debian 12's needs it: PyTorch 1.13's elastic launcher reads `--redirects`/`--tee` with
Std.from_str, which under Python 3.11's enum finds no Std for "0" and returns None, so torchrun
fails before it starts a process. The fix gives from_str Std(int) for a single value; nothing
else of torchrun changes, and on a PyTorch whose torchrun works (Debian 13's 2.6) nothing is
patched.

  python3 bench/torchrun.py --nproc_per_node 2 script.py ARGS...
"""

import re

from torch.distributed.elastic.multiprocessing import api

if api.Std.from_str("0") is None:
    _original = api.Std.from_str.__func__

    def _from_str(cls, vm):
        if re.match(api._VALUE_REGEX, vm):
            return cls(int(vm))
        return _original(cls, vm)

    api.Std.from_str = classmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    main()
