"""Put on PYTHONPATH by the 1-process ZeRO-2 test (tests/launch/test_cmd_launch.py): every Python
process of that run (accelerate's launcher and the training process) starts DeepSpeed's
``TorchBackend`` without its shared-memory all-reduce op (``deepspeed.comm.torch.build_shm_op``
returns None). DeepSpeed would otherwise JIT-compile that C++ op (``deepspeed_shm_comm``, about 3
min on 2 cores) in every fresh checkout; with one process there is no peer to reduce with, and
without the op DeepSpeed sends every collective to ``torch.distributed`` (gloo), its documented
fallback (deepspeed/comm/torch.py: ``if self.shm_comm_op != None`` ... else torch.distributed)."""
import importlib.abc
import importlib.machinery
import sys


class _NoShmOp(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "deepspeed.comm.torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.build_shm_op = lambda: None

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _NoShmOp())
