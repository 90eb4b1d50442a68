"""Package discovery only (metadata is in pyproject.toml).

The Triton kernels live in the top-level ``kernels/`` folder but must not import as a bare ``kernels``
(that name belongs to Hugging Face's ``kernels`` package), so the folder is mapped to
``titan_delta_kernels``.
"""

from setuptools import find_packages, setup

kernel_packages = ["titan_delta_kernels"] + [
    f"titan_delta_kernels.{name}" for name in find_packages("kernels")
]

setup(
    packages=find_packages(include=["titan_delta", "titan_delta.*"]) + kernel_packages,
    package_dir={"titan_delta_kernels": "kernels"},
    package_data={"titan_delta": ["assets/*", "assets/**/*", "eval/tasks/*"]},
)
