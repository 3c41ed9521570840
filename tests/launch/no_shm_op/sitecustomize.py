"""Put on PYTHONPATH by the DeepSpeed launch tests (tests/launch/test_cmd_launch.py, test_zero3.py):
every Python process of those runs (accelerate's launcher and the training processes) starts
DeepSpeed's ``TorchBackend`` without its shared-memory all-reduce op
(``deepspeed.comm.torch.build_shm_op`` returns None). DeepSpeed would otherwise JIT-compile that C++
op (``deepspeed_shm_comm``, 1.5-3 min on 2 cores) in every fresh checkout. Training does not use
it: in ``deepspeed/comm/torch.py`` only ``inference_all_reduce`` (tensor-parallel inference) calls
the op, and every ZeRO collective (all-gather, reduce-scatter, all-reduce) goes to
``torch.distributed`` (gloo) either way."""
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
