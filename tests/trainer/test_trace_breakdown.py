"""tools/bench/trace_breakdown.py on a hand-made trace: busy, exposed collectives, idle, host syncs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench" / "trace_breakdown.py"


def _event(name: str, cat: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}


def test_breakdown_of_a_hand_made_step(tmp_path: Path) -> None:
    ms = 1000.0  # trace times are microseconds
    events = [
        _event("ProfilerStep#9", "cpu_op", -50 * ms, 40 * ms),  # an earlier step: not counted
        _event("ProfilerStep#10", "cpu_op", 0, 100 * ms),
        _event("sm90_xmma_gemm_bf16", "kernel", 0, 40 * ms),
        _event("triton_poi_fused_mul_0", "kernel", 60 * ms, 10 * ms),
        _event("ncclDevKernel_ReduceScatter_Sum_bf16", "kernel", 30 * ms, 20 * ms),  # 10 ms beside the GEMM
        _event("Memcpy DtoH", "gpu_memcpy", 80 * ms, 5 * ms),
        _event("cudaStreamSynchronize", "cuda_runtime", 70 * ms, 4 * ms),
        _event("cudaMemcpy", "cuda_runtime", 90 * ms, 1 * ms),
        _event("cudaLaunchKernel", "cuda_runtime", 1 * ms, 0.01 * ms),
    ]
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    out = subprocess.run(
        [sys.executable, str(TOOL), str(trace)], capture_output=True, text=True, check=True
    ).stdout
    row = next(line for line in out.splitlines() if line.startswith(f"| {trace}"))
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    # step, busy (0-50, 60-70, 80-85), compute, collectives, exposed, idle, syncs, sync ms
    assert cells == ["100.0", "65.0", "50.0", "20.0", "10.0", "35.0", "2", "5.0"], out
    assert "gemm 40.0 ms" in out and "nccl ReduceScatter 20.0 ms" in out


def test_a_trace_without_a_profiled_step_is_one_clear_error(tmp_path: Path) -> None:
    trace = tmp_path / "empty.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    proc = subprocess.run([sys.executable, str(TOOL), str(trace)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == f"trace_breakdown.py: {trace}: no ProfilerStep# span in the trace (was it "
        "written by the trainer's profiler?)"
    )


def test_components_split_kernel_time_by_model_part(tmp_path: Path) -> None:
    ms = 1000.0

    def launched(name: str, ts: float, dur: float, ext: int) -> dict:
        return {**_event(name, "kernel", ts, dur), "args": {"External id": ext}}

    def op(name: str, ext: int, dims: list[list[int]]) -> dict:
        return {**_event(name, "cpu_op", 0, 1), "args": {"External id": ext, "Input Dims": dims}}

    events = [
        _event("ProfilerStep#3", "cpu_op", 0, 100 * ms),
        op("aten::mm", 1, [[4096, 1024], [1024, 2816]]),  # MLP up
        op("aten::mm", 2, [[4096, 1024], [1024, 16384]]),  # LM head
        op("aten::mm", 3, [[4096, 1024], [1024, 3072]]),  # q/k/v projection
        launched("nvjet_tst_128x256_h_bz_coopA_NTT", 0, 10 * ms, 1),
        launched("sm90_xmma_gemm_bf16bf16_bf16f32", 10 * ms, 20 * ms, 2),
        launched("nvjet_tst_64x8_h_bz_TNT", 30 * ms, 5 * ms, 3),
        launched("_superblock_wave_kernel", 35 * ms, 15 * ms, 4),
        launched("triton_red_fused__log_softmax_nll_loss_forward_3", 50 * ms, 4 * ms, 5),
        launched("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_1", 54 * ms, 6 * ms, 6),
        launched("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdam>", 60 * ms,
                 8 * ms, 7),
        launched("sm90_xmma_fprop_implicit_gemm_conv1d", 68 * ms, 2 * ms, 8),
        launched("short_conv_bwd_kernel", 71 * ms, 3 * ms, 10),  # the project's conv is not the mixer op
        # cuDNN SDPA backward helpers belong to attention, not to the conv or "other"
        launched("void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*)", 70 * ms, 1 * ms, 9),
    ]
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    out = subprocess.run(
        [sys.executable, str(TOOL), str(trace), "--components", "2816,16384", "--kernels", "2"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "the 2 kernels with the most GPU time" in out
    listed = [line.split() for line in out.splitlines() if line.startswith("  ") and " ms " in line]
    assert [(row[0], row[2], row[3]) for row in listed] == [
        ("20.00", "1x", "sm90_xmma_gemm_bf16bf16_bf16f32"), ("15.00", "1x", "_superblock_wave_kernel")
    ]
    row = out.strip().splitlines()[-1]
    cells = [c.strip().split(" ms")[0] for c in row.strip("|").split("|")][1:]
    # mixer op, projections, MLP, LM head, conv, loss, optimizer, elementwise, other, idle (100 - 74 ms)
    assert cells == ["16.0", "5.0", "10.0", "20.0", "5.0", "4.0", "8.0", "6.0", "0.0", "26.0"], out


def test_components_wants_two_sizes(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    proc = subprocess.run([sys.executable, str(TOOL), str(trace), "--components", "2816"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--components: expected FFN_HIDDEN,VOCAB" in proc.stderr


def test_idle_is_split_into_host_bound_and_device_side_gaps(tmp_path: Path) -> None:
    ms = 1000.0

    def kernel(name: str, ts: float, dur: float, corr: int) -> dict:
        return {**_event(name, "kernel", ts, dur), "args": {"correlation": corr}}

    def launch(ts: float, corr: int) -> dict:
        return {**_event("cudaLaunchKernel", "cuda_runtime", ts, 0.01 * ms), "tid": 7,
                "args": {"correlation": corr}}  # fmt: skip

    events = [
        _event("ProfilerStep#4", "cpu_op", 0, 100 * ms),
        {**_event("titan_delta::gdp_chunk_fwd", "cpu_op", 25 * ms, 6 * ms), "tid": 7},
        {**_event("aten::mm", "cpu_op", 5 * ms, 10 * ms), "tid": 7},
        kernel("a_kernel", 0, 20 * ms, 1), launch(0, 1),
        kernel("b_kernel", 30 * ms, 20 * ms, 2), launch(29 * ms, 2),  # launched after the GPU ran dry
        kernel("c_kernel", 52 * ms, 8 * ms, 3), launch(10 * ms, 3),  # launched early: a device-side gap
        {**_event("cudaStreamSynchronize", "cuda_runtime", 60 * ms, 10 * ms), "tid": 7},
        kernel("d_kernel", 75 * ms, 5 * ms, 4), launch(74 * ms, 4),  # after the sync
    ]
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    out = subprocess.run(
        [sys.executable, str(TOOL), str(trace), "--idle", "5"], capture_output=True, text=True, check=True
    ).stdout
    summary = "GPU idle 47.0 ms = waiting on the host 45.0 ms (2 gaps; 15.0 ms after host syncs)"
    assert f"{summary} + device-side 2.0 ms" in out, out
    lines = out.splitlines()
    listed = lines[lines.index(next(x for x in lines if "waiting on the host" in x)) + 1 :]
    assert listed[0].split() == ["20.00", "ms", "(step", "end:", "the", "host", "after", "the", "last", "GPU",
                                 "work)"]  # fmt: skip
    assert listed[1].split() == ["10.00", "ms", "titan_delta::gdp_chunk_fwd"]
