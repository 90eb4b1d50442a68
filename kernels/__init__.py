"""Triton kernels of titan-delta, imported as ``titan_delta_kernels``.

Each op folder holds its chunked forward/backward kernels and, where it has one, a recurrent decode
kernel; the pure-PyTorch oracle of every kernel lives in ``titan_delta.ops``.
"""
