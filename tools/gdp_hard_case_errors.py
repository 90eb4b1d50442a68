"""Errors of Gated DeltaProduct variants against the fp64 recurrent oracle on the hard bf16 case (GPU).

The inputs of ``test_gpu_series_no_less_accurate_than_substitution_on_nearly_repeated_keys``
(``nearly_repeated_key_inputs``, seeded here): keys close to one direction, β in (1.9, 1.99), gates in
(-1e-3, 0), [1, 512, 4, 128], bf16. One line per (n_h, draw, variant) with the relative RMS error of o, the
final state and every gradient, so a change in accuracy can be traced to the flag that brings it (the series
transform, w16, lowp_safe, ...). Run on a GPU:

    python3 tools/gdp_hard_case_errors.py --nh 1,2 --draws 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' input and gradient helpers
from tests.kernels.test_gated_delta_product_fast import variant_kernel
from tests.kernels.test_gated_delta_product_series import nearly_repeated_key_inputs
from tests.kernels.test_gated_delta_product_triton import run_with_grads
from titan_delta.ops.gated_delta_product.reference import gated_delta_product_recurrent
from titan_delta.testing import rel_rms_error

SUBSTITUTION = "save_states+fastwy+bf16x3+kslice"  # the default before the series transform
VARIANTS = [SUBSTITUTION] + [SUBSTITUTION + "+wyseries" + extra for extra in ("", "+dkp16", "+dkp16+w16",
                                                                          "+dkp16+lowp_safe")] + ["default"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nh", default="1,2", help="comma list of num_householder values")
    parser.add_argument("--draws", type=int, default=3, help="input draws (seeds 0..draws-1) per n_h")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma list of variant strings")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gdp_hard_case_errors.py needs a CUDA GPU (the Triton kernels run there)")
    for n_h in (int(x) for x in args.nh.split(",")):
        for seed in range(args.draws):
            torch.manual_seed(seed)
            inputs = nearly_repeated_key_inputs(n_h)
            d_out = torch.randn(*inputs["q"].shape[:3], 128, device="cuda", dtype=torch.float64)
            d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
            ref = run_with_grads(gated_delta_product_recurrent, inputs, n_h, None, d_out, d_final,
                                 torch.float64)  # fmt: skip
            for variant in args.variants.split(","):
                o, final, grads = run_with_grads(variant_kernel(variant), inputs, n_h, None, d_out, d_final)
                errors = {"o": rel_rms_error(o, ref[0]), "S": rel_rms_error(final, ref[1])}
                errors |= {f"d{name}": rel_rms_error(grads[name], ref[2][name]) for name in sorted(grads)}
                cells = " ".join(f"{name}={err:.2e}" for name, err in errors.items())
                print(f"n_h={n_h} seed={seed} {variant:45s} {cells}", flush=True)


if __name__ == "__main__":
    main()
