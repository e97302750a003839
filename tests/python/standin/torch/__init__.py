"""A stand-in for PyTorch in the compat tests (Debian's CPU-only python3-torch has no CUDA to
select): ``torch.cuda`` with one device per entry of CUDA_VISIBLE_DEVICES (as read at import,
like CUDA does at initialisation; 4 if unset), which records every call.

``torch.cuda.calls`` lists ("set_device", n), ("zeros", device), ...; each call is also
appended as a JSON line to the file named by STANDIN_TORCH_LOG, for child processes. The
environment seen at import is in ``torch.cuda.visible_at_import``.
"""

import json
import os

IS_STANDIN = True


class _Cuda:
    def __init__(self):
        self.calls = []
        self.visible_at_import = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.order_at_import = os.environ.get("CUDA_DEVICE_ORDER")
        if self.visible_at_import is None:
            self._count = 4
        else:
            self._count = len([e for e in self.visible_at_import.split(",") if e.strip()])
        self._current = 0
        self._initialized = False

    def _record(self, *call):
        self.calls.append(call)
        log = os.environ.get("STANDIN_TORCH_LOG")
        if log:
            with open(log, "a") as f:
                f.write(json.dumps(list(call)) + "\n")

    def is_available(self):
        return self._count > 0

    def is_initialized(self):
        return self._initialized

    def device_count(self):
        return self._count

    def current_device(self):
        self._initialized = True
        return self._current

    def set_per_process_memory_fraction(self, fraction, device=None):
        self._initialized = True
        self._record("set_per_process_memory_fraction", float(fraction), int(device or 0))

    def set_device(self, device):
        if not 0 <= int(device) < self._count:
            raise RuntimeError("CUDA error: invalid device ordinal %s" % device)
        self._initialized = True
        self._current = int(device)
        self._record("set_device", int(device))


cuda = _Cuda()


def zeros(shape, device=None):
    """Records the device a placeholder tensor is made on."""
    cuda._initialized = True
    cuda._record("zeros", str(device))
    return ("tensor", str(device))
