"""Times launch-table variants of the chunked Gated DeltaProduct op at one shape, each checked against the
shipped launch table's result.

    python tools/bench/gdp_launch_sweep.py --shape 16x2048x4x128x256x2 \\
        --variants "state_bwd_block_v=64; grad_block_v=128; grad_warps=8,wy_bwd_stages=2"

A variant overrides fields of ``GdpLaunch`` (``kernels/gated_delta_product/launch_table.py``) in the row the
shape selects; ``;`` separates variants, ``,`` the fields of one. The shipped row runs first and again last
(the drift between the two is the noise floor). Per variant, on inputs of its own: the median fwd+bwd time
(``triton.testing.do_bench``), its ratio to the shipped row's first time, the largest relative RMS
difference of o and the five input gradients from the shipped row's (infinite where a value is not
finite), and each kernel's time in one profiled step. A variant that fails to compile or launch is reported
with its error, and the sweep goes on.

The default shape is the 340M gated_deltaproduct's op (``--shape BxTxHxKxVxNH``): local batch 16 × 2048,
4 heads, K = 128, V = 256, n_h = 2. Under the CPU interpreter (``TRITON_INTERPRET=1``) it checks the
variants and times one call with a wall clock (the numbers mean nothing there; the tests use it).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gated_delta_product import kernel_times, make_inputs

from titan_delta.testing import rel_rms_error
from titan_delta_kernels.gated_delta_product import chunk as chunk_module
from titan_delta_kernels.gated_delta_product.api import gated_delta_product_triton
from titan_delta_kernels.gated_delta_product.launch_table import GdpLaunch

FIELDS = {f.name: f.type for f in dataclasses.fields(GdpLaunch)}
SHIPPED_LAUNCH_TABLE = chunk_module.launch_table


def parse_value(field: str, text: str) -> object:
    """A field's value from its text, by the field's declared type (bool, int, int | None, str)."""
    kind, text = FIELDS[field], text.strip()
    if kind == "bool":
        if text.lower() not in ("true", "false"):
            raise ValueError(f"{field} takes true or false, got {text!r}")
        return text.lower() == "true"
    if kind.startswith("int"):
        if "None" in kind and text.lower() == "none":
            return None
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{field} takes an integer, got {text!r}") from None
    return text


def parse_variants(text: str) -> list[dict[str, object]]:
    """``"a=1,b=2; c=3"`` -> [{"a": 1, "b": 2}, {"c": 3}]; a ValueError naming an unknown field or value."""
    variants = []
    for chunk in (c.strip() for c in text.split(";")):
        if not chunk:
            continue
        overrides = {}
        for item in chunk.split(","):
            field, sep, value = item.partition("=")
            field = field.strip()
            if not sep:
                raise ValueError(f"expected FIELD=VALUE, got {item.strip()!r}")
            if field not in FIELDS:
                raise ValueError(f"unknown launch field {field!r}; fields: {', '.join(FIELDS)}")
            overrides[field] = parse_value(field, value)
        variants.append(overrides)
    return variants


def parse_shape(text: str) -> tuple[int, int, int, int, int, int]:
    parts = text.split("x")
    if len(parts) != 6 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--shape: expected BxTxHxKxVxNH of positive integers, got {text!r}")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def use_launch(overrides: dict[str, object]) -> None:
    """Makes the op take the shipped row with ``overrides`` applied (the op reads ``chunk.launch_table``)."""
    chunk_module.launch_table = lambda *a: dataclasses.replace(SHIPPED_LAUNCH_TABLE(*a), **overrides)


def step(inputs: list[torch.Tensor], d_out: torch.Tensor, n_h: int) -> list[torch.Tensor]:
    """One forward+backward: o and the gradients of q, k, v, g, β."""
    for x in inputs:
        x.grad = None
    o, _ = gated_delta_product_triton(*inputs, num_householder=n_h)
    o.backward(d_out)
    return [o.detach().clone(), *(x.grad.clone() for x in inputs)]


def fwd_bwd_ms(inputs: list[torch.Tensor], d_out: torch.Tensor, n_h: int) -> float:
    def run() -> None:
        gated_delta_product_triton(*inputs, num_householder=n_h)[0].backward(d_out)

    if not torch.cuda.is_available():
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1e3
    from triton.testing import do_bench

    return do_bench(run, warmup=25, rep=100, grad_to_none=inputs, return_mode="median")


def label(overrides: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "shipped"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="16x2048x4x128x256x2", help="BxTxHxKxVxNH")
    parser.add_argument("--variants", required=True, help="FIELD=VALUE[,FIELD=VALUE][; ...]")
    parser.add_argument("--tolerance", type=float, default=2e-2,
                        help="largest relative RMS difference from the shipped row that counts as correct")
    args = parser.parse_args(argv)
    try:
        B, T, H, K, V, n_h = parse_shape(args.shape)
        variants = parse_variants(args.variants)
    except ValueError as err:
        print(f"gdp_launch_sweep.py: {err}", file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (interpreter)"
    print(f"# {name}, torch {torch.__version__}, bf16, shape [B,T,H,K,V] = [{B},{T},{H},{K},{V}], n_h {n_h}")
    print("| variant | fwd+bwd ms | × shipped | max rel RMS vs shipped | kernels (ms per step) |")
    print("|---|---:|---:|---:|---|")
    base_ms = None
    for index, overrides in enumerate([{}, *variants, {}]):
        # Fresh inputs per variant, and the variant before the shipped row: an output element a variant
        # leaves unwritten then holds another input's values (freed memory is reused), never the right one.
        torch.manual_seed(index)
        inputs = make_inputs(B, T, H, K, n_h, device, V=V)
        d_out = torch.randn(B, T, H, V, device=device, dtype=torch.bfloat16)
        use_launch(overrides)
        try:
            result = step(inputs, d_out, n_h)
            use_launch({})
            error = max(rel_rms_error(a, b) for a, b in zip(result, step(inputs, d_out, n_h), strict=True))
            use_launch(overrides)
            ms = fwd_bwd_ms(inputs, d_out, n_h)
            kernels = kernel_times(
                lambda *x: gated_delta_product_triton(*x, num_householder=n_h), inputs, d_out, 3
            ) if device == "cuda" else []  # fmt: skip
        except Exception as err:  # a variant that does not compile or launch: report it, go on
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            print(f"| {label(overrides)} | failed: {first[:160]} | | | |", flush=True)
            continue
        finally:
            use_launch({})
        base_ms = ms if base_ms is None else base_ms
        flag = "" if error <= args.tolerance else " (WRONG)"
        stages = ", ".join(f"{n.removesuffix('_kernel')} {t:.3f}" for n, t, _ in kernels[:7])
        print(f"| {label(overrides)} | {ms:.3f} | {ms / base_ms:.3f} | {error:.2e}{flag} | {stages} |",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
