"""The cached launch path (``titan_delta_kernels._launch``) on the CPU, with a stand-in for a Triton kernel.

What is checked here is the bookkeeping: which calls may reuse a compiled kernel (same keywords, same
Triton specialisation of every runtime argument) and which must go through Triton again, and that a
reused kernel gets its arguments in the kernel's parameter order. That the compiled launcher then runs
the right code is a GPU test (``test_launch_cache_gpu.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from titan_delta_kernels import _launch

pytestmark = pytest.mark.skipif(_launch.native_specialize_impl is None, reason="Triton without native binder")


@dataclass
class _Param:
    name: str
    is_constexpr: bool
    is_const: bool = False
    do_not_specialize: bool = False
    do_not_specialize_on_alignment: bool = False
    annotation_type: str = ""


@dataclass
class _Compiled:
    calls: list = field(default_factory=list)
    function: int = 7
    packed_metadata: tuple = ("meta",)

    def run(self, *args):
        self.calls.append(args)


class _FakeKernel:
    """Parameters (x, n, BLOCK: constexpr, FLAG: constexpr); ``kernel[grid](...)`` is Triton's path."""

    def __init__(self, params=None):
        from triton.backends.compiler import BaseBackend

        self.params = params or [_Param("x", False), _Param("n", False), _Param("BLOCK", True),
                                 _Param("FLAG", True)]  # fmt: skip
        self.pre_run_hooks = []
        self.slow_calls: list = []
        self.compiled: list[_Compiled] = []
        names = [p.name for p in self.params]

        def binder(*args, num_warps=4, num_stages=2, **kwargs):
            bound = dict(zip(names, args, strict=False))
            bound.update({name: kwargs[name] for name in names[len(args):]})
            return bound, None, {"num_warps": num_warps, "num_stages": num_stages}

        self.device_caches = {0: (None, None, None, BaseBackend, binder)}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.slow_calls.append((grid, args, kwargs))
            self.compiled.append(_Compiled())
            return self.compiled[-1]

        return run


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    previous = _launch.set_enabled(True)
    yield
    _launch.set_enabled(previous)


def _aligned(n: int = 64) -> torch.Tensor:
    buf = torch.empty(n + 16, dtype=torch.float32)
    offset = (-buf.data_ptr() % 16) // 4
    return buf[offset:offset + n]


def test_second_identical_call_reuses_the_compiled_kernel_with_arguments_in_parameter_order(fake_cuda):
    kernel, x = _FakeKernel(), _aligned()
    _launch.launch(kernel, (3,), x, 32, BLOCK=16, FLAG=True, num_warps=4)
    assert len(kernel.slow_calls) == 1
    _launch.launch(kernel, (5, 2), x, 32, BLOCK=16, FLAG=True, num_warps=4)
    assert len(kernel.slow_calls) == 1, "an identical launch went through Triton again"
    (call,) = kernel.compiled[0].calls
    assert call[:4] == (5, 2, 1, 1234)  # grid padded to 3-D, the current stream
    assert call[4:9] == (7, ("meta",), None, None, None)
    assert call[9] is x and call[10:] == (32, 16, True)


@pytest.mark.parametrize("change", ["int_divisibility", "int_one", "misaligned_pointer", "dtype", "constexpr",
                                    "launch_option"])  # fmt: skip
def test_anything_triton_specialises_on_forces_triton_again(fake_cuda, change):
    kernel, x = _FakeKernel(), _aligned()
    args, kwargs = (x, 32), dict(BLOCK=16, FLAG=True, num_warps=4)
    _launch.launch(kernel, (1,), *args, **kwargs)
    if change == "int_divisibility":
        args = (x, 33)
    elif change == "int_one":
        args = (x, 1)
    elif change == "misaligned_pointer":
        args = (x[1:], 32)
    elif change == "dtype":
        args = (x.to(torch.float16), 32)
    elif change == "constexpr":
        kwargs = dict(kwargs, BLOCK=32)
    else:
        kwargs = dict(kwargs, num_warps=8)
    _launch.launch(kernel, (1,), *args, **kwargs)
    assert len(kernel.slow_calls) == 2, f"{change}: reused a kernel compiled for other arguments"
    assert not kernel.compiled[0].calls
    _launch.launch(kernel, (1,), *args, **kwargs)  # and that specialisation is remembered in turn
    assert len(kernel.slow_calls) == 2 and len(kernel.compiled[1].calls) == 1


def test_same_specialisation_with_other_values_reuses(fake_cuda):
    kernel = _FakeKernel()
    _launch.launch(kernel, (1,), _aligned(), 32, BLOCK=16, FLAG=False)
    _launch.launch(kernel, (1,), _aligned(128), 48, BLOCK=16, FLAG=False)  # other buffer, also 16-aligned
    assert len(kernel.slow_calls) == 1 and len(kernel.compiled[0].calls) == 1
    assert kernel.compiled[0].calls[0][10] == 48


def test_runtime_argument_by_keyword_or_constexpr_first_kernel_always_takes_triton(fake_cuda):
    kernel, x = _FakeKernel(), _aligned()
    for _ in range(2):
        _launch.launch(kernel, (1,), x, n=32, BLOCK=16, FLAG=True)
    assert len(kernel.slow_calls) == 2
    mixed = _FakeKernel([_Param("BLOCK", True), _Param("x", False)])
    for _ in range(2):
        _launch.launch(mixed, (1,), BLOCK=16, x=x)
    assert len(mixed.slow_calls) == 2


def test_disabled_or_without_cuda_takes_triton(fake_cuda, monkeypatch):
    kernel, x = _FakeKernel(), _aligned()
    _launch.set_enabled(False)
    for _ in range(2):
        _launch.launch(kernel, (1,), x, 32, BLOCK=16, FLAG=True)
    assert len(kernel.slow_calls) == 2
    _launch.set_enabled(True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for _ in range(2):
        _launch.launch(kernel, (1,), x, 32, BLOCK=16, FLAG=True)
    assert len(kernel.slow_calls) == 4


def test_installed_launch_hook_takes_triton(fake_cuda, monkeypatch):
    if _launch._knobs is None:
        pytest.skip("Triton without knobs")
    kernel, x = _FakeKernel(), _aligned()
    _launch.launch(kernel, (1,), x, 32, BLOCK=16, FLAG=True)
    hook = _launch._knobs.runtime.launch_enter_hook
    if not hasattr(hook, "add"):
        pytest.skip("this Triton's launch hook is not a hook chain")
    hook.add(print)
    try:
        _launch.launch(kernel, (1,), x, 32, BLOCK=16, FLAG=True)
    finally:
        hook.remove(print)
    assert len(kernel.slow_calls) == 2
