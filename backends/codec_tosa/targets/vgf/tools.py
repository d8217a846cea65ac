"""Where the ML SDK for Vulkan tools are, and the Vulkan environment that runs them.

The four pip wheels ship their binaries inside their Python packages (the
console scripts on PATH are Python wrappers around them), so they are located
through the packages themselves: no PATH or environment variable is needed,
and each missing piece is reported with the install line that provides it
(docs/DESIGN.md, "The VGF target").
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from codec_tosa.targets.vgf.errors import VgfToolMissing

SDK_VERSION = "0.11.0"
PIP_PACKAGES = {  # python package -> the wheel that provides it
    "model_converter": "ai-ml-sdk-model-converter",
    "vgf_lib": "ai-ml-sdk-vgf-library",
    "scenario_runner": "ai-ml-sdk-scenario-runner",
    "emulation_layer": "ai-ml-emulation-layer-for-vulkan",
}
APT_PACKAGES = "mesa-vulkan-drivers libvulkan1"
# Graph before Tensor: Debian's loader (1.3.239) stacks explicit layers in the
# order of their manifests, and the Graph layer needs VK_ARM_tensors from the
# Tensor layer beneath it ("requires extension: VK_ARM_tensors" otherwise).
LAYERS = ("VK_LAYER_ML_Graph_Emulation", "VK_LAYER_ML_Tensor_Emulation")
LAYER_MANIFESTS = ("VkLayer_Graph.json", "VkLayer_Tensor.json")
ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")


@dataclass(frozen=True)
class VgfTools:
    model_converter: Path
    vgf_dump: Path
    scenario_runner: Path
    layer_lib_dir: Path  # libVkLayer_{Graph,Tensor}.so
    layer_manifests: tuple[Path, ...]  # Graph first (see LAYERS)

    def vulkan_env(self, lavapipe_icd: Path) -> dict[str, str]:
        """The environment scenario_runner needs: the emulation layers over lavapipe.

        Built from a copy of os.environ, so the caller's process is untouched.
        The ICD is pinned to lavapipe (both the old and the new loader variable)
        so that results do not depend on which GPU driver a machine has.
        """
        env = dict(os.environ)
        previous = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = f"{self.layer_lib_dir}:{previous}" if previous else str(self.layer_lib_dir)
        env["VK_LAYER_PATH"] = ":".join(str(m) for m in self.layer_manifests)
        env["VK_INSTANCE_LAYERS"] = ":".join(LAYERS)
        env["VK_ICD_FILENAMES"] = env["VK_DRIVER_FILES"] = str(lavapipe_icd)
        return env


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise VgfToolMissing(f"VGF target: Python package {package!r} not found; "
                             f"pip install {PIP_PACKAGES[package]}=={SDK_VERSION}")
    return Path(next(iter(spec.submodule_search_locations)))


def _existing(path: Path, package: str) -> Path:
    if not path.exists():
        raise VgfToolMissing(f"VGF target: {path} missing from an incomplete install; "
                             f"pip install --force-reinstall {PIP_PACKAGES[package]}=={SDK_VERSION}")
    return path


def model_converter() -> Path:
    """The model-converter binary (all that conversion needs)."""
    return _existing(_package_dir("model_converter") / "binaries" / "bin" / "model-converter", "model_converter")


@lru_cache(maxsize=1)
def vgf_tools() -> VgfTools:
    """All four tools, or VgfToolMissing naming the first missing package (checked in pipeline order)."""
    layers = _package_dir("emulation_layer") / "deploy"
    manifest_dir = layers / "share" / "vulkan" / "explicit_layer.d"
    return VgfTools(
        model_converter=model_converter(),
        vgf_dump=_existing(_package_dir("vgf_lib") / "binaries" / "bin" / "vgf_dump", "vgf_lib"),
        scenario_runner=_existing(_package_dir("scenario_runner") / "binaries" / "bin" / "scenario-runner",
                                  "scenario_runner"),
        layer_lib_dir=_existing(layers / "lib", "emulation_layer"),
        layer_manifests=tuple(_existing(manifest_dir / m, "emulation_layer") for m in LAYER_MANIFESTS),
    )


def lavapipe_icd() -> Path:
    """lavapipe's ICD manifest, after checking the Vulkan loader is installed.

    Both come from apt (Debian/Ubuntu names); without them scenario_runner
    would fail later with a loader message that does not say what to install.
    """
    if ctypes.util.find_library("vulkan") is None:
        raise VgfToolMissing(f"VGF target: the Vulkan loader (libvulkan.so.1) is not installed; "
                             f"apt-get install -y {APT_PACKAGES}")
    for directory in ICD_DIRS:
        found = sorted(Path(directory).glob("lvp_icd*.json"))
        if found:
            return found[0]
    raise VgfToolMissing(f"VGF target: lavapipe (the CPU Vulkan driver) is not installed; "
                         f"apt-get install -y {APT_PACKAGES}")


__all__ = ["APT_PACKAGES", "LAYERS", "PIP_PACKAGES", "SDK_VERSION", "VgfTools", "lavapipe_icd",
           "model_converter", "vgf_tools"]
